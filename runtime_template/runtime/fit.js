// ---- fit: the training loop ----------------------------------------------------------------------
// Functions of a model's state `s` (model.js: modelState).

// Model.fit: check the arguments at once, then train in the call queue (lifecycle.js: serial).
function fitSamples(s, x, y, options) {
  let args;
  return serial(s, async () => {
    s.fitting = true;
    try {
      if (args.list) args.xs = await readImages(s.gpu, args.list);
      return await train(s, args);
    } finally {
      if (s.state !== 'lost') s.state = 'idle';
      await runBetween(s); // (none is left behind: nothing awaits between this and the flag)
      s.fitting = false;
    }
  }, () => {
    requireTrainable('fit');
    const o = checkOptions(options, FIT_OPTIONS, 'fit options');
    const list = imageList(x); // (image sources: only a model with one image input takes them)
    const [xs, samples] = list ? [null, list.length] : readX(x, 'x');
    const losses = resolveLosses(o, y, samples); // (each output's loss, weight and y: outputs_multi.js)
    const batchSize = o.batchSize ?? Math.min(32, MODEL.maxBatch);
    checkBatch(batchSize, 'batchSize', MODEL.maxBatch);
    const opt = resolveOptimizer(o.optimizer);
    const mu = checkOptions(o.proximal, PROXIMAL_OPTIONS, 'fit options.proximal').mu ?? 0;
    // transfer learning: the parameters this fit trains, and whether the frozen trunk is cached
    const only = resolveTrainable(o.trainable);
    args = { xs, list, losses, samples, opt, mu, batchSize, epochs: o.epochs ?? 1, shuffle: o.shuffle ?? true, seed: o.seed, onStep: o.onStep,
             only, cacheTrunk: o.cacheTrunk ?? true, dropout: o.dropout ?? true };
  });
}

