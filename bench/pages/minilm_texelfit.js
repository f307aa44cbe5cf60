// texelfit side of the MiniLM benchmark (bench/minilm.py). part 'head': the bundle built with
// --trainable 'head.*' (embeddings through `features`, head training on the cached encoder output);
// part 'last': the bundle with the last encoder layer and the head trainable (the fine-tune step).
// The inputs are the object keyed by input name that multi-input bundles take.
import { loadF32, loadI32 } from './common.js';
import { compare, timed, rowsOf, failedChecks, headRow, fitStepRow } from './effnet_common.js';

async function run(a) {
  const [ids, mask, y] = [await loadI32(a.ids), await loadI32(a.mask), await loadI32(a.y)];
  const t = a.tokens;
  const n = ids.length / t;
  const inputs = (k) => ({ input_ids: ids.subarray(0, k * t), attention_mask: mask.subarray(0, k * t) });
  const mod = await import(a.bundle);
  const t0 = performance.now();
  const m = await mod.createModel(a.backend ? { backend: a.backend } : undefined);
  const env = { createMs: performance.now() - t0, backend: m.info.backend, precision: m.info.precision,
                maxBatch: m.info.maxBatch, trainable: m.info.trainable.length, trunk: m.info.trunk };
  const checks = {};
  const t1 = performance.now();
  checks.logits_1 = compare(await m.predict(inputs(1), 1), await loadF32(a.refLogits), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  if (a.part === 'head') { // (the 'last' bundle has no frozen trunk: its trainable layer reads the mask input)
    checks.embeddings = compare(await m.features(inputs(n), n), await loadF32(a.refEmbeddings), a.checkTol);
  }
  const bad = failedChecks(checks);
  if (bad) { m.dispose(); return { env, checks, error: bad }; }
  let rows;
  if (a.part === 'head') {
    rows = await rowsOf([
      ['embed_1', () => timed(a.warmup, a.repeats, () => m.features(inputs(1), 1), a.slow)],
      ['embed_16', () => timed(a.warmup, a.repeats, () => m.features(inputs(n), n), a.slow)],
      ['head_step', () => headRow(m, inputs(n), y.subarray(0, n), n, a)],
    ]);
  } else {
    const xb = inputs(a.batch);
    const yb = y.subarray(0, a.batch);
    // BERT's nn.Dropout modules export in training mode; off here, as in the TF.js page (the same work)
    const opts = { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer, dropout: false };
    rows = await rowsOf([['finetune_step', () => fitStepRow(m, xb, yb, opts, a)]]);
  }
  m.dispose();
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
