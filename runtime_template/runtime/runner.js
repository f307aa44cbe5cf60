// ---- pass runner: a small interpreter over the static schedule ----------------------------------
// It does no shape logic and allocates nothing per step: pass sources, programs, framebuffers and
// uniform locations are all resolved once (programs when first needed, see prepare).

// The #defines that map a pass's textures through their fold and format (prelude.glsl.j2): for
// input NAME the macro FETCH_NAME(row, col4), which samples texel centres (common.glsl.j2: fetchTexel; on SwiftShader
// a texelFetch costs about 1.4x as much: README, Speed); for the output OUT_TILED or OUT_RGBA8 and its sizes, and OUT_F16.
function inputDefines(name, rec) {
  const how = rec.format === 'rgba8' ? 'fetchRgba8' : rec.tiled ? 'fetchTiled' : '', size = `vec2(${rec.tw}.0, ${rec.th}.0)`;
  if (!how) return `#define FETCH_${name}(r, c) fetchTexel(${name}, ivec2(c, r), ${size})\n`;
  return `#define FETCH_${name}(r, c) ${how}(${name}, r, c, ${rec.spec.width}, ${rec.pw}, ${size})\n`;
}

function outputDefines(rec) {
  const f16 = rec.format === 'f16' ? '#define OUT_F16 1\n' : ''; // (prelude.glsl.j2: writes saturate)
  if (rec.format !== 'rgba8' && !rec.tiled) return f16;
  return f16 + `#define OUT_${rec.format === 'rgba8' ? 'RGBA8' : 'TILED'} 1\n` +
    `#define OUT_WL ${rec.spec.width}\n#define OUT_PW ${rec.pw}\n#define OUT_HL ${rec.spec.height}\n`;
}

function tilingDefines(kernel, inputs, output) {
  let s = '';
  kernel.inputs.forEach((name, i) => { s += inputDefines(name, inputs[i]); });
  return s + outputDefines(output);
}

const PROGRAMS_PER_TASK = 2;

// Whether the twins of sample-blocked passes that run at `batch` are the blocked ones (Pass.blocked
// in codegen/kernels.py): from MODEL.blockMinBatch samples on (a row-blocked token matmul's: from its
// p.blockFrom, 1), where the device draws into MODEL.sampleBlock targets at once (`drawBuffers`; WebGL2 promises 4).
function blockedAt(batch, drawBuffers, from = MODEL.blockMinBatch) {
  return batch >= from && drawBuffers >= MODEL.sampleBlock;
}

// Whether pass p (resolved: p.blocked true, false or null) runs at `batch`. And a column-blocked forward's draw
// into all its parts (p.wide true) where the device draws into MODEL.columnParts targets at once, its draws of a
// half (false) where not (Pass.wide in codegen/kernels.py). Never a pass of WebGPU's alone (Pass.webgpu).
function runsAt(p, batch, drawBuffers) {
  return (p.blocked === null || p.blocked === blockedAt(batch, drawBuffers, p.blockFrom)) &&
    (p.wide === null || p.wide === drawBuffers >= MODEL.columnParts) && p.webgpu !== true;
}

// What a runner (Runner here, CpuRunner in cpu.js) holds for the static schedule: the per-step
// values read by the kernels' uniforms (names as in codegen/kernels.py), the pass lists resolved by
// runner.resolve(pass, input records, output records), and the textures each optimizer swaps.
// SCHEDULE names a texture by its index in TEXTURES.
function loadSchedule(runner, textures) {
  runner.uniforms = {
    u_batch: 1, u_loss_scale: 1, u_loss_weight: 1, u_ring: 0, u_lr: 0, u_momentum: 0, u_dampening: 0, u_nesterov: 0, u_first: 1, u_wd: 0, u_mu: 0,
    u_decoupled: 0, u_beta1: 0.9, u_beta2: 0.999, u_eps: 1e-8, u_step_size: 0, u_bc2_sqrt: 1,
    u_dropout: 0, u_dropseed: 0,
  };
  const tex = (i) => textures.get(TEXTURES[i].name);
  const resolve = (list) => list.map((p) => runner.resolve(p, p.inputs.map(tex), p.outputs.map(tex)));
  runner.forward = resolve(SCHEDULE.forward);
  // the frozen trunk's passes (MODEL.trunk) and the head's after it: the forward in two
  runner.trunk = runner.forward.slice(0, SCHEDULE.trunkPasses);
  runner.head = runner.forward.slice(SCHEDULE.trunkPasses);
  runner.backward = resolve(SCHEDULE.backward);
  runner.trainBackward = SCHEDULE.trainBackward.map((i) => runner.backward[i]);
  // each output's loss passes by kind (outputs_multi.js: lossPasses)
  runner.loss = SCHEDULE.loss.map((kinds) => Object.fromEntries(Object.entries(kinds).map(([k, v]) => [k, resolve(v)])));
  runner.optimizer = {};
  runner.swaps = {};
  for (const [k, v] of Object.entries(SCHEDULE.optimizer)) {
    runner.optimizer[k] = resolve(v);
    runner.swaps[k] = SCHEDULE.swaps[k].map(tex);
  }
}

