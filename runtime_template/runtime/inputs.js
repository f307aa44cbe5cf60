// ---- inputs: the checks every x, y and batch size goes through (model.js) --------------------------

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
