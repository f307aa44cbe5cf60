// TensorFlow.js side of the benchmark (tf.min.js and tf-backend-wasm.min.js are loaded as classic
// scripts by tfjs.html). Same architecture, initial weights and batches as the texelfit bundle.
import { loadF32, loadI32, longestTaskIn, median, tfjsInit } from './common.js';

const tf = window.tf;


// layers: [{type: 'dense', units, relu}, {type: 'conv', filters, kernel, relu}, {type: 'maxpool', size}, {type: 'flatten'}]
async function build(layers, inputShape, weightsUrl, shapes) {
  const model = tf.sequential();
  layers.forEach((l, i) => {
    const first = i === 0 ? { inputShape } : {};
    const activation = l.relu ? 'relu' : 'linear';
    if (l.type === 'dense') model.add(tf.layers.dense({ units: l.units, activation, ...first }));
    else if (l.type === 'conv') {
      model.add(tf.layers.conv2d({ filters: l.filters, kernelSize: l.kernel, padding: 'valid', activation,
                                   dataFormat: 'channelsLast', ...first }));
    } else if (l.type === 'maxpool') model.add(tf.layers.maxPooling2d({ poolSize: l.size, strides: l.size, ...first }));
    else if (l.type === 'flatten') model.add(tf.layers.flatten(first));
  });
  const flat = await loadF32(weightsUrl);
  let off = 0;
  const ws = shapes.map((s) => {
    const n = s.reduce((a, b) => a * b, 1);
    const t = tf.tensor(flat.subarray(off, off + n), s);
    off += n;
    return t;
  });
  model.setWeights(ws);
  ws.forEach((t) => t.dispose());
  return model;
}

function makeOptimizer(o) {
  if (o.type === 'sgd') return tf.train.sgd(o.lr);
  return tf.train.adam(o.lr, o.betas?.[0] ?? 0.9, o.betas?.[1] ?? 0.999, o.eps ?? 1e-8);
}

async function train({ backend, wasmPath, layers, inputShape, weights, shapes, x: xUrl, y: yUrl, batch, classes,
                       optimizer, warmup, steps, windows }) {
  const [x, y] = [await loadF32(xUrl), await loadI32(yUrl)];
  const inSize = inputShape.reduce((a, b) => a * b, 1);
  const t0 = performance.now();
  const env = await tfjsInit(tf, backend, wasmPath);
  const t1 = performance.now();
  const model = await build(layers, inputShape, weights, shapes);
  const opt = makeOptimizer(optimizer);
  const t2 = performance.now();
  // One training step on batch i; returns the loss tensor when asked (the only readback).
  const step = (i, wantCost) => tf.tidy(() => {
    const xb = tf.tensor(x.subarray(i * batch * inSize, (i + 1) * batch * inSize), [batch, ...inputShape]);
    const yb = tf.oneHot(tf.tensor1d(y.subarray(i * batch, (i + 1) * batch), 'int32'), classes);
    return opt.minimize(() => tf.losses.softmaxCrossEntropy(yb, model.apply(xb, { training: true })), wantCost);
  });
  const read = async (t) => { const v = (await t.data())[0]; t.dispose(); return v; };
  let firstLoss;
  try {
    firstLoss = await read(step(0, true));
  } catch (e) {
    return { error: String(e.message ?? e), env, initMs: t1 - t0, buildMs: t2 - t1 };
  }
  const t3 = performance.now();
  const tw = performance.now();
  for (let i = 1; i < warmup; i++) step(i, false);
  const warmupLastLoss = await read(step(warmup, true));
  const warmupMs = performance.now() - tw;
  const tensorsBefore = tf.memory().numTensors;
  const out = [];
  for (let w = 0; w < windows; w++) {
    const a = performance.now();
    for (let i = 0; i < steps - 1; i++) step(1 + warmup + i, false);
    const lastLoss = await read(step(warmup + steps, true)); // one readback ends the window
    const b = performance.now();
    const lt = await longestTaskIn(a, b);
    out.push({ ms: b - a, perStep: (b - a) / steps, lastLoss, longestTask: lt.longest, longTasks: lt.count });
  }
  const leaked = tf.memory().numTensors - tensorsBefore;
  model.dispose();
  return {
    env, initMs: t1 - t0, buildMs: t2 - t1, firstStepMs: t3 - t2, coldMs: t3 - t0, firstLoss, warmupMs,
    warmupLastLoss, windows: out, perStep: median(out.map((w) => w.perStep)), leakedTensors: leaked,
  };
}

// Latency of predict at batch 1, each call read back. Both readbacks are timed, in alternating
// windows: 'sync' (dataSync) and 'async' (await data()); perStep is the faster one's median.
// The cold first predict uses await data().
async function predict({ backend, wasmPath, layers, inputShape, weights, shapes, x: xUrl, warmup, steps, windows }) {
  const x = await loadF32(xUrl);
  const inSize = inputShape.reduce((a, b) => a * b, 1);
  const t0 = performance.now();
  const env = await tfjsInit(tf, backend, wasmPath);
  const t1 = performance.now();
  const model = await build(layers, inputShape, weights, shapes);
  const t2 = performance.now();
  const run = async (i, mode) => {
    const y = tf.tidy(() => model.predict(tf.tensor(x.subarray(i * inSize, (i + 1) * inSize), [1, ...inputShape])));
    const v = mode === 'sync' ? y.dataSync() : await y.data();
    y.dispose();
    return v;
  };
  const firstOut = Array.from(await run(0, 'async'));
  const t3 = performance.now();
  for (let i = 1; i <= warmup; i++) await run(i, i % 2 ? 'sync' : 'async');
  const byMode = { sync: [], async: [] };
  let last = null;
  for (let w = 0; w < windows; w++) {
    for (const mode of ['sync', 'async']) {
      const a = performance.now();
      for (let i = 0; i < steps; i++) last = await run(1 + warmup + i, mode);
      const b = performance.now();
      const lt = await longestTaskIn(a, b);
      byMode[mode].push({ ms: b - a, perStep: (b - a) / steps, longestTask: lt.longest, longTasks: lt.count });
    }
  }
  model.dispose();
  const med = { sync: median(byMode.sync.map((w) => w.perStep)), async: median(byMode.async.map((w) => w.perStep)) };
  const readback = med.sync <= med.async ? 'sync' : 'async';
  return {
    env, readback, perStepByReadback: med, initMs: t1 - t0, buildMs: t2 - t1, firstStepMs: t3 - t2, coldMs: t3 - t0,
    firstOut, lastOut: Array.from(last), windows: byMode[readback], windowsByReadback: byMode, perStep: med[readback],
  };
}

window.bench = { train, predict };
window.benchReady = true;
