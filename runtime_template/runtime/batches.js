// ---- batches: x and y uploaded as the current batch ------------------------------------------------
// Functions of a model's state `s` (model.js: modelState). x is checked by inputs_single.js or
// inputs_multi.js (checkX, readX), which also say the input textures (INPUTS) and x's arrays (xArrays).

// Upload samples order[start .. start+count) of x (and of each output's y: `losses`, outputs_multi.js: resolveLosses)
// as the current batch.
function uploadBatch(s, xs, losses, order, start, count) {
  const tex = s.gpu.textures;
  if (xs) {
    const arrays = xArrays(xs);
    INPUTS.forEach((inp, k) => uploadSamples(s, tex.get(inp.texture), arrays[k], inp.size, s.stage[k], order, start, count));
  }
  (losses ?? []).forEach(({ kind, ys }, k) => {
    const stage = s.lossStages[k];
    if (kind === 'cross_entropy') {
      for (let b = 0; b < count; b++) stage.labels[4 * b] = ys[order ? order[start + b] : start + b];
      s.gpu.upload(tex.get(lossTexture('labels', k)), stage.labels, count);
    } else {
      uploadSamples(s, tex.get(lossTexture('targets', k)), ys, OUTPUTS[k].size, stage.targets, order, start, count);
    }
  });
}

// Pack each sample into its rows of the staging buffer, then upload the batch's rows at once.
function uploadSamples(s, rec, src, size, stage, order, start, count) {
  const rows = rec.spec.sampleRows;
  const floats = rows * rec.spec.width * 4;
  const plain = s.plain.get(rec.spec.name);
  if (plain && !order) {
    stage.set(src.subarray(start * size, (start + count) * size)); // consecutive samples
  } else {
    for (let b = 0; b < count; b++) {
      const i = order ? order[start + b] : start + b;
      if (plain) stage.set(src.subarray(i * size, (i + 1) * size), b * floats);
      else packTexels(src, i * size, rec.spec.packing, rows, stage.subarray(b * floats, (b + 1) * floats));
    }
  }
  s.gpu.upload(rec, stage, count * rows);
}
