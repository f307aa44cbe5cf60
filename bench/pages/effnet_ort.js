// onnxruntime-web side of the EfficientNet-Lite0 benchmark: inference on the ONNX file texelfit
// builds from (bench/efficientnet.py: the full model, and the trunk up to the pooled features for
// the features row), WASM with the threads it gets, or WebGPU where the browser gives an adapter.
import * as ort from '../ort/ort.all.min.mjs';
import { loadF32 } from './common.js';
import { PER_IMAGE, compare, timed, rowsOf, failedChecks, ortEnv } from './effnet_common.js';

async function run(a) {
  const { env, error } = await ortEnv(ort, a);
  if (error) return { env, error };
  const [x] = [await loadF32(a.x)];
  const opts = { executionProviders: [a.ep], graphOptimizationLevel: 'all' };
  const t0 = performance.now();
  const full = await ort.InferenceSession.create(a.model, opts);
  const trunk = await ort.InferenceSession.create(a.trunk, opts);
  env.createMs = performance.now() - t0;
  env.numThreads = ort.env.wasm.numThreads;
  const infer = async (s, xs, n) => {
    const out = await s.run({ input: new ort.Tensor('float32', xs, [n, 3, 224, 224]) });
    const t = out[s.outputNames[0]];
    const v = t.data instanceof Float32Array ? t.data : await t.getData();
    t.dispose?.();
    return v;
  };
  const one = x.subarray(0, PER_IMAGE);
  const checks = {};
  const t1 = performance.now();
  checks.logits = compare(await infer(full, one, 1), await loadF32(a.refLogits), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  checks.features = compare(await infer(trunk, x.subarray(0, 8 * PER_IMAGE), 8), await loadF32(a.refFeatures), a.checkTol);
  const bad = failedChecks(checks);
  if (bad) return { env, checks, error: bad };
  const rows = await rowsOf([
    ['predict_b1', () => timed(a.warmup, a.repeats, () => infer(full, one, 1), a.slow)],
    ['features_32', () => timed(a.warmup, a.repeats, () => infer(trunk, x, a.images), a.slow)],
  ].filter(([name]) => !a.skip.includes(name)), a.rows);
  for (const name of a.skip) if (!a.rows || a.rows.includes(name)) rows[name] = { error: a.skipWhy };
  await full.release();
  await trunk.release();
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
