// ---- the public API: createModel and the model object ------------------------------------------
// The Model's methods are the API. What they do lives in modules by concern, as functions of the model's
// state `s` (modelState below), which the class holds privately and hands to them:
//   lifecycle.js   the call queue, pause/resume, hidden tabs, lost contexts, dispose
//   snapshots.js   weights and optimizer state read back, and loaded again
//   batches.js     x and y uploaded as a batch (x checked by inputs_single.js or inputs_multi.js)
//   optimizer.js   the optimizer's state, uniforms and passes
//   fit.js         the training loop
//   trunk.js       the frozen trunk's cache and features (only where MODEL.trunk)
//   predict.js     predict and gradients
//   weights_api.js getWeights, setWeights and the checkpoints (save, restore, ...)
// Where a bundle lacks a feature its method rejects (no_images.js; features where MODEL.trunk is null),
// or the method is not there (fromText, which only a bundle whose input is one sequence has: addMethods).

let stateOf = null; // model -> its state, for the methods addMethods adds (set by the class, which keeps it private)

class Model {
  #s; // the state (modelState) every module's functions take
  static {
    stateOf = (m) => m.#s;
  }

  constructor(gl, canvas, caps, gpu, options, ownsContext) {
    const s = this.#s = modelState(gl, canvas, caps, gpu, options, ownsContext);
    this.info = Object.freeze({
      name: MODEL.name,
      inputShape: MODEL.inputShape.slice(),
      outputShape: MODEL.outputShape.slice(),
      maxBatch: MODEL.maxBatch,
      backend: gpu.backend,
      fallbackReason: gpu.fallbackReason, // why createModel() did not choose the first backend it tries, or null
      precision: gpu.precision,
      parameters: MODEL.parameters,
      maxTextureSize: caps.textureLimit,
      // those folded past the size limit (not a blocked part folded on every device: blocking.blocked_fold)
      foldedTextures: [...gpu.textures.values()].filter((r) => r.tiled && !r.spec.fold).length,
      loss: MODEL.defaultLoss,
      // {name, shape, loss (fit's default)} of each output (outputs_multi.js)
      outputs: Object.freeze(OUTPUTS.map((o) => Object.freeze({ name: o.name, shape: o.shape.slice(), loss: o.loss }))),
      trainable: Object.freeze(MODEL.trainable.slice()), // the parameters that train (build --trainable)
      trunk: MODEL.trunk ? MODEL.trunk.tensor : null, // the frozen trunk's output tensor, cached by fit
      image: MODEL.image && Object.freeze(MODEL.image), // fromImages' preprocessing (MODEL.image), or null
      ...inputInfo(), // its inputs (inputs_multi.js), or its token ids' dtype and range (inputs_single.js)
    });
    listen(s);
  }

  // 'idle' | 'training' | 'paused' | 'lost'
  get state() {
    return this.#s.state;
  }

  pause() {
    const s = this.#s;
    s.userPaused = true;
    if (s.state === 'training') s.state = 'paused';
  }

