// ---- snapshots: a model's weights and optimizer state read back, and loaded again -------------------
// Functions of a model's state `s` (model.js: modelState). A snapshot is { fitStep, optStep, optimizer,
// buffered, data: texture name -> texel data }.

function stateRecs(s, fit = false) {
  return stateTextureNames(fit).map((n) => s.gpu.textures.get(n));
}

// Read weights and optimizer state back (asynchronously); null if the context was lost.
async function takeSnapshot(s, fitStep, check = !s.fitting) {
  const { step: optStep, type: optimizer, buffered } = s.optimizer;
  const recs = stateRecs(s);
  // a GL error rejects (no snapshot of garbage), but not by default during a fit (save between two
  // steps): the fit's next block readback must find it, to roll back
  const data = await s.gpu.read(recs, undefined, false, 'call', check);
  if (!data) return null;
  const snap = { fitStep, optStep, optimizer, buffered, data: new Map() };
  recs.forEach((rec, i) => snap.data.set(rec.spec.name, data[i]));
  return snap;
}

function loadSnapshot(s, snap) {
  for (const rec of stateRecs(s)) {
    rec.cur = 0;
    s.gpu.upload(rec, snap.data.get(rec.spec.name), rec.spec.height);
  }
  // (a checkpoint older than `buffered`: SGD's momentum ran from its first step, if at all)
  s.optimizer = { type: snap.optimizer, step: snap.optStep, buffered: snap.buffered ?? snap.optStep > 0 };
  s.stateIs = snap;
}

function commitSnapshot(s, snap) {
  s.snapshot = snap;
  s.confirmed = snap;
}

// A fresh snapshot of the current state outside training (after setWeights, restore, ...).
async function resnapshot(s) {
  const snap = await takeSnapshot(s, 0);
  if (snap) commitSnapshot(s, snap);
  s.stateIs = snap;
}
