// ---- the CPU backend: the same textures, schedule and passes, computed in plain JavaScript ---------
// createModel({ backend: 'cpu' }) uses it, and so does createModel() where WebGL2 (with float32
// render targets) is missing. Everything above the device interface (gpu.js.j2) is shared with
// WebGL2; below it:
//   * a texture is a Float32Array of width x height RGBA texels in the same channel-packed layout
//     (codegen/webgl2/layout.py), never folded; double-buffered ones hold two, read at `cur`, written at 1 - cur;
//   * a pass draws what the GPU draws ('batch': the first u_batch * sampleRows rows, 'full': all
//     rows, 'ring': texel u_ring of the loss ring) by calling its kernel's function printed from the kernel
//     language (CPU_GENERATED[kernel.cpu], below), with the kernel's shape constants (kernel.consts); no kernel is
//     written here by hand. A WebGL2 routine's pass (sample- or column-blocked) runs the generic kernel, dealt out
//     into the routine's parts by cpuBlocked and cpuColumns;
//   * values are computed in float64 and stored as float32.

// A view of a texture half as the kernels see it: getX(row, col4) of the GLSL is the 4 floats from
// texelAt(X, row, col4) in X.data.
function texelAt(t, row, col4) {
  return (row * t.width + col4) * 4;
}

// A blocked pass (c.blocked, layout.py) writes sample (or, for a weight gradient, row) block*r + t into row r of
// output t. Its twin computes the u_batch samples (all rows) as one output, then deals them out, zeros past
// u_batch.
function cpuBlocked(twin) {
  return (c, inputs, outputs, u, rows) => {
    if (!c.blocked) return twin(c, inputs, outputs, u, rows);
    const T = outputs[0], h = T.spec.sampleRows || 1, texels = T.width * 4 * h, b = c.block;
    const count = T.spec.sampleRows ? u.u_batch : b * rows;
    const all = { data: new Float32Array(count * texels), width: T.width, height: count * h, spec: T.spec };
    twin(c, inputs, [all], u, count * h);
    for (let n = 0; n < b * Math.ceil(count / b); n++) {
      const part = outputs[n % b], at = Math.floor(n / b) * texels;
      if (n < count) part.data.set(all.data.subarray(n * texels, (n + 1) * texels), at);
      else part.data.fill(0, at, at + texels);
    }
  };
}

// An optimizer pass (ops/optim.py): its inputs are its gradient kernel's (the first `n`), then the proximal anchor
// P0, the parameter and its states. The gradient kernel's function (`gradient`: a template's twin, or one printed from
// the kernel language) fills a scratch texture of the parameter's size (one a parameter, kept), which the printed
// update (`update`) reads as its input G (kl.py: gradient), where WebGL2 calls the gradient's valueAt.
const cpuGradients = new WeakMap();
function cpuOptimizer(update, gradient, n) {
  return (c, inputs, outputs, u, rows) => {
    const P = inputs[n + 1];
    let G = cpuGradients.get(P.spec);
    if (!G) {
      G = { data: new Float32Array(P.width * P.height * 4), width: P.width, height: P.height, spec: P.spec };
      cpuGradients.set(P.spec, G);
    }
    gradient(c, inputs.slice(0, n), [G], u, rows);
    update(c, [G, ...inputs.slice(n)], outputs, u, rows);
  };
}

// The pass runner: the interface of Runner (runner.js.j2) over CPU textures.
class CpuRunner {
  constructor(textures) {
    this.textures = textures;
    loadSchedule(this, textures);
  }

  resolve(p, inputs, outputs) {
    const kernel = KERNELS[p.kernel];
    // (a generated kernel of a WebGL2 routine's pass computes the generic kernel; cpuBlocked or cpuColumns deals it
    // out; an optimizer's update computes its gradient first: cpuOptimizer)
    const g = kernel.gradient;
    const generated = cpuBlocked(CPU_GENERATED[kernel.cpu]);
    const fn = g ? cpuOptimizer(CPU_GENERATED[kernel.cpu], cpuBlocked(CPU_GENERATED[g.cpu]), g.inputs)
      : cpuColumns(generated);
    if (!CPU_GENERATED[kernel.cpu] || (g && !CPU_GENERATED[g.cpu])) {
      throw new TexelfitError('cpu-kernel', `kernel "${kernel.name}" has no CPU function`);
    }
    // the views handed to the kernel; run() points them at the halves to read and write
    const view = (rec) => ({ data: null, width: rec.spec.width, height: rec.spec.height, spec: rec.spec });
    const out = outputs[0];
    return {
      kernel, fn, consts: kernel.consts, inputs, outputs, views: inputs.map(view), outViews: outputs.map(view),
      rows: p.rows, label: p.label, height: out.spec.height, sampleRows: out.spec.sampleRows, out, values: p.values,
      blocked: p.blocked ?? null, // a twin of a sample-blocked pass (runner.js: runsAt)
      blockFrom: p.blockFrom,
      wide: p.wide ?? null, // a draw of a column-blocked forward (runner.js: runsAt)
      webgpu: p.webgpu ?? null, // a pass of WebGPU's alone: not run here (runsAt)
    };
  }

