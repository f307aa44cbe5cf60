// ---- dropout (rendered only for a model with nn.Dropout layers) ----------------------------------

// The integer hash of the dropout masks (prep/dropout.py), on unsigned 32-bit values.
function lowbias32(x) {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

// fit's dropout in its training step `step` (fit.js): on or off (fit's options.dropout), and the step's
// seed of the masks, from the fit's `seed` (prep/dropout.py: step seed).
function dropoutUniforms(u, on, seed, step) {
  u.u_dropout = on ? 1 : 0;
  u.u_dropseed = lowbias32((seed + Math.imul(step, 0x9E3779B9)) >>> 0) & 0x7fffffff;
}
