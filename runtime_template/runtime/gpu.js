// ---- the WebGL2 device: everything that a lost context takes with it, built and rebuilt in one place
// A device holds the textures of the plan and the compiled passes, and moves data in and out:
//   upload(rec, texels, rows)  texel data (logical rows [0, rows), row-major) into the current half
//   read(recs, rowsOf, now, slot, check)  readback (asynchronous, or blocking with now); resolves to texel data,
//                              or null if lost; with `check`, rejects (out-of-memory, gpu-error) on a GL error
//   clear(rec)                 zero both halves
//   lost(), dispose()
// The CPU backend (cpu.js) implements the same interface.

// Loss scaling by tier: in float16 the activations' gradients are half floats, whose normal range
// ends at 6e-5; the loss gradient is scaled up by this and the weight gradients scaled back down
// (exactly: they are float32), as mixed-precision training does.
const LOSS_SCALE = { float32: 1, float16: 1024, rgba8: 1 };

// The read slots (read): a call of the API (predict, getWeights, save, gradients), a fit's block
// readback, and its loss feed.
const READ_SLOTS = ['call', 'block', 'loss'];

class GpuDevice {
  constructor(gl, caps, textures, runner) {
    this.gl = gl;
    this.caps = caps;
    this.textures = textures;
    this.runner = runner;
    runner.uniforms.u_loss_scale = LOSS_SCALE[caps.precision];
    this.backend = 'webgl2';
    this.precision = caps.precision; // the tier in use: 'float32' | 'float16' | 'rgba8'
    // the pixel-pack buffers of asynchronous reads (read), a list a slot: reads in different slots may
    // overlap (a fit's block readback, its loss readback, a predict between two steps); a read larger
    // than TRANSFER_PIECE bytes takes more than one (made when first needed, and kept)
    // (the first made here, so that nothing is created after warm-up)
    this.readBuffers = new Map(READ_SLOTS.map((slot) => [slot, [gl.createBuffer()]]));
  }

  static async create(gl, caps) {
    glFailure(gl); // (the page's own errors, on a canvas it passed: not the allocation's)
    const textures = createTextures(gl, caps.textureLimit, caps.precision);
    const runner = new Runner(gl, textures);
    // a device that cannot hold them answers GL_OUT_OF_MEMORY, or loses the context: Chromium allocates in
    // the GPU process, which has done so once getError (a round trip) answers, and the page learns of a
    // context lost for want of memory a task later (SwiftShader, a texture of 1 GiB), here while the
    // forward compiles (a compile the loss cut short is no error of its own)
    let failure = glFailure(gl, '');
    if (!failure) await runner.compile(caps).catch(async (e) => { await nextTask(); if (!gl.isContextLost()) throw e; });
    if (gl.isContextLost()) failure = new TexelfitError('out-of-memory', 'the WebGL context was lost');
    if (failure) {
      for (const t of new Set([...textures.values()].flatMap((rec) => rec.tex))) gl.deleteTexture(t);
      failure.message += ` while allocating the textures: this device cannot hold the model; ${memoryNote()}`;
      throw failure;
    }
    return new GpuDevice(gl, caps, textures, runner);
  }

  lost() {
    return this.gl.isContextLost();
  }

  upload(rec, data, rows) {
    uploadRows(this.gl, rec, data, rows);
  }

  // A texture laid out as `rec` holding `data`, read alone: fit's proximal anchor (optimizer.js: optimizerOf).
  anchor(rec, data) {
    const a = { ...rec, tex: [makeTexture(this.gl, FORMATS[rec.format].internal, rec.pw, rec.ph)], cur: 0, double: false, tw: rec.pw, th: rec.ph };
    this.upload(a, data, rec.spec.height);
    return a;
  }

  release(rec) {
    for (const t of rec.tex) this.gl.deleteTexture(t);
  }

