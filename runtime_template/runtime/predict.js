// ---- predict and gradients ----------------------------------------------------------------------
// Functions of a model's state `s` (model.js: modelState).

// Model.predict: any number of samples; more than maxBatch run as several batches (the same result).
function predictSamples(s, x, batch) {
  let xs, list;
  return soon(s, async () => {
    requireContext(s, 'predict');
    if (list) xs = await readImages(s.gpu, list);
    const results = OUTPUTS.map((o) => new Float32Array(batch * o.size));
    for (let start = 0; start < batch; start += MODEL.maxBatch) {
      const count = Math.min(MODEL.maxBatch, batch - start);
      await predictBatch(s, xs, start, count, results);
    }
    return predictResult(results); // (outputs_multi.js: the one output's array, or the outputs' keyed by name)
  }, () => {
    [list, batch] = sourcesBatch(x, batch);
    checkBatch(batch, 'batch');
    if (!list) xs = checkX(x, batch, 'x');
  });
}

async function predictBatch(s, xs, start, batch, results) {
  uploadBatch(s, xs, null, null, start, batch);
  const r = s.gpu.runner;
  r.uniforms.u_batch = batch;
  r.run(r.forward);
  const recs = OUTPUTS.map((o) => s.gpu.textures.get(o.texture));
  const now = batch * MODEL.forwardMacs <= SYNC_READ_MACS;
  const read = await s.gpu.read(recs, (rec) => batch * rec.spec.sampleRows, now, 'call');
  if (!read) throw new TexelfitError('context-lost', 'the WebGL context was lost during predict');
  OUTPUTS.forEach((o, k) => {
    const out = recs[k], rows = out.spec.sampleRows, floats = rows * out.spec.width * 4;
    for (let b = 0; b < batch; b++) {
      unpackTexels(read[k].subarray(b * floats, (b + 1) * floats), out.spec.packing, rows, results[k], (start + b) * o.size);
    }
  });
}

// Model.gradients: of the mean loss over all samples of x, for every trainable parameter, changing
// nothing; more samples than maxBatch run as batches, summed with each batch's share as weight.
function computeGradients(s, x, y, options) {
  let args;
  return serial(s, async () => {
    const { xs, losses, samples } = args;
    requireContext(s, 'compute gradients');
    const params = MODEL.params.filter((p) => p.trainable); // a frozen parameter has no gradient
    const r = s.gpu.runner;
    const sizes = [...new Set([Math.min(samples, MODEL.maxBatch), samples % MODEL.maxBatch || MODEL.maxBatch])];
    await r.prepare([r.forward, lossPasses(r, losses), r.backward], sizes);
    const recs = params.map((p) => s.gpu.textures.get('pgrad:' + p.name));
    let sum = null;
    for (let start = 0; start < samples; start += MODEL.maxBatch) {
      const batch = Math.min(MODEL.maxBatch, samples - start);
      uploadBatch(s, xs, losses, null, start, batch);
      r.uniforms.u_batch = batch;
      r.uniforms.u_ring = 0;
      r.run(r.forward);
      r.run(lossPasses(r, losses));
      r.run(r.backward);
      const data = await s.gpu.read(recs, undefined, false, 'call');
      if (!data) throw new TexelfitError('context-lost', 'the WebGL context was lost while computing gradients');
      const grads = unpackParams(recs, data, params);
      if (batch === samples) return grads;
      const share = batch / samples;
      if (!sum) sum = Object.fromEntries(params.map((p) => [p.name, new Float64Array(p.length)]));
      for (const p of params) {
        const g = grads[p.name], acc = sum[p.name];
        for (let i = 0; i < g.length; i++) acc[i] += share * g[i];
      }
    }
    return Object.fromEntries(Object.entries(sum).map(([k, v]) => [k, Float32Array.from(v)]));
  }, () => {
    requireTrainable('compute gradients');
    const o = checkOptions(options, GRADIENTS_OPTIONS, 'gradients options');
    const [xs, samples] = readX(x, 'x');
    args = { xs, losses: resolveLosses(o, y, samples), samples };
  });
}
