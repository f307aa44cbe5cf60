// texelfit side of the EfficientNet-Lite0 benchmark. part 'head': the bundle built with
// --trainable '_fc.*' (predict, features, head training on the cached trunk); part 'full': the
// bundle built with every weight trainable (the fine-tune step).
import { loadF32, loadI32, profileGl } from './common.js';
import { PER_IMAGE, compare, timed, rowsOf, failedChecks, cpuMs } from './effnet_common.js';

// Head training: one fit of `epochs` epochs over the 32 images (4 steps an epoch) with the trunk
// cached. The fit computes the cache before its first step; onStep's times only say when a step was
// queued, but a call that receives losses knows the GPU has finished the steps up to the last of
// them. ms/step = (end of the fit - first such call after epoch 1) / the steps between the two.
async function headRow(m, x, y, a) {
  const marks = [];
  const perEpoch = Math.ceil(a.images / a.batch);
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

async function run(a) {
  const [x, y] = [await loadF32(a.x), await loadI32(a.y)];
  const mod = await import(a.bundle);
  const t0 = performance.now();
  const m = await mod.createModel();
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
      ['head_step_b8', () => headRow(m, x, y, a)],
    ]);
    if (a.profileHead && rows.head_step_b8.ms) try {
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
    const losses = [];
    const opts = { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer };
    rows = await rowsOf([
      ['finetune_step_b8', async () => {
        const r = await timed(a.warmup, a.repeats, async () => { losses.push((await m.fit(xb, yb, opts)).loss[0]); }, a.slow);
        r.detail.losses = losses;
        return r;
      }],
    ]);
  }
  m.dispose();
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