  run(passes) {
    const u = this.uniforms;
    for (let i = 0; i < passes.length; i++) {
      const p = passes[i];
      if (!runsAt(p, u.u_batch, Infinity)) continue; // the other twin runs
      for (let t = 0; t < p.inputs.length; t++) p.views[t].data = p.inputs[t].tex[p.inputs[t].cur];
      // double-buffered outputs swap jointly: all written into the half the first one does not read
      const parity = p.out.double ? p.out.cur : 0;
      for (let t = 0; t < p.outputs.length; t++) {
        const rec = p.outputs[t];
        p.outViews[t].data = rec.tex[rec.double ? 1 - parity : 0];
      }
      const rows = p.rows === 'full' ? p.height : p.rows === 'ring' ? 1 : sampleRowsDrawn(p.rows, u.u_batch) * p.sampleRows;
      p.fn(p.consts, p.views, p.outViews, p.values ? { ...u, ...p.values } : u, rows);
    }
  }

  swap(optimizer) {
    const list = this.swaps[optimizer];
    for (let i = 0; i < list.length; i++) list[i].cur = 1 - list[i].cur;
  }

  // (the CPU kernels read u_mu and P0 always, KernelDef.variant: a variant is the pass with other inputs)
  variant(r, inputs) {
    return { ...r, inputs };
  }

  async prepare() {} // nothing to compile

  dispose() {}
}

// The CPU device: the interface of GpuDevice (gpu.js.j2).
class CpuDevice {
  constructor(caps, textures, runner) {
    this.caps = caps;
    this.textures = textures;
    this.runner = runner;
    this.backend = 'cpu';
    this.precision = 'float32';
  }

  // `options` as createModel's: maxTextureSize is checked as on WebGL2, but nothing is ever folded
  // here (there is no texture limit: caps.textureLimit is Infinity); the precision is float32.
  static async create(options = {}) {
    const m = options.maxTextureSize;
    if (m !== undefined && !(Number.isInteger(m) && m >= 4)) {
      throw new TexelfitError('bad-option', `maxTextureSize must be an integer of at least 4, got ${m}`);
    }
    if (options.precision !== undefined && options.precision !== 'float32') {
      throw new TexelfitError('unsupported-precision', `precision "${options.precision}": the CPU backend computes in float32 only`);
    }
    const caps = { textureLimit: Infinity, precision: 'float32' };
    const textures = new Map();
    // the textures of one storage (codegen/memory.py) are views of one buffer, the largest of them
    const buffers = new Map();
    for (const spec of TEXTURES) {
      if (spec.storage >= 0) buffers.set(spec.storage, Math.max(buffers.get(spec.storage) ?? 0, spec.width * spec.height * 16));
    }
    for (const [k, bytes] of buffers) buffers.set(k, new ArrayBuffer(bytes));
    for (const spec of TEXTURES) {
      const tex = [];
      if (spec.storage >= 0) tex.push(new Float32Array(buffers.get(spec.storage), 0, spec.width * spec.height * 4));
      else for (let i = 0; i < (spec.double ? 2 : 1); i++) tex.push(new Float32Array(spec.width * spec.height * 4));
      textures.set(spec.name, {
        spec, tex, cur: 0, double: spec.double, tiled: false, pw: spec.width, ph: spec.height, format: 'f32', expand: 1,
      });
    }
    return new CpuDevice(caps, textures, new CpuRunner(textures));
  }

  lost() {
    return false;
  }

  // Texel data (logical rows [0, rows), row-major) into the current half.
  upload(rec, data, rows) {
    const n = rows * rec.spec.width * 4;
    rec.tex[rec.cur].set(data.length === n ? data : data.subarray(0, n));
  }

  clear(rec) {
    for (const t of rec.tex) t.fill(0);
  }

  // A texture laid out as `rec` holding `data`, read alone: fit's proximal anchor (optimizer.js: optimizerOf).
  anchor(rec, data) {
    return { ...rec, tex: [Float32Array.from(data)], cur: 0, double: false };
  }

  release() {} // (an anchor: the collector takes it)

  // Copies of the first `rowsOf(rec)` logical rows (default: all) of the current halves, taken
  // when called (as the GPU's reads are queued when called).
  async read(recs, rowsOf) {
    return recs.map((rec) => rec.tex[rec.cur].slice(0, (rowsOf ? rowsOf(rec) : rec.spec.height) * rec.spec.width * 4));
  }

  dispose() {
    for (const rec of this.textures.values()) rec.tex = [];
  }
}
