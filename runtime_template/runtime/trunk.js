// ---- transfer learning: the cached trunk, features (rendered only for a model with a frozen trunk) ------
// Functions of a model's state `s` (model.js: modelState); MODEL.trunk: the trunk's tensor and texture.

// The trunk's output (MODEL.trunk) for every sample of xs as texel rows, computed a batch at a
// time and read back once: fit then uploads each batch's rows (a plain copy, in any order) where
// the trunk would have computed them, and runs the head alone, to the same values. Kept in the
// page's memory rather than a texture: a shuffled batch is a gather, which uploads do as they are
// (no pass of its own), a fit may have more samples than a texture holds rows, and it survives a
// lost context. null where its texture is half-float (never read back).
async function trunkCache(s, xs, samples) {
  if (s.gpu.textures.get(MODEL.trunk.texture).format === 'f16') return null;
  for (;;) {
    await waitRunnable(s);
    const out = await computeTrunk(s, xs, samples);
    if (out) return out;
  }
}

// Texel rows of the trunk's output of samples [0, samples) of xs, or null if the context was lost.
async function computeTrunk(s, xs, samples) {
  const rec = s.gpu.textures.get(MODEL.trunk.texture);
  const floats = rec.spec.sampleRows * rec.spec.width * 4;
  const cache = new Float32Array(samples * floats);
  const r = s.gpu.runner;
  for (let start = 0; start < samples; start += MODEL.maxBatch) {
    const count = Math.min(MODEL.maxBatch, samples - start);
    uploadBatch(s, xs, null, null, start, count);
    r.uniforms.u_batch = count;
    r.run(r.trunk);
    const read = await s.gpu.read([rec], () => count * rec.spec.sampleRows);
    if (!read) return null;
    cache.set(read[0].subarray(0, count * floats), start * floats);
  }
  return cache;
}

// Upload the cached trunk rows of samples order[start .. start+count) as the current batch's.
function uploadTrunk(s, cache, order, start, count) {
  const rec = s.gpu.textures.get(MODEL.trunk.texture);
  const floats = rec.spec.sampleRows * rec.spec.width * 4;
  if (!s.trunkStage) s.trunkStage = new Float32Array(rec.spec.width * rec.spec.height * 4);
  if (order) {
    for (let b = 0; b < count; b++) s.trunkStage.set(cache.subarray(order[start + b] * floats, (order[start + b] + 1) * floats), b * floats);
  } else s.trunkStage.set(cache.subarray(start * floats, (start + count) * floats));
  s.gpu.upload(rec, s.trunkStage, count * rec.spec.sampleRows);
}

// Model.features: the frozen trunk's output for a batch, in PyTorch's order.
function trunkFeatures(s, x, batch) {
  let xs, list;
  return soon(s, async () => {
    requireContext(s, 'compute features');
    if (list) xs = await readImages(s.gpu, list);
    const r = s.gpu.runner;
    const rec = s.gpu.textures.get(MODEL.trunk.texture);
    const rows = rec.spec.sampleRows, floats = rows * rec.spec.width * 4, size = MODEL.trunk.size;
    const out = new Float32Array(batch * size);
    for (let start = 0; start < batch; start += MODEL.maxBatch) { // more than maxBatch: batch by batch
      const count = Math.min(MODEL.maxBatch, batch - start);
      uploadBatch(s, xs, null, null, start, count);
      r.uniforms.u_batch = count;
      r.run(r.trunk);
      const read = await s.gpu.read([rec], () => count * rows);
      if (!read) throw new TexelfitError('context-lost', 'the WebGL context was lost while computing features');
      for (let b = 0; b < count; b++) {
        unpackTexels(read[0].subarray(b * floats, (b + 1) * floats), rec.spec.packing, rows, out, (start + b) * size);
      }
    }
    return out;
  }, () => {
    [list, batch] = sourcesBatch(x, batch);
    checkBatch(batch, 'batch');
    if (!list) xs = checkX(x, batch, 'x');
  });
}
