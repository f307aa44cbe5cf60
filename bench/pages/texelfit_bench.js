// texelfit side of the benchmark. run.py calls window.bench.train / window.bench.predict in a
// fresh page: each call measures the cold start (createModel + first step), then the steady state.
import { loadF32, loadI32, longestTaskIn, longTasksSupported, countGlCalls, profileGl, median } from './common.js';

// Steady-state profiles issue each draw this many times between their two syncs (common.js).
const PROFILE_REPEAT = 8;

async function open(bundle, backend) {
  const t0 = performance.now();
  const mod = await import(bundle);
  const t1 = performance.now();
  const m = await mod.createModel(backend ? { backend } : {}); // (bench/webgpu.py names it)
  const t2 = performance.now();
  const inSize = mod.modelInfo.inputShape.reduce((a, b) => a * b, 1);
  return { mod, m, inSize, importMs: t1 - t0, createMs: t2 - t1, createSpan: [t1, t2] };
}

// Batches: 0 is the cold step, 1..warmup the warm-up, warmup+1 .. warmup+steps the timed window
// (the same batches in every window).
async function train({ bundle, x: xUrl, y: yUrl, batch, optimizer, warmup, steps, windows, profileFirst, backend }) {
  const [x, y] = [await loadF32(xUrl), await loadI32(yUrl)];
  const o = await open(bundle, backend);
  const { m, inSize } = o;
  const part = (first, n) => [x.subarray(first * batch * inSize, (first + n) * batch * inSize),
                              y.subarray(first * batch, (first + n) * batch)];
  const opts = { batchSize: batch, epochs: 1, shuffle: false, optimizer };
  if (profileFirst) { // diagnostic page: where the first step's time goes (not a timing run)
    const profile = await profileGl(() => m.fit(...part(0, 1), opts));
    m.dispose();
    return { createMs: o.createMs, profile: { steps: 1, ...profile } };
  }
  const t2 = performance.now();
  const first = await m.fit(...part(0, 1), opts);
  const t3 = performance.now();
  const tw = performance.now();
  const warm = await m.fit(...part(1, warmup), opts);
  const warmupMs = performance.now() - tw;
  const [xs, ys] = part(1 + warmup, steps);
  const out = [];
  for (let w = 0; w < windows; w++) {
    const a = performance.now();
    const r = await m.fit(xs, ys, opts); // resolves after every step's loss is read back
    const b = performance.now();
    const lt = await longestTaskIn(a, b);
    out.push({ ms: b - a, perStep: (b - a) / steps, lastLoss: r.loss[r.loss.length - 1], firstLoss: r.loss[0],
               longestTask: lt.longest, longTasks: lt.count });
  }
  if (backend) return timed(o, m, { firstLoss: first.loss[0], firstStepMs: t3 - t2, windows: out });
  // Diagnostic, untimed: the WebGL calls of 10 steps.
  const diagSteps = Math.min(10, warmup);
  const diag = await countGlCalls(() => m.fit(...part(1, diagSteps), opts));
  const profile = await profileGl(() => m.fit(...part(1, diagSteps), opts), PROFILE_REPEAT);
  const createLT = await longestTaskIn(...o.createSpan);
  const firstLT = await longestTaskIn(t2, t3);
  m.dispose();
  return {
    importMs: o.importMs, createMs: o.createMs, firstStepMs: t3 - t2, coldMs: o.createMs + (t3 - t2),
    firstLoss: first.loss[0], warmupMs, warmupLastLoss: warm.loss[warm.loss.length - 1],
    windows: out, perStep: median(out.map((w) => w.perStep)),
    longestTaskFit: Math.max(...out.map((w) => w.longestTask)), longestTaskFirstFit: firstLT.longest,
    longestTaskCreate: createLT.longest, longTasksSupported,
    diag: { steps: diagSteps, ms: diag.ms, counts: diag.counts }, info: m.info,
    profile: { steps: diagSteps, ...profile },
  };
}

// Latency of predict at batch 1: each call uploads one sample, runs the forward pass and reads back.
async function predict({ bundle, x: xUrl, warmup, steps, windows, backend }) {
  const x = await loadF32(xUrl);
  const o = await open(bundle, backend);
  const { m, inSize } = o;
  const n = x.length / inSize;
  const sample = (i) => x.subarray((i % n) * inSize, (i % n + 1) * inSize);
  const t2 = performance.now();
  const firstOut = Array.from(await m.predict(sample(0), 1));
  const t3 = performance.now();
  for (let i = 1; i <= warmup; i++) await m.predict(sample(i), 1);
  const out = [];
  let last = null;
  for (let w = 0; w < windows; w++) {
    const a = performance.now();
    for (let i = 0; i < steps; i++) last = await m.predict(sample(1 + warmup + i), 1);
    const b = performance.now();
    const lt = await longestTaskIn(a, b);
    out.push({ ms: b - a, perStep: (b - a) / steps, longestTask: lt.longest, longTasks: lt.count });
  }
  if (backend) return timed(o, m, { firstOut, firstStepMs: t3 - t2, windows: out });
  const diag = await countGlCalls(async () => { for (let i = 0; i < 10; i++) await m.predict(sample(i), 1); });
  const profile = await profileGl(async () => { for (let i = 0; i < 10; i++) await m.predict(sample(i), 1); },
                                  PROFILE_REPEAT);
  const timers = await timerDelays();
  const info = m.info;
  m.dispose();
  return {
    importMs: o.importMs, createMs: o.createMs, firstStepMs: t3 - t2, coldMs: o.createMs + (t3 - t2),
    firstOut, lastOut: Array.from(last), windows: out, perStep: median(out.map((w) => w.perStep)),
    diag: { steps: 10, ms: diag.ms, counts: diag.counts }, longTasksSupported,
    profile: { steps: 10, ...profile }, timers, info,
  };
}

// The timings alone (a backend named: bench/webgpu.py, whose rows are backends side by side; no WebGL diagnostics).
function timed(o, m, r) {
  const info = m.info;
  m.dispose();
  return { ...r, importMs: o.importMs, createMs: o.createMs, coldMs: o.createMs + r.firstStepMs,
           perStep: median(r.windows.map((w) => w.perStep)), info };
}

// How long the page's own wake-ups take here: a chain of 50 setTimeout(0) (Chromium clamps nested
// timers to 4 ms after a few levels) and of 50 MessageChannel messages, ms each.
async function timerDelays() {
  const chain = async (once) => {
    const t0 = performance.now();
    for (let i = 0; i < 50; i++) await once();
    return (performance.now() - t0) / 50;
  };
  const timeout = () => new Promise((r) => setTimeout(r, 0));
  const message = () => new Promise((r) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = () => { ch.port1.close(); r(); };
    ch.port2.postMessage(0);
  });
  return { setTimeout0Ms: await chain(timeout), messageChannelMs: await chain(message) };
}

window.bench = { train, predict };
window.benchReady = true;
