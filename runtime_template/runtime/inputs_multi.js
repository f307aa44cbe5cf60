// ---- a model with several inputs (rendered only for one: MODEL.inputs) ------------------------------

// A multi-input model's x (MODEL.inputs): an object keyed by input name -> one Float32Array per input, in
// MODEL.inputs' order. A missing or an unknown key rejects with bad-input naming it.
function inputArrays(x, what) {
  const names = MODEL.inputs.map((i) => i.name).join(', ');
  if (x === null || typeof x !== 'object' || Array.isArray(x) || ArrayBuffer.isView(x)) {
    throw new TexelfitError('bad-input', `${what} must be an object keyed by input name (${names}), got ${kindOf(x)}`);
  }
  for (const k of Object.keys(x)) {
    if (!MODEL.inputs.some((i) => i.name === k)) throw new TexelfitError('bad-input', `${what} has an unknown input "${k}": the inputs are ${names}`);
  }
  return MODEL.inputs.map((i) => {
    if (!(i.name in x)) throw new TexelfitError('bad-input', `${what} has no input "${i.name}": the inputs are ${names}`);
    return i.dtype !== 'float32' ? toIds(x[i.name], `${what}.${i.name}`, i.name, i.size, i.idRange)
      : toFloat32(x[i.name], `${what}.${i.name}`);
  });
}

// The inputs' textures and per-sample sizes, and x's arrays in their order (inputArrays: batches.js).
const INPUTS = MODEL.inputs;
const xArrays = (xs) => xs;

// x keyed by input name (inputArrays), each input holding `samples` samples: its arrays
function checkX(x, samples, what) {
  const xs = inputArrays(x, what);
  MODEL.inputs.forEach((inp, k) => {
    if (xs[k].length !== samples * inp.size) {
      throw new TexelfitError('bad-input',
        `${what}.${inp.name} has ${xs[k].length} values, expected ${samples} x ${inp.size} (batch x its shape [${inp.shape}])`);
    }
    checkFinite(xs[k], `${what}.${inp.name}`);
  });
  return xs;
}

// x of fit and gradients: a whole number of samples, at least one, the same in every input: [its arrays, the samples].
function readX(x, what) {
  const xs = inputArrays(x, what);
  let samples;
  MODEL.inputs.forEach((inp, k) => {
    const n = xs[k].length / inp.size;
    if (!Number.isInteger(n) || n < 1) {
      throw new TexelfitError('bad-input',
        `${what}.${inp.name} has ${xs[k].length} values, not a whole number of samples of ${inp.size} (its shape [${inp.shape}])`);
    }
    if (k && n !== samples) {
      throw new TexelfitError('bad-input',
        `${what}.${inp.name} holds ${n} samples but ${what}.${MODEL.inputs[0].name} ${samples}: every input needs the same batch`);
    }
    samples = n;
  });
  return [checkX(x, samples, what), samples];
}

// info's record of the inputs (model.js)
const inputInfo = () => ({
  inputs: Object.freeze(MODEL.inputs.map((i) => Object.freeze({ name: i.name, shape: i.shape.slice(), dtype: i.dtype, ...(i.idRange ? { idRange: i.idRange } : {}) }))),
});
