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
