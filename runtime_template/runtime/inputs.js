// ---- inputs: the checks every x, y and batch size goes through (x's own: inputs_single.js, inputs_multi.js) -

// Float32Array as it is, Float64Array converted; nothing else (bytes of pixels, integers, plain
// arrays and strings would go through as raw values).
function toFloat32(x, what) {
  if (x instanceof Float32Array) return x;
  if (x instanceof Float64Array) return Float32Array.from(x);
  throw new TexelfitError('bad-input',
    `${what} must be a Float32Array (or a Float64Array), got ${kindOf(x)}; convert the values first (Float32Array.from), `
    + 'and scale image bytes to the range the model was trained on');
}

function kindOf(x) {
  if (x === null || x === undefined) return String(x);
  if (typeof x !== 'object') return `a ${typeof x}`;
  if (Array.isArray(x)) return 'a plain Array';
  return `a ${Object.prototype.toString.call(x).slice(8, -1)}`;
}

function checkFinite(x, what) {
  for (let i = 0; i < x.length; i++) {
    if (!Number.isFinite(x[i])) throw new TexelfitError('non-finite-input', `${what}[${i}] is ${x[i]}: values must be finite`);
  }
}

// A batch size: an integer from 1 to `max`.
function checkBatch(batch, what, max = Infinity) {
  if (typeof batch !== 'number' || !Number.isInteger(batch) || batch < 1 || batch > max) {
    const range = max === Infinity ? 'a positive integer' : `an integer from 1 to maxBatch = ${max}`;
    throw new TexelfitError('bad-batch', `${what} is ${describe(batch)}: it must be ${range}`);
  }
}

// y of `samples` samples for output `out`'s `loss` (outputs.js: OUTPUTS): class indices (cross_entropy) or
// targets, as they upload (batches.js). `what`: y, or y.NAME of a model with several outputs.
function checkY(y, samples, loss, out, what) {
  if (loss === 'cross_entropy') {
    if (!(y instanceof Int32Array)) {
      throw new TexelfitError('bad-labels', `${what} must be an Int32Array of class indices for cross_entropy, got ${kindOf(y)}`);
    }
    if (y.length !== samples) {
      throw new TexelfitError('bad-labels', `${what} has ${y.length} labels, expected one per sample (${samples})`);
    }
    const classes = out.size;
    for (let i = 0; i < y.length; i++) {
      if (!Number.isInteger(y[i]) || y[i] < 0 || y[i] >= classes) {
        throw new TexelfitError('label-out-of-range', `label ${what}[${i}] = ${y[i]} is not a class index in [0, ${classes})`);
      }
    }
    return y;
  }
  const ys = toFloat32(y, what);
  if (ys.length !== samples * out.size) {
    throw new TexelfitError('bad-targets',
      `${what} has ${ys.length} values, expected ${samples} x ${out.size} (batch x ${what === 'y' ? 'outputShape' : 'its shape'} [${out.shape}])`);
  }
  checkFinite(ys, what);
  return ys;
}
