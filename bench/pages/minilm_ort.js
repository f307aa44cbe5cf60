// onnxruntime-web side of the MiniLM benchmark (bench/minilm.py): inference on the ONNX file texelfit
// builds from (the encoder with mean pooling and normalisation), WASM, or WebGPU where the browser
// gives an adapter. Its inputs are int64 ids and mask, as the export declares them.
import * as ort from '../ort/ort.all.min.mjs';
import { loadF32, loadI32 } from './common.js';
import { compare, timed, rowsOf, failedChecks, ortEnv } from './effnet_common.js';

async function run(a) {
  const { env, error } = await ortEnv(ort, a);
  if (error) return { env, error };
  const [ids, mask] = [await loadI32(a.ids), await loadI32(a.mask)];
  const t = a.tokens;
  const n = ids.length / t;
  const t0 = performance.now();
  const s = await ort.InferenceSession.create(a.model, { executionProviders: [a.ep], graphOptimizationLevel: 'all' });
  env.createMs = performance.now() - t0;
  env.numThreads = ort.env.wasm.numThreads;
  const int64 = (v, k) => new ort.Tensor('int64', BigInt64Array.from(v, (x) => BigInt(x)), [k, t]);
  const feeds = (k) => ({ [s.inputNames[0]]: int64(ids.subarray(0, k * t), k), [s.inputNames[1]]: int64(mask.subarray(0, k * t), k) });
  const f1 = feeds(1);
  const fn = feeds(n);
  const infer = async (f) => {
    const out = await s.run(f);
    const r = out[s.outputNames[0]];
    const v = r.data instanceof Float32Array ? r.data : await r.getData();
    r.dispose?.();
    return v;
  };
  const ref = await loadF32(a.refEmbeddings);
  const checks = {};
  const t1 = performance.now();
  checks.embedding_1 = compare(await infer(f1), ref.subarray(0, ref.length / n), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  checks.embeddings = compare(await infer(fn), ref, a.checkTol);
  const bad = failedChecks(checks);
  if (bad) return { env, checks, error: bad };
  const rows = await rowsOf([
    ['embed_1', () => timed(a.warmup, a.repeats, () => infer(f1), a.slow)],
    ['embed_16', () => timed(a.warmup, a.repeats, () => infer(fn), a.slow)],
  ]);
  await s.release();
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
