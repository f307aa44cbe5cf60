// ---- training: optimizers and their defaults, the trainable subset of a fit, the loss feed -------------

const OPTIMIZER_DEFAULTS = {
  // torch.optim defaults
  sgd: { lr: 1e-3, momentum: 0, dampening: 0, nesterov: false, weightDecay: 0 },
  adam: { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0 },
  adamw: { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 1e-2 },
};
// predict reads its output back blocking (gpu.js: read with `now`) when the forward does at most
// this many multiply-adds: the page then waits for the GPU a few ms at most, even on SwiftShader (on
// 2 CPU cores, 784->128 at batch 1, 0.1 M, takes 0.4 ms), where an asynchronous fence takes 3.5 ms.
const SYNC_READ_MACS = 1 << 20;
const KERNEL_OF_OPTIMIZER = { sgd: 'sgd', adam: 'adam', adamw: 'adam' };

function resolveOptimizer(opt) {
  const o = opt ?? { type: 'adam' };
  const type = o.type ?? 'adam';
  if (!OPTIMIZER_TYPE.ok(type)) {
    throw new TexelfitError('bad-option', `optimizer.type must be ${OPTIMIZER_TYPE.what}, got ${describe(type)}`);
  }
  checkOptions(o, OPTIMIZER_OPTIONS[type], `optimizer (${type})`);
  const defined = Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
  const r = { ...OPTIMIZER_DEFAULTS[type], ...defined, type };
  if (type === 'sgd' && r.nesterov && (r.momentum <= 0 || r.dampening !== 0)) {
    throw new TexelfitError('bad-option', 'nesterov needs a momentum > 0 and zero dampening (as in torch.optim.SGD)');
  }
  return r;
}

// ---- transfer learning: fit({ trainable }) ---------------------------------------------------------
// fnmatch's wildcards (* ? [seq] [!seq]) as a RegExp over a whole name.
function globRegExp(pattern) {
  const re = pattern.replace(/[.+^${}()|\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.').replace(/\[!/g, '[^');
  return new RegExp('^' + re + '$');
}

// The parameters one fit trains: null (all that the bundle trains), or a Set of their names, from
// `names` (names or fnmatch patterns). Anything that names no parameter the bundle trains is refused.
function resolveTrainable(names) {
  if (names == null) return null;
  if (!Array.isArray(names) || !names.length || names.some((n) => typeof n !== 'string')) {
    throw new TexelfitError('bad-option', 'trainable must be a non-empty array of parameter names or patterns');
  }
  const chosen = new Set();
  for (const name of names) {
    const hits = MODEL.trainable.filter((n) => globRegExp(name).test(n));
    if (!hits.length) throw new TexelfitError('bad-option', `trainable: "${name}" names no parameter that this bundle trains (${MODEL.trainable})`);
    for (const n of hits) chosen.add(n);
  }
  return chosen.size === MODEL.trainable.length ? null : chosen;
}

function requireTrainable(what) {
  if (!MODEL.trainable.length) throw new TexelfitError('not-trainable', `cannot ${what}: this bundle was built with --trainable none`);
}

// What training changes, read back at a step: texel data of every weight and optimizer state
// texture, and where the optimizer and the current fit stood.
//   fitStep: steps of the current fit done when it was taken; optStep: the optimizer's step count;
//   buffered: whether SGD's momentum buffer exists (torch creates it at the first step with momentum)
function isFiniteData(data) {
  for (let i = 0; i < data.length; i++) if (!Number.isFinite(data[i])) return false;
  return true;
}

// The losses of a running fit on their way to onStep. Every `interval` steps an asynchronous
// readback of the loss ring alone (one small texture, its own pixel-pack buffer, one fence) starts;
// the step loop never blocks on it, but before starting the next one it awaits the one before
// (#train). So the loop runs at most one interval ahead of the GPU (the GPU still has an interval
// of steps queued while it waits, so it never idles), and a step's loss reaches onStep at most two
// intervals after that step's own onStep call (a 64-step block readback counts as one of these
// readbacks). The interval is LOSS_FEED_STEPS, fewer where the
// GPU takes long enough a step that two intervals would exceed LOSS_FEED_MS. The 64-step block
// readbacks (#readBlock) fill `losses` too. take() hands onStep the losses known since its last
// call, in step order.
const LOSS_FEED_STEPS = 8;
const LOSS_FEED_MS = 250;

class LossFeed {
  constructor(gpu, losses, lossSpec) {
    this.gpu = gpu; // () => the device now (a restored context has a new one)
    this.losses = losses;
    this.lossSpec = lossSpec; // each output's loss and weight (outputs_multi.js: resolveLosses): a step's is their weighted sum
    this.reported = 0; // losses [0, reported) were handed to onStep
    this.validFrom = 0; // the ring holds this fit's losses from this step on (a restore replays from a snapshot)
    this.issuedAt = 0;
    this.interval = LOSS_FEED_STEPS;
    this.arrived = null; // { step, time } of the last readback in
    this.generation = 0;
    this.inFlight = null;
  }

  due(step) {
    return step - this.issuedAt >= this.interval;
  }

  // Start a readback of the losses of the steps before `step`, once the one before is in.
  async issue(step) {
    await this.settle();
    const ring = MODEL.lossRing;
    const from = Math.max(this.validFrom, step - ring);
    const generation = this.generation;
    this.issuedAt = step;
    const gpu = this.gpu();
    this.inFlight = gpu.read(lossRings(gpu), undefined, false, 'loss').then((data) => {
      if (!data || generation !== this.generation) return;
      for (let s = from; s < step; s++) if (this.losses[s] === undefined) this.losses[s] = ringLoss(data, this.lossSpec, s);
      const now = performance.now();
      if (this.arrived && step > this.arrived.step) {
        const perStep = (now - this.arrived.time) / (step - this.arrived.step); // the GPU's ms a step, roughly
        this.interval = Math.max(1, Math.min(LOSS_FEED_STEPS, Math.floor(LOSS_FEED_MS / 2 / perStep)));
      }
      this.arrived = { step, time: now };
    }, () => {}).finally(() => { this.inFlight = null; });
  }

  // A block readback (#readBlock) started after `step` steps serves as the feed's readback too.
  track(step, read) {
    this.issuedAt = step;
    this.inFlight = read.then(() => {}, () => {}).finally(() => { this.inFlight = null; });
  }

  // The losses read back and not yet handed out, of steps before `step`: [{ step, loss }].
  take(step) {
    const out = [];
    while (this.reported < step && this.losses[this.reported] !== undefined) {
      out.push({ step: this.reported, loss: this.losses[this.reported] });
      this.reported++;
    }
    return out;
  }

  // The context was restored, or the fit waited (paused, hidden): steps from `step` on are
  // replayed or run later, and a read in flight says nothing about the GPU's speed.
  restart(step, replay) {
    if (replay) {
      this.generation++;
      this.validFrom = step;
    }
    this.issuedAt = step;
    this.arrived = null;
  }

  async settle() {
    while (this.inFlight) await this.inFlight;
  }
}
