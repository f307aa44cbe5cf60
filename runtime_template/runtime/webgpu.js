// ---- the WebGPU backend: the same textures, schedule and passes, as WGSL compute shaders ---------
// createModel({ backend: 'webgpu' }) on a bundle built with --webgpu; above the device interface (gpu.js) all is
// shared with WebGL2 and the CPU backend. Here:
//   * a texture is a storage buffer of width x height vec4<f32> texels in the same channel-packed layout, row-major,
//     never folded (double-buffered: two, read at `cur`, written at 1 - cur; one storage of codegen/memory.py: one
//     buffer, the largest of its textures);
//   * a pass that runs here (webgpuRuns) dispatches its kernel's WGSL (WGSL[kernel.wgsl[0]], codegen/kl_wgsl.py) as
//     the CPU backend calls its function: an invocation a texel, or `scatter` rows of it (a vectorised kernel,
//     Kernel.wgsl_kl), partial sums then their sum (kernel.split), an optimizer's gradient into a scratch buffer
//     then its update (cpu.js: cpuOptimizer), a column-blocked forward whole rows dealt out into its parts
//     (cpu_columns.js) or, for a tensor kept as parts alone, kept whole (#whole);
//   * a dispatch has a uniform buffer of its own (the struct _d: rows, width, the inputs' widths, the kernel's uniforms),
//     written when a value changed, its WGSL's arrays sized to the buffers it binds and workgroups to its invocations
//     (#stage); a run() is one command buffer; reads copy into a mappable buffer kept for their slot, and mapAsync.

// Whether pass p runs here: a sample-blocked pass's one-sample twin, a column-blocked forward's draw into all its parts,
// a pass of WebGPU's alone (p.webgpu true: a split-K or column-blocked forward as one) not those it replaces (false).
function webgpuRuns(p) { return p.blocked !== true && p.wide !== false && p.webgpu !== false; }

// Workgroups of `size` covering rows x width invocations: (x, y), at most 65,535 a side (kl_wgsl.py: dispatch).
function wgslGrid(rows, width, size) { const n = Math.ceil((rows * width) / size), y = Math.ceil(n / 65535); return [Math.ceil(n / y), y]; }
// The workgroup size of a dispatch of at most n invocations: WGSL_WORKGROUP, halved (to 4 at least) while that leaves
// under 16 workgroups: SwiftShader runs a workgroup on one thread (the MLP's forward at batch 64: 2 of 64 3.27 ms, 16 of 8
// 2.83; bench/fetch_micro.py).
function workgroupOf(n) { let size = WGSL_WORKGROUP; while (size > 4 && n < size * 16) size /= 2; return size; }

// Every pass of the schedule that runs here.
function webgpuPasses() {
  return [SCHEDULE.forward, SCHEDULE.backward, ...SCHEDULE.loss.flatMap((kinds) => Object.values(kinds)),
    ...Object.values(SCHEDULE.optimizer)].flat().filter(webgpuRuns);
}

// The bytes of the scratch buffers, one of each kind that every pass shares (they run one after another): g an
// optimizer's gradient (the largest parameter's), y a column-blocked conv's whole rows, x its input's interleaved,
// p a split weight gradient's partial sums.
function webgpuScratchBytes() {
  const bytes = { g: 16, x: 16, y: 16, p: 16 }, grow = (kind, b) => { bytes[kind] = Math.max(bytes[kind], b); };
  for (const p of webgpuPasses()) {
    const k = KERNELS[p.kernel], c = k.consts, out = TEXTURES[p.outputs[0]];
    const P = k.gradient && TEXTURES[p.inputs[k.gradient.inputs + 1]]; // (an optimizer's parameter)
    if (P) grow('g', P.width * P.height * 16);
    const split = (k.gradient ?? k).split, T = P ?? out;
    if (split) grow('p', T.width * T.height * split[0] * 16);
    if (c.colblock) grow('y', c.ow * c.oc4 * out.height * 16);
    if (c.colin) grow('x', c.iw * c.ic4 * (out.height / c.oh) * c.ih * 16);
  }
  return bytes;
}

