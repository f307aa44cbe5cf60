// Shared by the EfficientNet-Lite0 pages (bench/efficientnet.py): the output check against
// PyTorch and the timing of repeated calls.
import { median } from './common.js';

export const PER_IMAGE = 3 * 224 * 224;

// relative L2 and max abs difference of `got` against `ref`; ok when relL2 <= tol
export function compare(got, ref, tol) {
  if (got.length !== ref.length) return { ok: false, error: `length ${got.length}, expected ${ref.length}` };
  let d2 = 0;
  let r2 = 0;
  let maxAbs = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = got[i] - ref[i];
    d2 += d * d;
    r2 += ref[i] * ref[i];
    maxAbs = Math.max(maxAbs, Math.abs(d));
  }
  const relL2 = Math.sqrt(d2 / r2);
  return { ok: relL2 <= tol, relL2, maxAbs, tol };
}

// `warmup` untimed calls, then `repeats` timed ones (each awaited: every call ends with a readback);
// the row's number is the median. A row whose first call took over `slow.ms` gets `slow.repeats`
// timed calls instead (TF.js WebGL's fine-tune step takes minutes on SwiftShader).
export async function timed(warmup, repeats, fn, slow = null) {
  const first = performance.now();
  await fn();
  const firstMs = performance.now() - first;
  if (slow && firstMs > slow.ms) repeats = Math.min(repeats, slow.repeats);
  for (let i = 1; i < warmup; i++) await fn();
  const samples = [];
  const cpu = [];
  for (let i = 0; i < repeats; i++) {
    const c0 = await cpuMs();
    const t0 = performance.now();
    await fn();
    samples.push(performance.now() - t0);
    const c1 = await cpuMs();
    if (c0 !== null) cpu.push(c1 - c0);
  }
  return { ms: median(samples), samples, cpuMs: cpu.length ? median(cpu) : null, cpuSamples: cpu, detail: { firstMs } };
}

// CPU time (ms) the browser's processes (Chromium, SwiftShader's threads in its GPU process) have
// used so far, from /proc through efficientnet.py (exposed as window.benchCpuTicks); null without
// it. Other processes' load barely changes it, where it stretches wall-clock times.
export async function cpuMs() {
  if (!window.benchCpuTicks) return null;
  return await window.benchCpuTicks();
}

// Runs each row in turn (only those named in `only`, where given: the bench's --rows); a row that throws
// records its error, and the rest still run.
export async function rowsOf(list, only = null) {
  const rows = {};
  for (const [name, fn] of list) {
    if (only && !only.includes(name)) continue;
    try {
      rows[name] = await fn();
    } catch (e) {
      rows[name] = { error: `${e?.name ?? 'Error'}: ${e?.message ?? e}`.slice(0, 400) };
    }
  }
  return rows;
}

export function failedChecks(checks) {
  const bad = Object.entries(checks).filter(([, c]) => !c.ok);
  return bad.length ? `output differs from PyTorch: ${bad.map(([k, c]) => `${k} relL2 ${c.relL2 ?? c.error}`).join(', ')}` : null;
}

// texelfit's head training: one fit of `a.headEpochs` epochs over `count` examples (x, y) with the trunk
// cached. The fit computes the cache before its first step; onStep's times only say when a step was
// queued, but a call that receives losses knows the GPU has finished the steps up to the last of
// them. ms/step = (end of the fit - first such call after epoch 1) / the steps between the two.
export async function headRow(m, x, y, count, a) {
  const marks = [];
  const perEpoch = Math.ceil(count / a.batch);
  const t0 = performance.now();
  await m.fit(x, y, {
    batchSize: a.batch, epochs: a.headEpochs, shuffle: true, seed: 1, cacheTrunk: true, optimizer: a.optimizer,
    onStep: ({ losses }) => {
      if (!losses.length) return;
      const mark = { t: performance.now(), done: losses[losses.length - 1].step, cpu: null };
      // (the CPU reading arrives a moment later; only the first mark after epoch 1 is used)
      if (mark.done >= perEpoch - 1 && !marks.some((k) => k.cpu)) mark.cpu = cpuMs();
      marks.push(mark);
    },
  });
  const end = performance.now();
  const cpuEnd = await cpuMs();
  const total = perEpoch * a.headEpochs;
  const start = marks.find((k) => k.done >= perEpoch - 1 && k.done < total - 1);
  if (!start) throw new Error(`no loss readback between epoch 1 and the end (${JSON.stringify(marks)})`);
  const steps = total - 1 - start.done;
  const cpuStart = start.cpu ? await start.cpu : null;
  const cpu = cpuStart !== null && cpuEnd !== null ? (cpuEnd - cpuStart) / steps : null;
  return { ms: (end - start.t) / steps, samples: [(end - start.t) / steps], cpuMs: cpu, cpuSamples: cpu === null ? [] : [cpu],
           detail: { fitMs: end - t0, timedSteps: steps, marks: marks.map((k) => [Math.round(k.t - t0), k.done]) } };
}

// TF.js's head-training row: `warm` untimed steps (compiles), then `steps` timed ones of one() (each
// returning its loss tensor), the last loss read back ending them; ms and CPU ms a step.
export async function tfjsSteps(one, warm, steps) {
  (await one().data());
  for (let i = 1; i < warm; i++) one().dispose();
  const c = await cpuMs();
  const t = performance.now();
  let last = null;
  for (let i = 0; i < steps; i++) { if (last) last.dispose(); last = one(); }
  await last.data();
  const ms = (performance.now() - t) / steps;
  const c1 = await cpuMs();
  const cpu = c === null ? null : (c1 - c) / steps;
  last.dispose();
  return { ms, samples: [ms], cpuMs: cpu, cpuSamples: cpu === null ? [] : [cpu], detail: { timedSteps: steps } };
}

// A fine-tune row: timed calls of step(), each one training step that resolves to its loss, the
// losses kept in the detail.
export async function stepRow(step, a) {
  const losses = [];
  const r = await timed(a.warmup, a.repeats, async () => { losses.push(await step()); }, a.slow);
  r.detail.losses = losses;
  return r;
}

// texelfit's fine-tune row: fits of one step on (xb, yb).
export function fitStepRow(m, xb, yb, opts, a) {
  return stepRow(async () => (await m.fit(xb, yb, opts)).loss[0], a);
}

// TF.js's: step() gives the loss tensor of one training step.
export function tfjsStepRow(step, a) {
  return stepRow(async () => {
    const l = step();
    const v = (await l.data())[0];
    l.dispose();
    return v;
  }, a);
}

// onnxruntime-web's environment for the result files, with the WebGPU adapter where a.ep asks for it;
// `error` says why there is none.
export async function ortEnv(ort, a) {
  ort.env.wasm.wasmPaths = a.wasmPath;
  const env = { version: ort.env.versions?.web ?? null, ep: a.ep, crossOriginIsolated: self.crossOriginIsolated,
                hardwareConcurrency: navigator.hardwareConcurrency };
  if (a.ep === 'webgpu') {
    const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
    if (!adapter) return { env, error: navigator.gpu ? 'no WebGPU adapter (requestAdapter() gave null)' : 'no navigator.gpu' };
    const i = adapter.info ?? {};
    env.adapter = { vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description };
  }
  return { env };
}