  resume() {
    this.#s.userPaused = false;
    notify(this.#s);
  }

  // Every call checks its arguments at once (a bad one rejects before anything waits or runs).

  // The model's input for an array of image sources (build --input-normalize): Float32Array, NCHW.
  // predict, fit and features take such an array in place of x (predict's batch is then its length).
  // images.js; without an image input (no_images.js) it rejects.
  fromImages(sources) {
    return imagesInput(this.#s, sources);
  }

  // Any number of samples: more than maxBatch run as several batches (the same result).
  predict(x, batch) {
    return predictSamples(this.#s, x, batch);
  }

  fit(x, y, options) {
    return fitSamples(this.#s, x, y, options);
  }

  // The frozen trunk's output (MODEL.trunk: info.trunk) for a batch, in PyTorch's order: a page can
  // keep the features of its own examples.
  features(x, batch) {
    if (MODEL.trunk) return trunkFeatures(this.#s, x, batch);
    return serial(this.#s, async () => {
      throw new TexelfitError('no-trunk', 'this bundle has no frozen trunk (info.trunk is null): its first trainable layer reads the input, or nothing trains');
    });
  }

  // Gradients of the mean loss over all samples of x with respect to every trainable parameter, without
  // changing anything: { [name]: Float32Array } in the same layout as getWeights. More samples
  // than maxBatch are run as batches, their gradients summed with each batch's share as weight.
  gradients(x, y, options) {
    return computeGradients(this.#s, x, y, options);
  }

  // The weights; while the context is lost, those of the last snapshot. During a fit: those after
  // the step that ran last.
  getWeights() {
    return readWeights(this.#s);
  }

  // Replace some or all weights (keyed as getWeights; missing names keep their values).
  setWeights(weights) {
    return writeWeights(this.#s, weights);
  }

  // Forget the optimizer's state (moments, momentum buffers, step count).
  resetOptimizer() {
    const s = this.#s;
    return serial(s, async () => { s.optimizer = { type: null, step: 0, buffered: false }; });
  }

  // Join the federation that `texelfit federate` serves at `url` (runtime/federate.js).
  federate(url, options) {
    return joinFederation(this, url, options);
  }

  // Save weights, optimizer state and step count under `key` in IndexedDB.
  save(key) {
    return saveCheckpoint(this.#s, key);
  }

  // Load what save(key) stored; refused for a checkpoint of another architecture.
  restore(key) {
    return restoreCheckpoint(this.#s, key);
  }

  // The keys of this model's checkpoints (this architecture's), sorted.
  listCheckpoints() {
    return listCheckpointKeys();
  }

  // Delete this model's checkpoint `key`; resolves to whether there was one.
  deleteCheckpoint(key) {
    try {
      checkKey(key, 'deleteCheckpoint');
    } catch (e) {
      return Promise.reject(e);
    }
    return deleteCheckpointKey(key);
  }

  // Stops a running fit (it rejects with `disposed`) and every call not yet run; frees every GL
  // object and, when the model made its own canvas, the WebGL context (browsers keep a few only).
  dispose() {
    disposeModel(this.#s);
  }

  // internal: used at creation (weights_api.js)
  _loadInitialWeights(flat) {
    loadInitialWeights(this.#s, flat);
  }
}

// Add methods to Model as its class body would (not enumerable): a feature's, which only the bundles that
// have it render (tokenizer.js, no_tokenizer.js: fromText). They reach the state by stateOf.
function addMethods(methods) {
  for (const [name, value] of Object.entries(methods)) Object.defineProperty(Model.prototype, name, { value, writable: true, configurable: true });
}

// A new model's state: its device, the call queue, the lifecycle, the fit's and the snapshots'.
function modelState(gl, canvas, caps, gpu, options, ownsContext) {
  const stage = (name) => {
    const spec = gpu.textures.get(name).spec;
    return new Float32Array(spec.width * spec.height * 4);
  };
  return {
    gl, canvas, caps, gpu, options, ownsContext, queue: Promise.resolve(),
    disposed: false, released: false, busy: false, optimizer: { type: null, step: 0, buffered: false },
    stage: INPUTS.map((i) => stage(i.texture)), // the staging rows of each input's uploads (INPUTS' order)
    // the staging rows of each output's labels and targets (outputs_multi.js: lossTexture)
    lossStages: OUTPUTS.map((o, k) => ({ labels: stage(lossTexture('labels', k)), targets: stage(lossTexture('targets', k)) })),
    // texture name -> whether a sample packs as a plain copy (isPlainPacking)
    plain: new Map([...INPUTS.map((i) => [i.texture, i.size]), ...OUTPUTS.map((o, k) => [lossTexture('targets', k), o.size])].map(([name, size]) => {
      const spec = gpu.textures.get(name).spec;
      return [name, isPlainPacking(spec.packing, spec.sampleRows, size)];
    })),
    // lifecycle (lifecycle.js): state is 'idle' | 'training' | 'paused' | 'lost'
    state: 'idle', userPaused: false, hidden: false, lost: false, generation: 0, wake: null, listeners: [],
    // while a fit runs (or is paused), the calls that only read (predict, getWeights, save) wait in
    // `between` for the next gap between two steps instead of behind the fit: [{ fn, resolve, reject }]
    fitting: false, between: [],
    // snapshots: the latest one read back, and the latest one whose next loss was finite
    snapshot: null, confirmed: null,
    // the snapshot whose data the GPU holds now (weights and optimizer state), or null when unknown:
    // a fit starting from it needs no readback
    stateIs: null,
    trunkStage: null, // staging rows of the cached trunk's uploads (fit, trunk.js)
  };
}

// What an out-of-memory rejection says: the planned bytes (MODEL.memory, codegen/memory.py) and the largest tensor.
function memoryNote() {
  const [peak, name, bytes] = MODEL.memory;
  return `the model plans ${peak} bytes at maxBatch ${MODEL.maxBatch}; its largest tensor is "${name}" (${bytes} bytes)`;
}

// options.backend: 'webgl2', 'cpu', 'webgpu' (a bundle built with --webgpu: webgpu.js), or undefined: WebGPU where
// the bundle has its WGSL, no WebGL2-only option is given (canvas, maxTextureSize, maxDrawBuffers, a precision other
// than float32) and the device can run it, else WebGL2 where a context can be had, else the CPU; m.info.fallbackReason
// says why not the first.
export async function createModel(opts) {
  const options = checkOptions(opts, CREATE_MODEL_OPTIONS, 'createModel options');
  const backend = options.backend;
  if (options.canvas && (backend === 'cpu' || backend === 'webgpu')) {
    throw new TexelfitError('bad-option', `createModel options.canvas is for the webgl2 backend; the ${backend} backend draws nothing`);
  }
  if (options.memoryBudget < MODEL.memory[0]) { // (on every backend, before anything is allocated)
    throw new TexelfitError('out-of-memory', `${memoryNote()}: more than memoryBudget, ${options.memoryBudget}; build it with a smaller --max-batch`);
  }
  const weights = decodeWeights(...(await weightBytes(options.weights))); // first: corrupted weights fail before anything is built
  await nextTask(); // (each step here takes milliseconds: the page runs between them)
  let device = null, why = null;
  const webgpuFirst = MODEL.webgpu && !options.canvas && options.maxTextureSize === undefined &&
    options.maxDrawBuffers === undefined && (options.precision ?? 'float32') === 'float32';
  if (backend === 'webgpu' || (backend === undefined && webgpuFirst)) {
    try {
      device = await webgpuDevice(options);
    } catch (e) {
      if (backend || e.code !== 'no-webgpu') throw e;
      why = `not webgpu: ${e.message.replace('texelfit: ', '')}`;
    }
  }
  const webgl = device || backend === 'cpu' ? null : openWebgl2(options, backend === 'webgl2');
  await nextTask();
  let model;
  if (webgl) {
    let gpu;
    try {
      gpu = await GpuDevice.create(webgl.gl, webgl.caps);
    } catch (e) {
      if (!options.canvas) releaseContext(webgl.gl);
      throw e;
    }
    gpu.fallbackReason = why;
    model = new Model(webgl.gl, webgl.canvas, webgl.caps, gpu, options, !options.canvas);
  } else {
    device = device ?? await CpuDevice.create(options);
    if (!backend && device.backend === 'cpu') why = `${why ? why + '; ' : ''}not webgl2: no WebGL2 context here`;
    device.fallbackReason = why;
    model = new Model(null, null, device.caps, device, options, false);
  }
  model._loadInitialWeights(weights);
  return model;
}

// The canvas, WebGL2 context and capabilities; null when they cannot be had and `required` is false.
// A canvas given in the options is always required: one that gives no WebGL2 context (it has a 2-D
// context already, say) rejects rather than training silently on the CPU.
function openWebgl2(options, required) {
  let gl = null;
  try {
    const canvas = options.canvas ?? (typeof OffscreenCanvas !== 'undefined' ? new OffscreenCanvas(1, 1)
      : typeof document !== 'undefined' ? document.createElement('canvas') : null);
    if (!canvas) throw new TexelfitError('no-webgl2', 'WebGL2 is not available (no canvas can be made here)');
    gl = getContext(canvas, !!options.canvas);
    return { canvas, gl, caps: probe(gl, options) };
  } catch (e) {
    if (gl && !options.canvas) releaseContext(gl);
    if (!required && !options.canvas && e instanceof TexelfitError && e.code === 'no-webgl2') return null;
    throw e;
  }
}

// Give back a context this runtime made (Chromium keeps at most 16 alive and then loses the oldest).
function releaseContext(gl) {
  const ext = gl.isContextLost() ? null : gl.getExtension('WEBGL_lose_context');
  if (ext) ext.loseContext();
}

export const modelInfo = Object.freeze({
  name: MODEL.name, inputShape: MODEL.inputShape, outputShape: MODEL.outputShape, maxBatch: MODEL.maxBatch,
  parameters: MODEL.parameters, weights: WEIGHTS_LISTED.map((p) => ({ name: p.name, shape: p.shape })),
  outputs: MODEL.outputs.map((o) => ({ name: o.name, shape: o.shape })),
  ...(MODEL.inputs ? { inputs: MODEL.inputs.map((i) => ({ name: i.name, shape: i.shape, dtype: i.dtype })) } : {}),
});

// The channel-packed layout as implemented here, for tests that pin it to codegen/webgl2/layout.py.
export const layout = Object.freeze({ packTexels, unpackTexels });