// The limits the model needs: the most storage buffers a dispatch that runs here binds (not a blocked twin's),
// and the largest buffer (a storage of codegen/memory.py is its largest texture; a scratch buffer).
function webgpuNeeds() {
  let buffers = 0, bytes = Math.max(...Object.values(webgpuScratchBytes()));
  const binds = (w) => (w ? w[1].filter(([name]) => name.startsWith('w_')).length + w[2] : 0);
  for (const p of webgpuPasses()) {
    const k = KERNELS[p.kernel];
    buffers = Math.max(buffers, binds(k.wgsl), binds(k.gradient?.wgsl), binds(k.colin));
  }
  for (const spec of TEXTURES) bytes = Math.max(bytes, spec.width * spec.height * 16);
  return { maxStorageBuffersPerShaderStage: buffers, maxStorageBufferBindingSize: bytes, maxBufferSize: bytes };
}
const WEBGPU_DEFAULT_LIMITS = { maxStorageBuffersPerShaderStage: 8, maxStorageBufferBindingSize: 134217728, maxBufferSize: 268435456 };

// The pass runner: the interface of Runner (runner.js) over storage buffers.
class WebGpuRunner {
  constructor(device, textures) {
    this.device = device;
    this.textures = textures;
    this.pipelines = new Map(); // WGSL index and the texels it binds -> compute pipeline
    // the scratch buffers (webgpuScratchBytes), made with the textures: a device that cannot hold them fails createModel
    this.scratch = Object.fromEntries(Object.entries(webgpuScratchBytes()).map(([kind, size]) =>
      [kind, device.createBuffer({ size, usage: GPUBufferUsage.STORAGE })]));
    this.uniformBuffers = [];
    loadSchedule(this, textures);
  }

  resolve(p, inputs, outputs) {
    const kernel = KERNELS[p.kernel], out = outputs[0];
    return {
      kernel, inputs, outputs, rows: p.rows, label: p.label, values: p.values ?? null, stages: null,
      blocked: p.blocked ?? null, // a twin of a sample-blocked pass: the one-sample one runs here (webgpuRuns)
      wide: p.wide ?? null, // a draw of a column-blocked forward: the one into all its parts runs here
      webgpu: p.webgpu ?? null, // a pass of WebGPU's alone (true) or of the others' (false)
      height: out.spec.height, sampleRows: out.spec.sampleRows, out,
    };
  }

  variant(r, inputs) { return { ...r, inputs, stages: null }; } // (fit's proximal term: the WGSL reads u_mu, P0 always)

  // Its dispatches: the kernel's WGSL once; an optimizer's gradient then its update; a column-blocked forward's steps.
  #stages(r) {
    const k = r.kernel, g = k.gradient;
    if (!k.wgsl || (g && !g.wgsl) || k.consts.blocked) {
      throw new TexelfitError('webgpu-kernel', `kernel "${k.name}" (${r.label}) has no WGSL here: a WebGL2 routine's layout`);
    }
    if (k.consts.colblock) return this.#columnStages(r);
    if (!g) return this.#compute(k, r.inputs, r.outputs[0], r.outputs);
    const P = r.inputs[g.inputs + 1], G = this.#scratch('g', P.spec.width, P.spec.height);
    return [...this.#compute(g, r.inputs.slice(0, g.inputs), P, [G]),
      this.#stage(k.wgsl, [G, ...r.inputs.slice(g.inputs)], r.outputs)];
  }

