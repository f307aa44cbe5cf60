// ---- options: one declarative schema per options object, checked by one function ---------------
// A schema maps each key to a type below; checkOptions rejects unknown keys (naming the nearest
// valid one), values of the wrong type (never coerced) and non-objects, all with code `bad-option`.
// An undefined value is the same as an absent key (the default applies). Adding an option is one
// line in its table.

const OPTION_TYPES = {
  boolean: { what: 'a boolean (true or false)', ok: (v) => typeof v === 'boolean' },
  positiveInteger: { what: 'a positive integer', ok: (v) => Number.isInteger(v) && v >= 1 },
  uint32: { what: 'an integer from 0 to 2^32 - 1', ok: (v) => Number.isInteger(v) && v >= 0 && v < 2 ** 32 },
  nonNegative: { what: 'a finite number >= 0', ok: (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0 },
  function: { what: 'a function', ok: (v) => typeof v === 'function' },
  object: { what: 'an object', ok: (v) => typeof v === 'object' && v !== null && !Array.isArray(v) },
  strings: { what: 'a non-empty array of strings', ok: (v) => Array.isArray(v) && v.length > 0 && v.every((s) => typeof s === 'string') },
  // an HTMLCanvasElement or an OffscreenCanvas (duck-typed: both have getContext and the canvas events)
  canvas: {
    what: 'an HTMLCanvasElement or an OffscreenCanvas',
    ok: (v) => typeof v === 'object' && v !== null && typeof v.getContext === 'function' && typeof v.addEventListener === 'function'
      && typeof v.width === 'number',
  },
};
const oneOf = (...values) => ({ what: `one of ${values.map((v) => JSON.stringify(v)).join(', ')}`, ok: (v) => values.includes(v) });
const atLeast = (min) => ({ what: `an integer of at least ${min}`, ok: (v) => Number.isInteger(v) && v >= min });
const betasType = {
  what: 'two numbers in [0, 1)',
  ok: (v) => Array.isArray(v) && v.length === 2 && v.every((b) => typeof b === 'number' && b >= 0 && b < 1),
};

const CREATE_MODEL_OPTIONS = {
  canvas: OPTION_TYPES.canvas,
  maxTextureSize: atLeast(4),
  maxDrawBuffers: OPTION_TYPES.positiveInteger,
  backend: oneOf('webgl2', 'cpu', 'webgpu'),
  precision: oneOf('float32', 'float16', 'rgba8'),
  contextRestoreTimeout: OPTION_TYPES.nonNegative,
  weights: { what: 'an ArrayBuffer or a URL', ok: (v) => v instanceof ArrayBuffer || v instanceof URL },
  memoryBudget: OPTION_TYPES.positiveInteger, // bytes: more planned (MODEL.memory) rejects with out-of-memory
};
// fit's and gradients' loss: one of the output's kinds; with several outputs, a kind for all of them or an object
// of kinds keyed by output name (outputs_multi.js: resolveLosses checks each)
const LOSS_OPTION = SCHEDULE.loss.length === 1 ? oneOf(...Object.keys(SCHEDULE.loss[0]))
  : { what: 'a loss name or an object of them keyed by output name', ok: (v) => typeof v === 'string' || OPTION_TYPES.object.ok(v) };
const FIT_OPTIONS = {
  batchSize: OPTION_TYPES.positiveInteger,
  epochs: OPTION_TYPES.positiveInteger,
  shuffle: OPTION_TYPES.boolean,
  seed: OPTION_TYPES.uint32,
  loss: LOSS_OPTION,
  lossWeights: OPTION_TYPES.object, // a model with several outputs: each output's weight (outputs_multi.js: resolveLosses)
  optimizer: OPTION_TYPES.object, // checked by OPTIMIZER_OPTIONS of its type
  onStep: OPTION_TYPES.function,
  trainable: OPTION_TYPES.strings, // names or fnmatch patterns of parameters the bundle trains (resolveTrainable)
  cacheTrunk: OPTION_TYPES.boolean,
  dropout: OPTION_TYPES.boolean, // apply the dropout layers in the training steps (prep/dropout.py)
  proximal: OPTION_TYPES.object, // checked by PROXIMAL_OPTIONS
};
// fit's proximal term, mu / 2 * ||w - w_start||^2 over the parameters it trains (FedProx's; ops/optim.py)
const PROXIMAL_OPTIONS = { mu: OPTION_TYPES.nonNegative };
const GRADIENTS_OPTIONS = {
  loss: LOSS_OPTION,
  lossWeights: OPTION_TYPES.object,
};
const OPTIMIZER_TYPE = oneOf('sgd', 'adam', 'adamw');
const OPTIMIZER_OPTIONS = {
  sgd: {
    type: OPTIMIZER_TYPE, lr: OPTION_TYPES.nonNegative, momentum: OPTION_TYPES.nonNegative,
    dampening: OPTION_TYPES.nonNegative, nesterov: OPTION_TYPES.boolean, weightDecay: OPTION_TYPES.nonNegative,
  },
  adam: {
    type: OPTIMIZER_TYPE, lr: OPTION_TYPES.nonNegative, betas: betasType, eps: OPTION_TYPES.nonNegative,
    weightDecay: OPTION_TYPES.nonNegative,
  },
};
OPTIMIZER_OPTIONS.adamw = OPTIMIZER_OPTIONS.adam;

function editDistance(a, b) {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const same = a[i - 1].toLowerCase() === b[j - 1].toLowerCase();
      cur.push(Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)));
    }
    prev = cur;
  }
  return prev[b.length];
}

function nearest(key, keys) {
  let best = keys[0];
  for (const k of keys) if (editDistance(key, k) < editDistance(key, best)) best = k;
  return best;
}

function describe(v) {
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'function') return 'a function';
  if (v === null || typeof v !== 'object') return String(v);
  return Array.isArray(v) ? `[${v.map(describe).join(', ')}]` : Object.prototype.toString.call(v);
}

// Check `options` (undefined: no options) against `schema`; `what` names it in messages
// ("fit options", "optimizer"). Returns the options as an object.
function checkOptions(options, schema, what) {
  if (options === undefined) return {};
  if (!OPTION_TYPES.object.ok(options)) {
    throw new TexelfitError('bad-option', `${what} must be an object or undefined, got ${describe(options)}`);
  }
  const keys = Object.keys(schema);
  for (const [key, value] of Object.entries(options)) {
    const type = schema[key];
    if (!Object.prototype.hasOwnProperty.call(schema, key)) {
      throw new TexelfitError('bad-option',
        `${what} has no option "${key}" (did you mean "${nearest(key, keys)}"? the options are ${keys.join(', ')})`);
    }
    if (value !== undefined && !type.ok(value)) {
      throw new TexelfitError('bad-option', `${what}.${key} must be ${type.what}, got ${describe(value)}`);
    }
  }
  return options;
}
