// ---- token ids (rendered only for a model with an integer input) ------------------------------------

// Token ids (build --input-dtype int64 / int32): an Int32Array, or a plain Array, Float32Array or
// Float64Array holding integers, each in [0, MODEL.idRange) (the embedding table's rows); as a
// Float32Array of the same values, exact (ids < 2^24), which is how every tier stores them. Position
// i is sample floor(i / T), token i % T of the [N, T] row-major batch.
function toIds(x, what, name = MODEL.inputName, t = MODEL.inputSize, range = MODEL.idRange) {
  if (!(x instanceof Int32Array || x instanceof Float32Array || x instanceof Float64Array || Array.isArray(x))) {
    throw new TexelfitError('bad-input', `${what} (input "${name}") must be an Int32Array of token ids, got ${kindOf(x)}`);
  }
  for (let i = 0; i < x.length; i++) {
    const v = x[i];
    if (typeof v === 'number' && Number.isInteger(v) && v >= 0 && v < range) continue;
    const at = `${what}[${i}] (input "${name}", sample ${Math.floor(i / t)}, token ${i % t}) is ${describe(v)}`;
    throw new TexelfitError('bad-input', typeof v === 'number' && Number.isInteger(v)
      ? `${at}: out of range, token ids must be in [0, ${range}) (the embedding table's rows)`
      : `${at}: token ids must be integers in [0, ${range}) (an Int32Array)`);
  }
  return x instanceof Float32Array ? x : Float32Array.from(x);
}