class Runner {
  constructor(gl, textures) {
    this.gl = gl;
    this.textures = textures;
    this.framebuffers = [];
    this.unitTextures = []; // the texture bound to each texture unit by run() (uploads use another unit)
    this.units = []; // distinct final sources: programs are cached by their generated source
    this.unitIndex = new Map();
    loadSchedule(this, textures);
  }

  resolve(p, inputs, outputs) {
    const kernel = KERNELS[p.kernel];
    const source = kernel.source.replace('//!TILING\n', tilingDefines(kernel, inputs, outputs[0]))
      .replace('//!COMMON\n', GLSL_COMMON);
    if (!this.unitIndex.has(source)) {
      this.unitIndex.set(source, this.units.length);
      this.units.push({ kernel, source });
    }
    const out = outputs[0];
    return {
      unit: this.unitIndex.get(source), program: null, inputs, outputs, fbos: [], rows: p.rows, label: p.label,
      values: p.values ?? null, // uniforms the pass sets itself (Pass.values in codegen/kernels.py)
      blocked: p.blocked ?? null, // a twin of a sample-blocked pass (runsAt)
      blockFrom: p.blockFrom, // (the batch it runs from, where not MODEL.blockMinBatch)
      wide: p.wide ?? null, // a draw of a column-blocked forward (runsAt)
      webgpu: p.webgpu ?? null, // a pass of WebGPU's alone: not run here (runsAt)
      width: out.spec.width, height: out.spec.height, sampleRows: out.spec.sampleRows, out,
    };
  }

  // Pass r (resolved) reading `inputs`, as a program of its own whose source has `defines` first: a variant
  // (fit's proximal term: PROXIMAL, ops/optim.py), compiled when first needed as the others are.
  variant(r, inputs, defines) {
    const { kernel, source } = this.units[r.unit];
    const variant = source.replace('\n', '\n' + defines); // after #version
    if (!this.unitIndex.has(variant)) {
      this.unitIndex.set(variant, this.units.length);
      this.units.push({ kernel, source: variant });
      this.programs?.push(null);
    }
    return { ...r, unit: this.unitIndex.get(variant), program: null, fbos: [], inputs };
  }

  // Programs are compiled when first needed: the forward's at createModel (where a shader that
  // fails to compile is reported), a training step's or gradients' at the start of fit() or
  // gradients() (prepare). So a model that trains with SGD never compiles Adam's programs nor the
  // stand-alone gradient kernels: SwiftShader spends milliseconds on each.
  async compile(caps) {
    this.caps = caps;
    this.vertexShader = compileVertexShader(this.gl);
    this.programs = new Array(this.units.length).fill(null);
    this.readFramebuffer = this.gl.createFramebuffer();
    this.framebuffers.push(this.readFramebuffer);
    await this.prepare([this.forward]);
  }

  // Compiles the programs of `lists` of passes not compiled yet and makes their framebuffers: of
  // the passes that run at one of `batches` (batch sizes; by default any: blockedAt only turns on
  // with the batch size, so the smallest and largest cover every twin this device can run).
  async prepare(lists, batches = [1, MODEL.maxBatch]) {
    const runs = (p) => batches.some((b) => runsAt(p, b, this.caps.drawBuffers));
    const passes = lists.flat().filter((p) => p.program === null && runs(p));
    const units = [...new Set(passes.map((p) => p.unit))].filter((i) => this.programs[i] === null);
    // a few programs a task: waiting for a link blocks the page, and fit() keeps its tasks short
    for (let at = 0; at < units.length; at += PROGRAMS_PER_TASK) {
      const chunk = units.slice(at, at + PROGRAMS_PER_TASK);
      const compiled = await compilePrograms(this.gl, this.caps, this.vertexShader, chunk.map((i) => this.units[i]));
      if (!compiled) return; // the context was lost: the restored one compiles again
      chunk.forEach((i, k) => { this.programs[i] = compiled[k]; });
      // their passes' framebuffers now, while the GPU has nothing else queued: a framebuffer's
      // status check waits for all queued work, which must not pile up into one long task
      for (const p of passes) if (p.program === null && chunk.includes(p.unit)) this.#bind(p);
      await nextTask();
    }
    for (const p of passes) if (p.program === null) this.#bind(p);
  }

