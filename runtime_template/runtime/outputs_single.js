// ---- a model with one output (rendered where MODEL.outputs has one; outputs_multi.js otherwise) ---------
// The interface of outputs_multi.js for one output: predict returns its Float32Array, y is one array (class indices
// for cross_entropy, targets for mse), `loss` one name, and fit's loss is that output's.
const OUTPUTS = MODEL.outputs;
const lossTexture = (kind) => kind; // (codegen/webgl2/layout.py: loss_texture of output 0)

function resolveLosses(o, y, samples) {
  if (o.lossWeights !== undefined) {
    throw new TexelfitError('bad-option', 'lossWeights weighs the losses of several outputs; this model has one');
  }
  const kind = o.loss ?? MODEL.defaultLoss;
  return [{ kind, weight: 1, ys: checkY(y, samples, kind, OUTPUTS[0], 'y') }];
}

const lossPasses = (r, losses) => r.loss[0][losses[0].kind];
const lossRings = (gpu) => [gpu.textures.get('loss')];
const ringLoss = (data, losses, i) => data[0][4 * (i % MODEL.lossRing)];
const predictResult = (arrays) => arrays[0];
