// ---- a model's lifecycle: the call queue, hidden tabs, lost contexts, pause/resume, dispose ----------
// Functions of a model's state `s` (model.js: modelState).

// Wake a fit waiting in waitRunnable (a resume, a shown tab, a restored context, a call between steps).
function notify(s) {
  const wake = s.wake;
  s.wake = null;
  if (wake) wake();
}

function listenTo(s, target, type, fn) {
  target.addEventListener(type, fn);
  s.listeners.push(() => target.removeEventListener(type, fn));
}

function listen(s) {
  if (typeof document !== 'undefined') {
    const visibility = () => {
      s.hidden = document.visibilityState === 'hidden';
      notify(s);
    };
    listenTo(s, document, 'visibilitychange', visibility);
    s.hidden = document.visibilityState === 'hidden';
  }
  const lost = (e) => {
    e.preventDefault(); // without it the context is never restored
    s.lost = true;
    s.state = 'lost';
    notify(s);
  };
  const restored = () => { restoreContext(s); };
  if (s.gpu.backend === 'webgpu') watchDevice(s); // (webgpu.js: a lost device is replaced)
  if (!s.canvas) return; // the CPU and WebGPU backends have no context to lose
  // HTMLCanvasElement and OffscreenCanvas name the events differently
  for (const type of ['webglcontextlost', 'contextlost']) listenTo(s, s.canvas, type, lost);
  for (const type of ['webglcontextrestored', 'contextrestored']) listenTo(s, s.canvas, type, restored);
}

// Rebuild programs and textures, and load the latest snapshot into them.
async function restoreContext(s) {
  const gl = s.gl;
  try {
    s.caps = probe(gl, s.options); // extensions are enabled anew on a restored context
    deviceRestored(s, await GpuDevice.create(gl, s.caps));
  } catch (e) {
    if (gl.isContextLost()) return; // lost again while rebuilding: wait for the next restore
    throw e;
  }
}

// A new device in place of a lost one (a restored WebGL context's, or webgpu.js's new GPUDevice): the latest
// snapshot loaded into it (createModel made the first one), and a waiting fit woken to replay from there.
function deviceRestored(s, gpu) {
  s.gpu = gpu;
  loadSnapshot(s, s.snapshot);
  s.lost = false;
  s.generation++;
  if (s.state === 'lost') s.state = 'idle';
  notify(s);
}

function isLost(s) {
  return s.lost || s.gpu.lost();
}

function runnable(s) {
  return !s.userPaused && !s.hidden && !isLost(s);
}

// Wait until training may run: not paused, not hidden, the context there. Rejects when a lost
// context is not restored in time.
async function waitRunnable(s) {
  const timeout = s.options.contextRestoreTimeout ?? 10000;
  let lostSince = null; // (a wake-up for a call between steps does not restart the clock)
  for (;;) {
    checkDisposed(s);
    await runBetween(s);
    if (runnable(s)) return;
    const lost = isLost(s);
    s.state = lost ? 'lost' : 'paused';
    const wait = new Promise((resolve) => { s.wake = resolve; });
    if (!lost) {
      lostSince = null;
      await wait;
      continue;
    }
    lostSince = lostSince ?? performance.now();
    let timer;
    const expired = await Promise.race([
      wait.then(() => false),
      new Promise((resolve) => { timer = setTimeout(() => resolve(true), Math.max(0, lostSince + timeout - performance.now())); }),
    ]);
    clearTimeout(timer);
    checkDisposed(s);
    if (expired && isLost(s)) {
      const at = s.snapshot ? ` (the last snapshot, step ${s.snapshot.optStep} of the optimizer, is what getWeights() returns)` : '';
      throw new TexelfitError('context-lost', `the WebGL context was lost and not restored within ${timeout} ms${at}`);
    }
  }
}

function requireContext(s, what) {
  if (isLost(s)) throw new TexelfitError('context-lost', `cannot ${what} while the WebGL context is lost`);
}

function checkDisposed(s) {
  if (s.disposed) throw new TexelfitError('disposed', 'this model has been disposed');
}

// Calls run one at a time, in the order they were made. `check` runs at once, before the call
// waits for the ones before it: bad arguments reject right away.
function serial(s, fn, check) {
  try {
    checkDisposed(s);
    if (check) check();
  } catch (e) {
    return Promise.reject(e);
  }
  const run = s.queue.then(async () => {
    checkDisposed(s);
    s.busy = true;
    try {
      return await fn();
    } finally {
      s.busy = false;
      if (s.disposed) releaseModel(s);
    }
  });
  s.queue = run.catch(() => {});
  return run;
}

// A call that only reads: while a fit runs or is paused it runs in the next gap between two of
// its steps (on the weights of that moment), otherwise as serial.
function soon(s, fn, check) {
  if (!s.fitting) return serial(s, fn, check);
  try {
    checkDisposed(s);
    if (check) check();
  } catch (e) {
    return Promise.reject(e);
  }
  return new Promise((resolve, reject) => {
    s.between.push({ fn, resolve, reject });
    notify(s); // a paused fit runs it at once
  });
}

// Run the calls waiting for a gap (the fit's loop calls this between steps and while it waits).
async function runBetween(s) {
  while (s.between.length) {
    const { fn, resolve, reject } = s.between.shift();
    try {
      resolve(await fn());
    } catch (e) {
      reject(e);
    }
  }
}

// Model.dispose: stops a running fit and every call not yet run; frees the GL objects (releaseModel).
function disposeModel(s) {
  if (s.disposed) return;
  s.disposed = true;
  for (const off of s.listeners) off();
  s.listeners = [];
  const between = s.between.splice(0);
  for (const { reject } of between) reject(new TexelfitError('disposed', 'this model has been disposed'));
  notify(s); // a paused fit wakes up to stop
  if (!s.busy) releaseModel(s); // else when the running call is over (serial)
}

function releaseModel(s) {
  if (s.released) return;
  s.released = true;
  s.gpu.dispose();
  if (s.ownsContext && !s.gl.isContextLost()) {
    const ext = s.gl.getExtension('WEBGL_lose_context');
    if (ext) ext.loseContext();
  }
}
