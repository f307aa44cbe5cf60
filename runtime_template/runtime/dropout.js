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
