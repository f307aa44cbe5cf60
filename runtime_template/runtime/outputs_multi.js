// ---- a model with several outputs (rendered only for one: outputs_single.js otherwise) ------------------
// MODEL.outputs (codegen/render.py: output_records): {name, shape, size, texture, loss} each, in the order the model
// returns them. predict returns an object of arrays keyed by output name, y is such an object, `loss` a name (for
// every output) or an object of names keyed by output, `lossWeights` an object of weights (1 where absent). What
// fit minimises and reports is the weighted sum of the outputs' losses, each the mean over the batch as in
// PyTorch: sum_k lossWeights[k] * loss_k(output_k, y_k). Each output's loss passes (SCHEDULE.loss[k]) write its
// gradient times its weight (the gradient pass's u_loss_weight, set here) and its value into its own loss ring.
const OUTPUTS = MODEL.outputs;

// Output k's loss texture of `kind` ('labels', 'targets', 'loss': its ring), as codegen/webgl2/layout.py: loss_texture.
const lossTexture = (kind, k) => (k ? kind + k : kind);

function outputNames() {
  return OUTPUTS.map((o) => o.name).join(', ');
}

// An object keyed by output name: its value for each output, in order (fill(output) where a key is absent; a
// missing key rejects where there is no fill, as an unknown key always does).
function byOutput(v, what, fill, code = 'bad-option') {
  if (v === null || typeof v !== 'object' || Array.isArray(v) || ArrayBuffer.isView(v)) {
    throw new TexelfitError(code, `${what} must be an object keyed by output name (${outputNames()}), got ${kindOf(v)}`);
  }
  for (const key of Object.keys(v)) {
    if (!OUTPUTS.some((o) => o.name === key)) throw new TexelfitError(code, `${what} has an unknown output "${key}": the outputs are ${outputNames()}`);
  }
  return OUTPUTS.map((o) => {
    if (o.name in v) return v[o.name];
    if (fill) return fill(o);
    throw new TexelfitError(code, `${what} has no output "${o.name}": the outputs are ${outputNames()}`);
  });
}

// The losses of a fit or a gradients call: one { kind, weight, ys } per output, from its options' loss and
// lossWeights and y (checked: checkY) of `samples` samples.
function resolveLosses(o, y, samples) {
  const kinds = o.loss === undefined || typeof o.loss === 'string' ? OUTPUTS.map((out) => o.loss ?? out.loss)
    : byOutput(o.loss, 'loss', (out) => out.loss);
  const weights = o.lossWeights === undefined ? OUTPUTS.map(() => 1) : byOutput(o.lossWeights, 'lossWeights', () => 1);
  const ys = byOutput(y, 'y', null, 'bad-targets');
  return OUTPUTS.map((out, k) => {
    const offered = Object.keys(SCHEDULE.loss[k]);
    if (!offered.includes(kinds[k])) {
      throw new TexelfitError('bad-option', `the loss of output "${out.name}" must be ${offered.map((n) => `"${n}"`).join(' or ')}, got ${describe(kinds[k])}`);
    }
    const w = weights[k];
    if (typeof w !== 'number' || !Number.isFinite(w) || w < 0) {
      throw new TexelfitError('bad-option', `lossWeights.${out.name} must be a finite number >= 0, got ${describe(w)}`);
    }
    return { kind: kinds[k], weight: w, ys: checkY(ys[k], samples, kinds[k], out, `y.${out.name}`) };
  });
}

// The passes of these losses (resolveLosses), in output order, each gradient pass weighted by its output's weight.
function lossPasses(r, losses) {
  const list = [];
  losses.forEach(({ kind, weight }, k) => {
    for (const p of r.loss[k][kind]) {
      if (p.values && p.values.u_loss_weight !== undefined) p.values.u_loss_weight = weight;
      list.push(p);
    }
  });
  return list;
}

// Every output's loss ring, in order; and the loss of step i from their data: the weighted sum.
const lossRings = (gpu) => OUTPUTS.map((o, k) => gpu.textures.get(lossTexture('loss', k)));

function ringLoss(data, losses, i) {
  let v = 0;
  for (let k = 0; k < losses.length; k++) v += losses[k].weight * data[k][4 * (i % MODEL.lossRing)];
  return v;
}

// What predict returns: the outputs' arrays keyed by name.
const predictResult = (arrays) => Object.fromEntries(OUTPUTS.map((o, k) => [o.name, arrays[k]]));
