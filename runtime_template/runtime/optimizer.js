// ---- a model's optimizer: its state textures, a step's uniforms, the passes of one fit --------------
// Functions of a model's state `s` (model.js: modelState).

// State persists across fit calls while the optimizer type stays the same (like one torch
// optimizer used for several loops); a new type, or resetOptimizer(), starts from zero.
function useOptimizer(s, type) {
  if (s.optimizer.type === type) return;
  const data = s.stateIs ? new Map(s.stateIs.data) : null; // the state after this, if known
  for (const [param, rec] of statePairs(s)) {
    s.gpu.clear(rec);
    rec.cur = param.cur; // a parameter and its state swap together (but see alignState)
    if (data) data.set(rec.spec.name, new Float32Array(rec.spec.width * 4 * rec.spec.height));
  }
  s.optimizer = { type, step: 0, buffered: false };
  s.stateIs = data && { fitStep: 0, optStep: 0, optimizer: type, buffered: false, data };
}

// sgd0 swaps the parameters alone, so after it a parameter's state may be current in the other
// half: the passes writing both draw into the halves the parameter's parity picks (runner.js). The
// state moves back there from `snap`, which holds it.
function alignState(s, snap) {
  for (const [param, rec] of statePairs(s)) {
    if (rec.cur === param.cur) continue;
    rec.cur = param.cur;
    s.gpu.upload(rec, snap.data.get(rec.spec.name), rec.spec.height);
  }
}

// [parameter texture, one of its optimizer state textures (m:, v:)] for every such pair
function statePairs(s) {
  const t = s.gpu.textures;
  return MODEL.params.filter((p) => p.trainable)
    .flatMap((p) => ['m:', 'v:'].map((prefix) => [t.get(p.texture), t.get(prefix + p.name)]));
}

function setStepUniforms(s, opt) {
  const u = s.gpu.runner.uniforms;
  const t = s.optimizer.step + 1;
  u.u_lr = opt.lr;
  u.u_wd = opt.weightDecay;
  if (opt.type === 'sgd') {
    u.u_momentum = opt.momentum;
    u.u_dampening = opt.dampening;
    u.u_nesterov = opt.nesterov ? 1 : 0;
    u.u_first = s.optimizer.buffered ? 0 : 1; // torch: the buffer is the gradient at its first momentum step
  } else {
    const [b1, b2] = opt.betas;
    u.u_beta1 = b1;
    u.u_beta2 = b2;
    u.u_eps = opt.eps;
    u.u_decoupled = opt.type === 'adamw' ? 1 : 0;
    u.u_step_size = opt.lr / (1 - Math.pow(b1, t));
    u.u_bc2_sqrt = Math.sqrt(1 - Math.pow(b2, t));
  }
}

// ---- transfer learning: the parameters one fit trains -----------------------------------------
// The optimizer passes and swaps of `kernel` for the parameters `only` (null: all the bundle
// trains), made once per runner (a restored context has a new one): the others keep their weights
// and state. With `anchors` (texel data by texture name: the weights the fit started from), each
// pass reads its parameter's from a texture of its own as the proximal term's P0, where the
// schedule binds the parameter itself (ops/optim.py: P0, P and the states are the pass's last inputs).
function optimizerOf(s, runner, kernel, only, anchors = null) {
  const memo = runner.fitSubset;
  if (memo && memo.only === only && memo.kernel === kernel && memo.anchors === anchors) return memo;
  dropAnchors(s, runner);
  // an optimizer pass is labelled by its parameter; a swapped texture is named prefix:parameter
  let passes = only ? runner.optimizer[kernel].filter((p) => only.has(p.label)) : runner.optimizer[kernel];
  const swaps = only ? runner.swaps[kernel].filter((rec) => only.has(rec.spec.name.slice(rec.spec.name.indexOf(':') + 1)))
    : runner.swaps[kernel];
  const made = new Map(); // parameter record -> its anchor's
  if (anchors) {
    const at = (p) => p.inputs.length - { sgd0: 2, sgd: 3, adam: 4 }[kernel];
    passes = passes.map((p) => {
      const param = p.inputs[at(p) + 1], inputs = p.inputs.slice();
      if (!made.has(param)) made.set(param, s.gpu.anchor(param, anchors.get(param.spec.name)));
      inputs[at(p)] = made.get(param);
      return runner.variant(p, inputs, '#define PROXIMAL 1\n');
    });
  }
  return (runner.fitSubset = { only, kernel, anchors, made, passes, swaps });
}

function dropAnchors(s, runner) {
  const memo = runner.fitSubset;
  if (!memo?.made.size) return;
  for (const a of memo.made.values()) s.gpu.release(a);
  runner.fitSubset = null;
}
