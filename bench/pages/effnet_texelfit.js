// texelfit side of the EfficientNet-Lite0 benchmark. part 'head': the bundle built with
// --trainable '_fc.*' (predict, features, head training on the cached trunk); part 'full': the
// bundle built with every weight trainable (the fine-tune step).
import { loadF32, loadI32, profileGl } from './common.js';
import { PER_IMAGE, compare, timed, rowsOf, failedChecks, headRow, fitStepRow } from './effnet_common.js';

async function run(a) {
  const [x, y] = [await loadF32(a.x), await loadI32(a.y)];
  const mod = await import(a.bundle);
  const t0 = performance.now();
  const m = await mod.createModel(a.backend ? { backend: a.backend } : undefined);
  const env = { createMs: performance.now() - t0, backend: m.info.backend, precision: m.info.precision,
                maxBatch: m.info.maxBatch, trainable: m.info.trainable.length, trunk: m.info.trunk };
  const one = x.subarray(0, PER_IMAGE);
  const checks = {};
  const t1 = performance.now();
  checks.logits = compare(await m.predict(one, 1), await loadF32(a.refLogits), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  if (a.part === 'head') {
    checks.features = compare(await m.features(x.subarray(0, 8 * PER_IMAGE), 8), await loadF32(a.refFeatures), a.checkTol);
  }
  const bad = failedChecks(checks);
  if (bad) { m.dispose(); return { env, checks, error: bad }; }
  let rows;
  if (a.part === 'head') {
    rows = await rowsOf([
      ['predict_b1', () => timed(a.warmup, a.repeats, () => m.predict(one, 1), a.slow)],
      ['features_32', () => timed(a.warmup, a.repeats, () => m.features(x, a.images), a.slow)],
      ['head_step_b8', () => headRow(m, x, y, a.images, a)],
    ], a.rows);
    if (a.profileHead && rows.head_step_b8?.ms) try {
      // diagnostic, after the timed rows: where a head step's time goes. A 3-epoch fit on the first 8
      // images with every draw synced and timed (common.js: profileGl); the trunk's kernels (the
      // cache) and the head's are told apart by name; `steps` head steps.
      const p = await profileGl(() => m.fit(x.subarray(0, a.batch * PER_IMAGE), y.subarray(0, a.batch),
                                            { batchSize: a.batch, epochs: 3, shuffle: false, optimizer: a.optimizer }), 1);
      rows.head_step_b8.profile = { steps: 3, syncMs: p.syncMs, ms: p.ms,
        byKernel: Object.entries(p.byKernel).sort((u, v) => v[1].ms - u[1].ms).slice(0, 25) };
    } catch (e) {
      rows.head_step_b8.profile = { error: String(e) };
    }
  } else {
    const xb = x.subarray(0, a.batch * PER_IMAGE);
    const yb = y.subarray(0, a.batch);
    const opts = { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer };
    rows = await rowsOf([['finetune_step_b8', () => fitStepRow(m, xb, yb, opts, a)]], a.rows);
  }
  m.dispose();
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
