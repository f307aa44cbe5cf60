// Shared by the benchmark pages: data loading, long-task capture, GL call counting.

export async function loadF32(url) {
  return new Float32Array(await (await fetch(url)).arrayBuffer());
}

export async function loadI32(url) {
  return new Int32Array(await (await fetch(url)).arrayBuffer());
}

// Every main-thread long task (> 50 ms) the page has seen, as {start, duration} in ms.
const longTasks = [];
let observer = null;
try {
  observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) longTasks.push({ start: e.startTime, duration: e.duration });
  });
  observer.observe({ type: 'longtask', buffered: true });
} catch (e) {
  observer = null;
}
export const longTasksSupported = observer !== null &&
  (PerformanceObserver.supportedEntryTypes ?? []).includes('longtask');

// Long-task entries arrive after the task ended; give them time to be queued, then collect.
export async function longestTaskIn(t0, t1) {
  await new Promise((r) => setTimeout(r, 60));
  if (observer) for (const e of observer.takeRecords()) longTasks.push({ start: e.startTime, duration: e.duration });
  let longest = 0;
  let count = 0;
  for (const t of longTasks) {
    if (t.start + t.duration > t0 && t.start < t1) {
      longest = Math.max(longest, t.duration);
      count++;
    }
  }
  return { longest, count };
}

// Counts WebGL2 calls made while `fn` runs (diagnostic runs only, never inside a timed window).
export async function countGlCalls(fn) {
  const P = WebGL2RenderingContext.prototype;
  const names = ['drawArrays', 'texSubImage2D', 'readPixels', 'clientWaitSync', 'fenceSync', 'useProgram',
                 'bindFramebuffer', 'bindTexture', 'uniform1f', 'uniform1i', 'viewport', 'getBufferSubData', 'flush'];
  const counts = Object.fromEntries(names.map((n) => [n, 0]));
  const saved = {};
  for (const n of names) {
    saved[n] = P[n];
    P[n] = function (...a) { counts[n]++; return saved[n].apply(this, a); };
  }
  const t0 = performance.now();
  try {
    await fn();
  } finally {
    for (const n of names) P[n] = saved[n];
  }
  return { counts, ms: performance.now() - t0 };
}

export function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

// Per-kernel GPU time (diagnostic runs only, never inside a timed window). gl.finish() does not
// wait in Chromium, so each drawArrays is bracketed by synchronous 1-texel readPixels of the
// framebuffer it draws into: one before (drains the queue, untimed; its time is the idle round
// trip, reported as `syncMs`), one after (waits for this draw). A draw's time is its GPU work plus
// one such round trip. Uploads and readbacks are timed as issued (no sync). Programs are named by
// the "texelfit kernel: NAME" comment of their fragment shader. With `repeat` > 1 each draw is issued
// that many times between the two readPixels (the same inputs and outputs, so the same result) and
// its time is divided by `repeat`: the round trip then weighs 1/repeat as much. `live`: an object given
// the per-kernel record as it fills (live.byKernel), for a caller that reads it mid-run.
export async function profileGl(fn, repeat = 1, live = null) {
  const P = WebGL2RenderingContext.prototype;
  const saved = { drawArrays: P.drawArrays, texSubImage2D: P.texSubImage2D, readPixels: P.readPixels,
                  useProgram: P.useProgram };
  const names = new WeakMap();
  const byKernel = {};
  if (live) live.byKernel = byKernel;
  const px = new Float32Array(4);
  let current = '?';
  let syncs = 0;
  let syncTotal = 0;
  const nameOf = (gl, program) => {
    if (!program) return '?';
    if (!names.has(program)) {
      let name = 'program';
      for (const s of gl.getAttachedShaders(program) ?? []) {
        const m = /texelfit kernel: (.*?) \(generated/.exec(gl.getShaderSource(s) ?? '');
        if (m) name = m[1];
      }
      names.set(program, name);
    }
    return names.get(program);
  };
  const sync = (gl) => {
    const pbo = gl.getParameter(gl.PIXEL_PACK_BUFFER_BINDING);
    if (pbo) gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    saved.readPixels.call(gl, 0, 0, 1, 1, gl.RGBA, gl.FLOAT, px);
    if (pbo) gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
  };
  const add = (label, dt) => {
    const e = (byKernel[label] ??= { calls: 0, ms: 0 });
    e.calls++;
    e.ms += dt;
  };
  P.useProgram = function (p) { current = nameOf(this, p); return saved.useProgram.call(this, p); };
  P.drawArrays = function (...a) {
    const s0 = performance.now();
    sync(this);
    const t0 = performance.now();
    syncs++;
    syncTotal += t0 - s0;
    let r;
    for (let k = 0; k < repeat; k++) r = saved.drawArrays.apply(this, a);
    sync(this);
    add(current, (performance.now() - t0) / repeat);
    return r;
  };
  const issued = (label, f) => function (...a) {
    const t0 = performance.now();
    const r = f.apply(this, a);
    add(label, performance.now() - t0);
    return r;
  };
  P.texSubImage2D = issued('(texSubImage2D, issue)', saved.texSubImage2D);
  P.readPixels = issued('(readPixels, issue)', saved.readPixels);
  const t0 = performance.now();
  try {
    await fn();
  } finally {
    Object.assign(P, saved);
  }
  return { byKernel, ms: performance.now() - t0, syncMs: syncs ? syncTotal / syncs : null, repeat };
}

// TF.js on the backend asked for, or an error; returns what the result files record of it. TF.js
// refuses a software WebGL context (failIfMajorPerformanceCaveat) unless told otherwise; the machines
// this runs on render WebGL with SwiftShader.
export async function tfjsInit(tf, backend, wasmPath) {
  tf.env().set('SOFTWARE_WEBGL_ENABLED', true);
  if (backend === 'wasm') tf.wasm.setWasmPaths(wasmPath);
  const ok = await tf.setBackend(backend);
  await tf.ready();
  if (!ok || tf.getBackend() !== backend) throw new Error(`TF.js backend ${backend} unavailable (got ${tf.getBackend()})`);
  const env = { backend: tf.getBackend(), version: tf.version.tfjs };
  if (backend === 'webgl') {
    env.webglVersion = tf.env().getNumber('WEBGL_VERSION');
    const gl = tf.backend().gpgpu.gl;
    const dbg = gl.getExtension('WEBGL_debug_renderer_info');
    env.renderer = dbg ? gl.getParameter(dbg.UNMASKED_RENDERER_WEBGL) : gl.getParameter(gl.RENDERER);
  } else if (backend === 'wasm') {
    env.simd = await tf.env().getAsync('WASM_HAS_SIMD_SUPPORT');
    env.multithread = await tf.env().getAsync('WASM_HAS_MULTITHREAD_SUPPORT');
    env.crossOriginIsolated = self.crossOriginIsolated;
  }
  return env;
}