  // The dispatches of kernel (or gradient) k reading `inputs` into `outputs`, the first of the shape of texture T: one;
  // where k computes `scatter` rows an invocation (a row-blocked matmul's, a conv's), over 1 / scatter of the rows,
  // rounded up; where it computes `split` partial sums (a conv's weight gradient), into scratch p (T's rows a part),
  // then their sum.
  #compute(k, inputs, T, outputs) {
    if (!k.split) return [this.#stage(k.wgsl, inputs, outputs, null, 1 / (k.scatter ?? 1), k.few)];
    const [parts, sum] = k.split, S = this.#scratch('p', T.spec.width, T.spec.height * parts);
    return [this.#stage(k.wgsl, inputs, [S], null, parts / (k.scatter ?? 1)), this.#stage(sum, [S], outputs)];
  }

  // A column-blocked conv forward, as cpuColumns computes it: an input of column parts (c.colin) interleaved into
  // whole rows first (interleave_cols), the generic kernel into whole rows, dealt out into the n parts (deal_cols);
  // neither for a tensor kept as parts alone, which WebGPU keeps whole instead (#whole).
  #columnStages(r) {
    const k = r.kernel, c = k.consts, b = c.colblock, n = b * c.halves.length;
    let inputs = r.inputs, X = c.colin && this.#whole(inputs[0], c.iw * c.ic4), stages = [];
    if (c.colin && !X) {
      X = this.#scratch('x', c.iw * c.ic4, (r.height / c.oh) * c.ih);
      stages.push(this.#stage(k.colin, inputs.slice(0, n), [X], { u_c4: c.ic4, u_qb: Math.ceil(c.iw / b) }, c.ih / c.oh));
    }
    if (c.colin) inputs = [X, ...inputs.slice(n)];
    const whole = this.#whole(r.outputs[0], c.ow * c.oc4), Y = whole ?? this.#scratch('y', c.ow * c.oc4, r.height);
    stages.push(this.#stage(k.wgsl, inputs, [Y], null, 1 / (k.scatter ?? 1)));
    for (let part = 0; !whole && part < n; part++) {
      stages.push(this.#stage(k.deal, [Y], [r.outputs[part]], { u_c4: c.oc4, u_qb: Math.ceil(c.ow / b), u_part: part, u_ow: c.ow }));
    }
    return stages;
  }

  // A tensor kept as column parts alone (blocking.column_only: no texture of the usual layout), as whole rows of
  // `width` texels: a record beside its part 0's (`part`), its buffer made with the first stage using it; else null.
  #whole(part, width) {
    const name = part.spec.name;
    if (!name.startsWith('col0:') || this.textures.has(name.slice(5))) return null;
    const height = part.spec.height;
    part.whole ??= { spec: { name: name.slice(5), width, height }, cur: 0, double: false,
      tex: [this.device.createBuffer({ size: width * height * 16, usage: GPUBufferUsage.STORAGE })] };
    return part.whole;
  }

  // Width x height texels of the scratch buffer of `kind`, as a texture record.
  #scratch(kind, width, height) { return { spec: { name: kind, width, height }, tex: [this.scratch[kind]], cur: 0, double: false }; }

  // A dispatch of WGSL[code] (a kernel's `wgsl`: [code, fields, outputs, cols texels an invocation where not 1: over 1 /
  // cols of the width]) reading `inputs` into `outputs`; `values`: uniforms it sets itself; `scale`: its rows per row the
  // pass draws (1 / 8, a row twin's); `few`: the dispatch run in its place below 1 / scale samples (Kernel.few).
  #stage([code, fields, , cols = 1], inputs, outputs, values = null, scale = 1, few = null, rows = outputs[0].spec.height) {
    // its arrays sized to the texels bound: a module for each sizes (robustness then bounds a load by a constant, where
    // a runtime-sized array's length is read from memory: the MLP's and CNN's WebGPU steps 14-17% faster on SwiftShader),
    // its workgroups to its invocations at most (`rows` of the output: workgroupOf)
    const texels = [...inputs, ...outputs].map((rec) => rec.spec.width * rec.spec.height);
    const size = workgroupOf(Math.ceil(rows * scale) * (outputs[0].spec.width / cols)), key = `${code}:${texels}:${size}`;
    let pipeline = this.pipelines.get(key);
    if (!pipeline) {
      const text = WGSL[code].split('array<vec4<f32>>').reduce((s, part, i) => `${s}array<vec4<f32>, ${texels[i - 1]}>${part}`)
        .replace(`@workgroup_size(${WGSL_WORKGROUP})`, `@workgroup_size(${size})`).replace(`_n.x * ${WGSL_WORKGROUP}u`, `_n.x * ${size}u`);
      const module = this.device.createShaderModule({ code: text });
      pipeline = this.device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' } });
      this.pipelines.set(key, pipeline);
    }
    const data = new ArrayBuffer(Math.max(16, Math.ceil(fields.length / 4) * 16));
    const buffer = this.device.createBuffer({ size: data.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    this.uniformBuffers.push(buffer);
    const widths = new Map(inputs.map((rec, i) => [i, rec.spec.width]));
    return {
      pipeline, inputs, outputs, buffer, groups: new Map(), written: false, values, scale,
      few: few && this.#stage(few, inputs, outputs, values, 1, null, (1 / scale - 1) * (outputs[0].spec.sampleRows ?? 1)), size,
      // each field: [is int, its value's name (a uniform) or null: set here (rows, width, an input's width)]
      fields: fields.map(([name, type], i) => [type === 'i32', name.startsWith('u_') ? name : null,
        name.startsWith('w_') ? widths.get(i - 2) : null]),
      data, ints: new Int32Array(data), floats: new Float32Array(data), width: outputs[0].spec.width, cols,
    };
  }

  // The bind group of the halves the stage reads and writes now (made once for each combination).
  #group(st) {
    const ins = st.inputs, outs = st.outputs, parity = outs[0].double ? outs[0].cur : 0;
    let key = parity;
    for (let i = 0; i < ins.length; i++) key = key * 2 + ins[i].cur;
    let group = st.groups.get(key);
    if (!group) {
      const bind = (rec, half) => ({ buffer: rec.tex[half], size: rec.spec.width * rec.spec.height * 16 });
      const entries = [...ins.map((rec) => bind(rec, rec.cur)), ...outs.map((rec) => bind(rec, rec.double ? 1 - parity : 0)),
        { buffer: st.buffer }].map((resource, binding) => ({ binding, resource }));
      group = this.device.createBindGroup({ layout: st.pipeline.getBindGroupLayout(0), entries });
      st.groups.set(key, group);
    }
    return group;
  }

  // The pipelines of the passes of `lists` that run here, made now: the forward's at
  // createModel, where a shader WebGPU refuses is reported (the WGSL compiles on the GPU's timeline).
  async prepare(lists) {
    for (const p of lists.flat()) {
      if (p.stages === null && webgpuRuns(p)) p.stages = this.#stages(p);
    }
  }

  run(passes) {
    const u = this.uniforms, device = this.device;
    const encoder = device.createCommandEncoder(), pass = encoder.beginComputePass();
    for (let i = 0; i < passes.length; i++) {
      const p = passes[i];
      if (!webgpuRuns(p)) continue; // the other twin runs
      if (p.stages === null) p.stages = this.#stages(p);
      const rows = p.rows === 'full' ? p.height : p.rows === 'ring' ? 1 : sampleRowsDrawn(p.rows, u.u_batch) * p.sampleRows;
      for (let st of p.stages) {
        if (st.few && u.u_batch * st.scale < 1) st = st.few;
        let changed = !st.written;
        const stRows = Math.ceil(rows * st.scale); // (a kernel of `scatter` rows an invocation guards the last block's)
        for (let f = 0; f < st.fields.length; f++) {
          const [isInt, name, width] = st.fields[f];
          const v = f === 0 ? stRows : f === 1 ? st.width : name === null ? width
            : st.values !== null && st.values[name] !== undefined ? st.values[name]
              : p.values !== null && p.values[name] !== undefined ? p.values[name] : u[name];
          const view = isInt ? st.ints : st.floats;
          if (view[f] !== Math.fround(v)) {
            view[f] = v;
            changed = true;
          }
        }
        if (changed) device.queue.writeBuffer(st.buffer, 0, st.data); // (ordered before this run's commands)
        st.written = true;
        pass.setPipeline(st.pipeline);
        pass.setBindGroup(0, this.#group(st));
        const [x, y] = p.rows === 'ring' ? [1, 1] : wgslGrid(stRows, st.width / st.cols, st.size);
        if (x > 0) pass.dispatchWorkgroups(x, y);
      }
    }
    pass.end();
    device.queue.submit([encoder.finish()]);
  }

  swap(optimizer) { for (const rec of this.swaps[optimizer]) rec.cur = 1 - rec.cur; }

  dispose() {
    for (const b of [...this.uniformBuffers, ...Object.values(this.scratch)]) b.destroy();
    this.uniformBuffers = [];
  }
}

// The WebGPU device: the interface of GpuDevice (gpu.js).
class WebGpuDevice {
  constructor(device, caps, textures) {
    this.device = device;
    this.caps = caps;
    this.textures = textures;
    this.runner = new WebGpuRunner(device, textures);
    this.backend = 'webgpu';
    this.precision = 'float32';
    this.readBuffers = new Map(); // slot -> the mappable buffer its reads copy into (grown when a read is larger)
    this.isLost = false;
    this.failure = null; // the first error WebGPU reported (a read with `check` rejects with it)
    device.lost.then(() => { this.isLost = true; });
    device.addEventListener('uncapturederror', (e) => { this.failure = this.failure ?? e.error; e.preventDefault(); });
  }

  // `options` as createModel's. Rejects with no-webgpu (saying why) where WebGPU, an adapter or the limits the
  // model needs are missing; the precision is float32.
  static async create(options = {}) {
    if (options.precision !== undefined && options.precision !== 'float32') {
      throw new TexelfitError('unsupported-precision', `precision "${options.precision}": the webgpu backend computes in float32 only`);
    }
    const gpu = typeof navigator !== 'undefined' ? navigator.gpu : undefined;
    const adapter = gpu && await gpu.requestAdapter();
    if (!adapter) throw new TexelfitError('no-webgpu', gpu ? 'WebGPU gives no adapter here' : 'WebGPU is not available here (no navigator.gpu)');
    const needs = webgpuNeeds(), requiredLimits = {};
    for (const [name, need] of Object.entries(needs)) {
      if (need > adapter.limits[name]) {
        throw new TexelfitError('no-webgpu', `the model needs ${name} ${need}; this adapter gives ${adapter.limits[name]}`);
      }
      if (need > WEBGPU_DEFAULT_LIMITS[name]) requiredLimits[name] = need;
    }
    const device = await adapter.requestDevice({ requiredLimits });
    const caps = { textureLimit: Infinity, precision: 'float32' };
    device.pushErrorScope('out-of-memory');
    const textures = new Map(), buffers = new Map(), made = [];
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const buffer = (bytes) => { const b = device.createBuffer({ size: bytes, usage }); made.push(b); return b; };
    for (const spec of TEXTURES) {
      if (spec.storage >= 0) buffers.set(spec.storage, Math.max(buffers.get(spec.storage) ?? 0, spec.width * spec.height * 16));
    }
    for (const [k, bytes] of buffers) buffers.set(k, buffer(bytes));
    for (const spec of TEXTURES) {
      const bytes = spec.width * spec.height * 16;
      const tex = spec.storage >= 0 ? [buffers.get(spec.storage)] : Array.from({ length: spec.double ? 2 : 1 }, () => buffer(bytes));
      textures.set(spec.name, {
        spec, tex, cur: 0, double: spec.double, tiled: false, pw: spec.width, ph: spec.height, format: 'f32', expand: 1,
      });
    }
    const gpuDevice = new WebGpuDevice(device, caps, textures);
    device.pushErrorScope('validation');
    await gpuDevice.runner.prepare([gpuDevice.runner.forward]);
    const [invalid, memory] = [await device.popErrorScope(), await device.popErrorScope()];
    if (memory || invalid) {
      device.destroy();
      if (memory) throw new TexelfitError('out-of-memory', `${memory.message} while allocating the buffers: this device cannot hold the model; ${memoryNote()}`);
      throw new TexelfitError('webgpu-kernel', `a kernel of the forward: ${invalid.message}`);
    }
    return gpuDevice;
  }

  lost() {
    return this.isLost;
  }

  // Texel data (logical rows [0, rows), row-major) into the current half.
  upload(rec, data, rows) {
    const n = rows * rec.spec.width * 4;
    this.device.queue.writeBuffer(rec.tex[rec.cur], 0, data, 0, Math.min(n, data.length));
  }

  clear(rec) {
    const encoder = this.device.createCommandEncoder();
    for (const b of new Set(rec.tex)) encoder.clearBuffer(b, 0, rec.spec.width * rec.spec.height * 16);
    this.device.queue.submit([encoder.finish()]);
  }

  // A texture laid out as `rec` holding `data`, read alone: fit's proximal anchor (optimizer.js: optimizerOf).
  anchor(rec, data) {
    const b = this.device.createBuffer({ size: rec.spec.width * rec.spec.height * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
    const a = { ...rec, tex: [b], cur: 0, double: false };
    this.upload(a, data, rec.spec.height);
    return a;
  }

  release(rec) {
    for (const b of rec.tex) b.destroy();
  }

  // Copies of the first `rowsOf(rec)` logical rows (default: all) of the current halves, as queued when called:
  // each copied into the slot's mappable buffer, which is then mapped. Resolves to texel data, or null if the
  // device was lost; with `check`, rejects (gpu-error) on an error WebGPU reported.
  async read(recs, rowsOf, now = false, slot = 'call', check = false) {
    let bytes = 0;
    const reads = recs.map((rec) => {
      const size = (rowsOf ? rowsOf(rec) : rec.spec.height) * rec.spec.width * 16, r = { rec, offset: bytes, size };
      bytes += size;
      return r;
    });
    let staging = this.readBuffers.get(slot);
    if (!staging || staging.size < bytes || staging.mapState !== 'unmapped') {
      staging?.mapState === 'unmapped' && staging.destroy();
      staging = this.device.createBuffer({ size: Math.max(16, bytes), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      this.readBuffers.set(slot, staging);
    }
    const encoder = this.device.createCommandEncoder();
    for (const { rec, offset, size } of reads) if (size) encoder.copyBufferToBuffer(rec.tex[rec.cur], 0, staging, offset, size);
    this.device.queue.submit([encoder.finish()]);
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, Math.max(16, bytes));
    } catch (e) {
      // (a device lost meanwhile: its lost promise may settle a moment after the map fails)
      if (this.isLost || await Promise.race([this.device.lost.then(() => true), new Promise((resolve) => setTimeout(resolve, 50, false))])) return null;
      throw new TexelfitError('readback', `reading back from WebGPU failed: ${e.message}`);
    }
    const all = staging.getMappedRange(0, Math.max(16, bytes)).slice(0);
    staging.unmap();
    if (check && this.failure) throw new TexelfitError('gpu-error', `WebGPU reported an error in the work before a readback: ${this.failure.message}`);
    return reads.map(({ offset, size }) => new Float32Array(all, offset, size / 4));
  }

  dispose() {
    this.disposed = true; // (its device's loss is no loss: watchDevice)
    this.runner.dispose();
    this.device.destroy(); // (every buffer made on it goes with it)
    this.readBuffers.clear();
    for (const rec of this.textures.values()) rec.tex = [];
  }
}

// createModel({ backend: 'webgpu' }) (no_webgpu.js where the bundle has no WGSL)
function webgpuDevice(options) {
  return WebGpuDevice.create(options);
}

// A lost device (GPUDevice.lost, but not one dispose destroyed) is replaced by a new one from a new adapter, and the
// latest snapshot loaded into it, as a restored WebGL context is (lifecycle.js: restoreContext): a fit replays from
// there. One that cannot be had leaves the model lost (a fit rejects with context-lost after contextRestoreTimeout).
function watchDevice(s) {
  const gpu = s.gpu;
  gpu.device.lost.then(async () => {
    if (gpu.disposed || s.disposed) return;
    s.lost = true;
    s.state = 'lost';
    notify(s);
    let next;
    try {
      next = await WebGpuDevice.create(s.options);
    } catch {
      return;
    }
    deviceRestored(s, next);
    watchDevice(s); // (now the new device's loss)
  });
}
