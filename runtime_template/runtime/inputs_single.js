// ---- a model with one input (rendered where MODEL.inputs is absent; inputs_multi.js otherwise) ---------

// The input's texture and per-sample size, and x's arrays in that order (x is one array: batches.js).
const INPUTS = [{ texture: MODEL.textures.input, size: MODEL.inputSize }];
const xArrays = (xs) => [xs];

// x as the Float32Array every tier stores: token ids (MODEL.idRange: toIds, ids.js), or floats.
function toX(x, what) {
  return MODEL.idRange ? toIds(x, what) : toFloat32(x, what);
}

// x holding `samples` samples: its array.
function checkX(x, samples, what) {
  const xs = toX(x, what);
  if (xs.length !== samples * MODEL.inputSize) {
    throw new TexelfitError('bad-input-shape',
      `${what} has ${xs.length} values, expected ${samples} x ${MODEL.inputSize} (batch x inputShape [${MODEL.inputShape}])`);
  }
  checkFinite(xs, what);
  return xs;
}

// x of fit and gradients, any whole number of samples (at least one): [its array, the samples].
function readX(x, what) {
  const xs = toX(x, what);
  const samples = xs.length / MODEL.inputSize;
  if (!Number.isInteger(samples) || samples < 1) {
    throw new TexelfitError('bad-input-shape',
      `${what} has ${xs.length} values, not a whole number of samples of ${MODEL.inputSize} (inputShape [${MODEL.inputShape}])`);
  }
  checkX(xs, samples, what);
  return [xs, samples];
}

// info's record of the input (model.js): token ids' dtype and range (build --input-dtype), each in [0, idRange)
const inputInfo = () => (MODEL.idRange ? { inputDtype: MODEL.inputDtype, idRange: MODEL.idRange } : {});