  clear(rec) {
    const gl = this.gl;
    const fbo = gl.createFramebuffer();
    gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
    for (const t of rec.tex) {
      gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, t, 0);
      gl.drawBuffers([gl.COLOR_ATTACHMENT0]);
      gl.clearBufferfv(gl.COLOR, 0, [0, 0, 0, 0]);
    }
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    gl.deleteFramebuffer(fbo);
  }

  // Asynchronous readback of the first `rowsOf(rec)` logical rows (default: all) of textures,
  // current halves: every texture read into one pixel-pack buffer, one fence, then one
  // getBufferSubData. Chromium answers each getBufferSubData with a round trip to the GPU process
  // (0.2-1 ms on SwiftShader, however small the read), so a snapshot of 13 textures costs one
  // round trip, not 13. Resolves to texel data (views into one ArrayBuffer) in logical row-major
  // order, or null if the context was lost before the data arrived. Reads in one `slot` never
  // overlap: the model runs them one at a time (fit awaits each block's read before the next block,
  // and has one loss read in flight at most). The buffer is re-specified (bufferData) at every read:
  // Chromium warns in the console ("READ-usage buffer was written, then fenced, but written again
  // before being read back") whenever a pixel-pack buffer is written by a second read, and after a
  // few warnings stops reporting WebGL messages for the context at all.
  // With `now`, no fence: getBufferSubData right after the readPixels, which waits for the GPU to
  // finish the work queued before it and blocks the page meanwhile: for small work that wait is
  // shorter than a fence takes to report done (about 3.5 ms in Chromium, however little the work),
  // see predict. (A readPixels into client memory would do the same, and logs ANGLE's "GPU stall
  // due to ReadPixels" warning in the console.)
  // It first yields to the page once while the GPU works, so a loop of reads is not one long task.
  // A read of more than TRANSFER_PIECE bytes goes in pieces, a pixel-pack buffer each (a texture in
  // bands of rows): a buffer of a GB is more than many devices allocate at once (Chromium answers
  // "Buffer total allocation size is too large", SwiftShader loses the context), where the same bytes
  // in pieces are read. Every piece's readPixels is issued at once, so all of them read the textures
  // as they are at the call (the fit's loop goes on issuing steps), and one fence covers them.
  async read(recs, rowsOf, now = false, slot = 'call', check = false) {
    const gl = this.gl;
    if (now) {
      gl.flush();
      await nextTask();
      if (gl.isContextLost()) return null;
    }
    let bytes = 0;
    const reads = recs.map((rec) => {
      if (rec.format === 'f16') throw new TexelfitError('readback', `texture "${rec.spec.name}" is half-float and is never read back`);
      const logical = rowsOf ? rowsOf(rec) : rec.spec.height;
      const rows = physicalRows(rec, logical);
      // an rgba8 texel is one float: the same bytes, read as floats
      const size = rec.pw * rows * (rec.format === 'rgba8' ? 4 : 16);
      // (floats: the logical rows alone, without the last folded row's padding: a snapshot's tensor has
      // the size that restore checks)
      const read = { rec, rows, offset: bytes, size, floats: logical * rec.spec.width * 4 };
      bytes += size;
      return read;
    });
    const all = new ArrayBuffer(bytes);
    // pieces: { at (in all), bytes, bands: [rec, first row, rows, offset in the piece] }
    const pieces = [];
    let piece = null;
    for (const { rec, rows, offset, size } of reads) {
      const rowBytes = size / rows;
      for (let y = 0; y < rows;) {
        if (!piece || (piece.bytes && piece.bytes + rowBytes > TRANSFER_PIECE)) pieces.push(piece = { at: offset + y * rowBytes, bytes: 0, bands: [] });
        const n = Math.min(rows - y, Math.max(1, Math.floor((TRANSFER_PIECE - piece.bytes) / rowBytes)));
        piece.bands.push([rec, y, n, piece.bytes]);
        piece.bytes += n * rowBytes;
        y += n;
      }
    }
    const buffers = this.readBuffers.get(slot);
    while (buffers.length < pieces.length) buffers.push(gl.createBuffer());
    pieces.forEach((p, i) => {
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, buffers[i]);
      gl.bufferData(gl.PIXEL_PACK_BUFFER, p.bytes, gl.STREAM_READ);
      for (const [rec, y, n, at] of p.bands) {
        gl.bindFramebuffer(gl.FRAMEBUFFER, this.runner.readFramebuffer);
        gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, rec.tex[rec.cur], 0);
        gl.readBuffer(gl.COLOR_ATTACHMENT0);
        gl.readPixels(0, y, rec.pw, n, gl.RGBA, rec.format === 'rgba8' ? gl.UNSIGNED_BYTE : gl.FLOAT, at);
      }
    });
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    if (!now && !(await gpuDone(gl, gl.fenceSync(gl.SYNC_GPU_COMMANDS_COMPLETE, 0)))) return null;
    pieces.forEach((p, i) => {
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, buffers[i]);
      gl.getBufferSubData(gl.PIXEL_PACK_BUFFER, 0, new Uint8Array(all, p.at, p.bytes));
    });
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    if (gl.isContextLost()) return null;
    const failure = check && glFailure(gl, 'in the work before a readback');
    if (failure) throw failure;
    return reads.map(({ offset, floats }) => new Float32Array(all, offset, floats));
  }

  dispose() {
    const gl = this.gl;
    if (this.imagePipe) this.imagePipe.dispose(); // (fromImages made it)
    this.runner.dispose();
    for (const t of new Set([...this.textures.values()].flatMap((rec) => rec.tex))) gl.deleteTexture(t);
    for (const buffer of [...this.readBuffers.values()].flat()) gl.deleteBuffer(buffer);
    this.readBuffers.clear();
  }
}

// Resolve true when the GPU has passed `sync`, false if the context was lost meanwhile; never
// blocks the main thread.
async function gpuDone(gl, sync) {
  gl.flush();
  const since = performance.now();
  for (;;) {
    if (gl.isContextLost()) return false;
    const status = gl.clientWaitSync(sync, 0, 0);
    if (status === gl.ALREADY_SIGNALED || status === gl.CONDITION_SATISFIED) break;
    if (status === gl.WAIT_FAILED) {
      if (gl.isContextLost()) return false;
      throw new TexelfitError('readback', 'waiting for the GPU failed');
    }
    await pollWait(since);
  }
  gl.deleteSync(sync);
  return true;
}

// The textures that hold what training changes: weights and optimizer state. A frozen parameter
// (build --trainable) has its weight alone: a snapshot holds it too, for a context restored. `fit`:
// only what a fit writes (a frozen trunk of millions of weights stays the last snapshot's).
function stateTextureNames(fit = false) {
  const trained = new Set(MODEL.params.filter((p) => p.trainable).map((p) => p.texture));
  const names = [];
  for (const p of MODEL.params) {
    if (!fit || trained.has(p.texture)) names.push(p.texture);
    if (p.trainable) names.push('m:' + p.name, 'v:' + p.name);
  }
  return names;
}