  // The same for one pass, blocking (run() on a pass not prepared: a context restored mid-fit).
  #prepareNow(p) {
    if (this.programs[p.unit] === null) {
      const compiled = compileProgramsNow(this.gl, this.vertexShader, [this.units[p.unit]]);
      if (!compiled) return; // lost: nothing draws anyway
      this.programs[p.unit] = compiled[0];
    }
    this.#bind(p);
  }

  #bind(p) {
    const gl = this.gl;
    p.program = this.programs[p.unit];
    // one framebuffer per parity of the (jointly swapped) double-buffered outputs
    for (let parity = 0; parity < (p.out.double ? 2 : 1); parity++) {
      const fbo = gl.createFramebuffer();
      gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
      p.outputs.forEach((rec, i) => {
        const half = rec.double ? 1 - parity : 0;
        gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0 + i, gl.TEXTURE_2D, rec.tex[half], 0);
      });
      gl.drawBuffers(p.outputs.map((_, i) => gl.COLOR_ATTACHMENT0 + i));
      const status = gl.checkFramebufferStatus(gl.FRAMEBUFFER);
      if (status !== gl.FRAMEBUFFER_COMPLETE) {
        throw new TexelfitError('framebuffer', `pass ${p.program.kernel.name} (${p.label}): framebuffer incomplete (0x${status.toString(16)})`);
      }
      p.fbos.push(fbo);
      this.framebuffers.push(fbo);
    }
  }

  run(passes) {
    const gl = this.gl;
    const u = this.uniforms;
    for (let i = 0; i < passes.length; i++) {
      const p = passes[i];
      if (!runsAt(p, u.u_batch, this.caps.drawBuffers)) continue; // the other twin runs
      if (p.program === null) {
        this.#prepareNow(p);
        if (p.program === null) continue;
      }
      const out = p.out;
      gl.bindFramebuffer(gl.FRAMEBUFFER, p.fbos[out.double ? out.cur : 0]);
      if (p.rows === 'ring') { // the physical texels of logical texel u_ring
        const i = u.u_ring * out.expand;
        gl.viewport(i % out.pw, Math.floor(i / out.pw), out.expand, 1);
      } else {
        const rows = p.rows === 'full' ? p.height : sampleRowsDrawn(p.rows, u.u_batch) * p.sampleRows;
        gl.viewport(0, 0, out.pw, physicalRows(out, rows));
      }
      gl.useProgram(p.program.program);
      // no call that changes nothing: a unit keeps its texture, a program its uniforms' values
      const bound = this.unitTextures;
      for (let t = 0; t < p.inputs.length; t++) {
        const rec = p.inputs[t];
        const tex = rec.tex[rec.cur];
        if (bound[t] === tex) continue;
        gl.activeTexture(gl.TEXTURE0 + t);
        gl.bindTexture(gl.TEXTURE_2D, tex);
        bound[t] = tex;
      }
      const us = p.program.uniforms;
      for (let k = 0; k < us.length; k++) {
        const x = us[k];
        const v = p.values !== null && p.values[x.name] !== undefined ? p.values[x.name] : u[x.name];
        if (x.value === v) continue;
        if (x.isInt) gl.uniform1i(x.loc, v);
        else gl.uniform1f(x.loc, v);
        x.value = v;
      }
      gl.drawArrays(gl.TRIANGLES, 0, 3);
    }
  }

  swap(optimizer) {
    const list = this.swaps[optimizer];
    for (let i = 0; i < list.length; i++) list[i].cur = 1 - list[i].cur;
  }

  dispose() {
    const gl = this.gl;
    for (const fbo of this.framebuffers) gl.deleteFramebuffer(fbo);
    for (const p of this.programs ?? []) {
      if (!p) continue;
      gl.deleteProgram(p.program);
      gl.deleteShader(p.shader);
    }
    if (this.vertexShader) gl.deleteShader(this.vertexShader);
    this.framebuffers = [];
    this.programs = [];
  }
}