async function train(s, { xs, losses: lossSpec, samples, opt, mu, batchSize, epochs, shuffle, seed, onStep, only, cacheTrunk, dropout }) {
  const perEpoch = Math.ceil(samples / batchSize);
  const total = perEpoch * epochs;
  const ring = MODEL.lossRing;
  // SGD without momentum keeps no state (ops/optim.py: sgd0)
  const kernel = opt.type === 'sgd' && opt.momentum === 0 ? 'sgd0' : KERNEL_OF_OPTIMIZER[opt.type];
  // every epoch's order, fixed up front, so any step can be replayed
  const orders = [];
  let rng = (seed ?? ((Math.random() * 2 ** 32) >>> 0)) >>> 0;
  const dropSeed = rng; // each step's dropout masks (prep/dropout.py: step seed; a model with dropout)
  const random = () => { // mulberry32
    rng = (rng + 0x6D2B79F5) >>> 0;
    let t = rng;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (let e = 0; e < epochs; e++) {
    if (!shuffle) {
      orders.push(null);
      continue;
    }
    const order = new Uint32Array(samples);
    for (let i = 0; i < samples; i++) order[i] = i;
    for (let i = samples - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      const t = order[i]; order[i] = order[j]; order[j] = t;
    }
    orders.push(order);
  }

  // the starting point: optimizer state for this optimizer, and a snapshot of step 0
  let base = null;
  while (!base) {
    await waitRunnable(s);
    useOptimizer(s, opt.type);
    base = s.stateIs ? { ...s.stateIs, fitStep: 0 } : await takeSnapshot(s, 0, true);
  }
  if (kernel !== 'sgd0') alignState(s, base);
  commitSnapshot(s, base);
  s.state = 'training';
  // the proximal term's anchor: the weights this fit starts from (as base holds them), kept here for
  // a restored context's runner
  const anchors = mu > 0 ? base.data : null;
  // the programs of a training step, compiled now rather than at createModel (runner.js)
  const rr = s.gpu.runner;
  const sizes = samples % batchSize ? [batchSize, samples % batchSize] : [batchSize];
  await rr.prepare([rr.forward, lossPasses(rr, lossSpec), rr.trainBackward, optimizerOf(s, rr, kernel, only, anchors).passes], sizes);
  // the frozen trunk's output of every sample, computed once for the fit (null: not cached; no trunk,
  // MODEL.trunk null: fit runs the whole forward)
  const trunk = cacheTrunk && MODEL.trunk ? await trunkCache(s, xs, samples) : null;

  const losses = new Array(total);
  const feed = new LossFeed(() => s.gpu, losses, lossSpec);
  let generation = s.generation;
  let pending = null; // the readback of the last block of steps: true when done, null if lost
  let failure = null; // { step, value } of the first non-finite loss
  let gpuFailure = null; // [error, step]: a GL error found by the block readback after `step` steps
  let callbackError = null; // what onStep threw, and at which step
  const fail = (f) => { failure = failure ?? f; };
  let lastYield = performance.now();
  let step = 0;
  try {
    for (;;) {
      checkDisposed(s);
      if (s.between.length) await runBetween(s);
      if (!runnable(s) || generation !== s.generation) {
        await waitRunnable(s);
        if (generation !== s.generation) { // restored: replay from the latest snapshot
          generation = s.generation;
          pending = null;
          step = s.snapshot.fitStep;
          feed.restart(step, true);
          s.state = 'training'; // (restored: no longer 'lost', nor the 'idle' a restore between calls leaves)
          continue;
        }
        feed.restart(step, false);
        s.state = 'training';
      }
      if (step === total || step % ring === 0) {
        // a block boundary: the previous block's readback must be in (it confirms its snapshot
        // and frees the buffers) before a new one starts
        const done = pending ? await pending : true;
        pending = null;
        if (done === null && !callbackError) continue; // lost: the loop waits for the restore and replays
        if (failure || gpuFailure || callbackError || step === total) break;
      }
      if (callbackError) { // mid-block: the state stays as the last step left it
        s.stateIs = null;
        break;
      }
      const r = s.gpu.runner;
      const epoch = Math.floor(step / perEpoch);
      const start = (step % perEpoch) * batchSize;
      const count = Math.min(batchSize, samples - start);
      if (trunk) uploadTrunk(s, trunk, orders[epoch], start, count);
      uploadBatch(s, trunk ? null : xs, lossSpec, orders[epoch], start, count);
      s.stateIs = null; // this step changes the state
      r.uniforms.u_batch = count;
      r.uniforms.u_ring = step % ring;
      setStepUniforms(s, opt);
      r.uniforms.u_mu = mu;
      if (MODEL.dropout) dropoutUniforms(r.uniforms, dropout, dropSeed, step); // (a model with dropout: dropout.js)
      r.run(trunk ? r.head : r.forward);
      r.run(lossPasses(r, lossSpec));
      r.run(r.trainBackward); // without the parameter-gradient passes: the optimizer computes those
      r.uniforms.u_dropout = 0; // (dropout applies in a training step's forward and backward alone)
      const update = optimizerOf(s, r, kernel, only, anchors);
      r.run(update.passes);
      for (const rec of update.swaps) rec.cur = 1 - rec.cur; // (runner.swap, for these parameters)
      s.optimizer.step++;
      if (kernel === 'sgd') s.optimizer.buffered = true;
      step++;
      if (step % ring === 0 || step === total) {
        await feed.settle(); // (every readback awaits the one before it: the feed's lag stays bounded)
        pending = readBlock(s, step, losses, lossSpec, fail, (f) => { gpuFailure = gpuFailure ?? f; });
        feed.track(step, pending);
      } else if (feed.due(step)) {
        await feed.issue(step);
      }
      if (onStep) {
        try {
          onStep({ step: step - 1, epoch, loss: losses[step - 1], losses: feed.take(step) });
        } catch (e) {
          callbackError = { error: e, step: step - 1 };
          if (!pending) continue; // stops at the top of the loop
        }
      }
      if (performance.now() - lastYield > 12) {
        await nextTask();
        lastYield = performance.now();
      }
    }
  } finally {
    // nothing may read GL objects after the fit: dispose() releases them once it is over
    await feed.settle();
    if (pending) await pending.catch(() => null);
    if (anchors) dropAnchors(s, s.gpu.runner);
  }
  if (gpuFailure) {
    // the GPU failed after the last snapshot (whose readback found no GL error since the one before it):
    // back to it; never a resolve with what the failed steps left
    const [error, end] = gpuFailure, good = s.snapshot;
    loadSnapshot(s, good);
    error.message += ` between steps ${good.fitStep} and ${end} of this fit; the weights were rolled back to step ${good.fitStep}`;
    throw error;
  }
  if (failure) {
    // never commit garbage: back to the last snapshot known good
    const good = s.confirmed;
    loadSnapshot(s, good);
    s.snapshot = good;
    throw new TexelfitError('non-finite-loss',
      `the loss of step ${failure.step} is ${failure.value}; the weights were rolled back to optimizer step ${good.optStep}`,
      { step: failure.step });
  }
  if (callbackError) {
    const { error, step: at } = callbackError;
    throw new TexelfitError('callback-error',
      `onStep threw at step ${at} (${error instanceof Error ? `${error.name}: ${error.message}` : describe(error)}); `
      + `the fit stopped there, with the weights after that step (steps 0 to ${at} are applied)`,
      { cause: error, step: at });
  }
  return { loss: losses };
}

// Read the loss ring and the state after `end` steps. The snapshot becomes the latest; the one
// before is confirmed good when the first loss computed from it is finite.
// A GL error since the last check (GL_OUT_OF_MEMORY, say: a readback buffer too large) goes to
// `gpuFail` instead: neither the losses nor the snapshot are taken, since either may be garbage.
async function readBlock(s, end, losses, lossSpec, fail, gpuFail) {
  const rings = lossRings(s.gpu); // (each output's: outputs_multi.js)
  // what a fit changes: the frozen weights (a trunk of millions) are the latest snapshot's, read again
  // only when something else writes them (setWeights, a restore: resnapshot)
  const recs = [...rings, ...stateRecs(s, true)];
  const { step: optStep, type: optimizer, buffered } = s.optimizer;
  let data;
  try {
    data = await s.gpu.read(recs, undefined, false, 'block', true);
  } catch (e) {
    if (e.code !== 'gpu-error' && e.code !== 'out-of-memory') throw e;
    gpuFail([e, end]);
    return true;
  }
  if (!data) return null;
  const ring = MODEL.lossRing;
  const first = end - ((end - 1) % ring + 1);
  let finite = true;
  for (let i = first; i < end; i++) {
    const v = ringLoss(data, lossSpec, i);
    losses[i] = v;
    if (!Number.isFinite(v)) {
      fail({ step: i, value: v });
      finite = false;
      break;
    }
  }
  const snap = { fitStep: end, optStep, optimizer, buffered, data: new Map(s.snapshot.data) };
  recs.slice(rings.length).forEach((rec, i) => snap.data.set(rec.spec.name, data[i + rings.length]));
  // the snapshot taken at `first` is good if the loss computed from its weights is finite
  if (Number.isFinite(losses[first]) && s.snapshot && s.snapshot.fitStep === first) {
    s.confirmed = s.snapshot;
  }
  if (finite && data.slice(rings.length).every(isFiniteData)) {
    s.snapshot = snap;
    if (end === losses.length) { // the end of the fit: nothing follows
      s.confirmed = snap;
      s.stateIs = snap;
    }
  }
  return true;
}
