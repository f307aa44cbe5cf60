// ---- weights and checkpoints: getWeights, setWeights, save, restore -------------------------------
// Functions of a model's state `s` (model.js: modelState). Tied parameters' other names: MODEL.aliases
// (aliases.js: withAliases), where the model has them.

// Weights in the state_dict layout from the texel data of their textures (`recs`, `data`).
function unpackParams(recs, data, params = WEIGHTS_LISTED) {
  const out = {};
  params.forEach((p, i) => {
    const w = new Float32Array(p.length);
    const pk = recs[i].spec.packing;
    unpackTexels(data[i], pk, pk[0], w, 0);
    out[p.name] = w;
  });
  return out;
}

// Model.getWeights: the weights; while the context is lost, those of the last snapshot. During a fit:
// those after the step that ran last.
function readWeights(s) {
  const named = (weights) => (MODEL.aliases ? withAliases(weights) : weights);
  return soon(s, async () => {
    if (!isLost(s)) {
      const recs = WEIGHTS_LISTED.map((p) => s.gpu.textures.get(p.texture));
      const data = await s.gpu.read(recs, undefined, false, 'call');
      if (data) return named(unpackParams(recs, data));
    }
    if (!s.snapshot) throw new TexelfitError('context-lost', 'the WebGL context is lost and no snapshot exists yet');
    const recs = WEIGHTS_LISTED.map((p) => s.gpu.textures.get(p.texture));
    return named(unpackParams(recs, WEIGHTS_LISTED.map((p) => s.snapshot.data.get(p.texture))));
  });
}

// Model.setWeights: replace some or all weights (keyed as getWeights; missing names keep their values).
function writeWeights(s, weights) {
  const staged = [];
  return serial(s, async () => {
    requireContext(s, 'set weights');
    for (const [p, v] of staged) uploadParam(s, p, v, 0);
    await resnapshot(s);
  }, () => {
    if (!OPTION_TYPES.object.ok(weights)) {
      throw new TexelfitError('bad-weights', `setWeights needs an object of weights keyed by name, got ${describe(weights)}`);
    }
    const byName = new Map(WEIGHTS_LISTED.map((p) => [p.name, p]));
    for (const [name, value] of Object.entries(weights)) {
      const p = byName.get(MODEL.aliases?.[name] ?? name);
      if (!p) throw new TexelfitError('unknown-weight', `"${name}" is not a weight of this model (it has ${[...byName.keys()].join(', ')})`);
      const v = toFloat32(value, `weights["${name}"]`);
      if (v.length !== p.length) {
        throw new TexelfitError('bad-weight-shape', `weights["${name}"] has ${v.length} values, expected ${p.length} (shape [${p.shape}])`);
      }
      checkFinite(v, `weights["${name}"]`);
      staged.push([p, v]);
    }
  });
}

// Upload a weight (the state_dict layout, from `offset` of `src`) into its texture; returns the
// texel data uploaded.
function uploadParam(s, p, src, offset) {
  const rec = s.gpu.textures.get(p.texture);
  const data = new Float32Array(rec.spec.width * 4 * rec.spec.height);
  packTexels(src, offset, rec.spec.packing, rec.spec.packing[0], data);
  s.gpu.upload(rec, data, rec.spec.height);
  return data;
}

// At creation: the decoded weights go up, and are also the first snapshot, as they are (the optimizer
// state is zero): no readback.
function loadInitialWeights(s, flat) {
  const snap = { fitStep: 0, optStep: 0, optimizer: null, buffered: false, data: new Map() };
  for (const rec of stateRecs(s)) snap.data.set(rec.spec.name, new Float32Array(rec.spec.width * 4 * rec.spec.height));
  for (const p of MODEL.params) snap.data.set(p.texture, uploadParam(s, p, flat, p.offset));
  commitSnapshot(s, snap);
  s.stateIs = snap;
}

// ---- saved progress (checkpoint.js: IndexedDB) -----------------------------------------------------
// Model.save: weights, optimizer state and step count under `key`.
function saveCheckpoint(s, key) {
  return soon(s, async () => {
    let snap = isLost(s) ? s.snapshot : await takeSnapshot(s, 0);
    if (!snap) snap = s.snapshot;
    if (!snap) throw new TexelfitError('context-lost', 'the WebGL context is lost and no snapshot exists yet');
    const tensors = {};
    for (const [name, data] of snap.data) tensors[name] = data;
    await writeCheckpoint(key, {
      format: CHECKPOINT_FORMAT, model: MODEL.name, fingerprint: MODEL.fingerprint, savedAt: Date.now(),
      optimizer: snap.optimizer, step: snap.optStep, buffered: snap.buffered, tensors,
    });
  }, () => checkKey(key, 'save'));
}

// Model.restore: load what save(key) stored; refused for a checkpoint of another architecture.
function restoreCheckpoint(s, key) {
  return serial(s, async () => {
    const rec = await readCheckpoint(key);
    if (!rec || rec.format !== CHECKPOINT_FORMAT) {
      throw new TexelfitError('bad-checkpoint', `the checkpoint "${key}" is not a texelfit checkpoint`);
    }
    if (rec.fingerprint !== MODEL.fingerprint) {
      throw new TexelfitError('architecture-mismatch',
        `the checkpoint "${key}" was saved by a model of another architecture (${rec.model}); this model is ${MODEL.name}`);
    }
    requireContext(s, 'restore a checkpoint');
    const data = new Map(Object.entries(rec.tensors));
    for (const r of stateRecs(s)) {
      const d = data.get(r.spec.name);
      if (!d || d.length !== r.spec.width * r.spec.height * 4) {
        throw new TexelfitError('bad-checkpoint', `the checkpoint "${key}" lacks a valid "${r.spec.name}"`);
      }
    }
    loadSnapshot(s, { fitStep: 0, optStep: rec.step, optimizer: rec.optimizer, buffered: rec.buffered, data });
    await resnapshot(s);
  }, () => checkKey(key, 'restore'));
}

function checkKey(key, what) {
  if (typeof key !== 'string' || !key) throw new TexelfitError('bad-key', `${what}(key) needs a non-empty string key, got ${describe(key)}`);
}
