// ---- image inputs: fromImages (build --input-normalize) -----------------------------------------
// The steps of texelfit/images.py, step for step: 1. bytes / 255 (alpha ignored); 2. a centred
// whole-pixel crop to the input's aspect ratio (cropBox); 3. the antialiased bilinear (triangle)
// filter of torch's interpolate(antialias=True) and PIL's BILINEAR, along rows then columns; 4. the
// luminance 0.299 R + 0.587 G + 0.114 B for a 1-channel input; 5. (v - mean) / std.
// On WebGL2 the source goes up with texImage2D (never through getImageData) and two passes of
// IMAGE_SHADER filter, convert and normalise it; the CPU backend draws the crop into a 2-D canvas
// and filters in JS (imagesOnCpu), with the same weights.

const IMAGE = MODEL.image; // { mode, mean, std, channels, height, width }
const LUMA = [0.299, 0.587, 0.114];

// [x0, y0, cw, ch]: the centred crop of a w x h image to the aspect ratio ow:oh (round half up)
function cropBox(w, h, ow, oh) {
  if (w * oh > h * ow) {
    const cw = Math.max(1, Math.min(w, Math.floor((2 * h * ow + oh) / (2 * oh))));
    return [Math.floor((w - cw) / 2), 0, cw, h];
  }
  const ch = Math.max(1, Math.min(h, Math.floor((2 * w * oh + ow) / (2 * ow))));
  return [0, Math.floor((h - ch) / 2), w, ch];
}

const isA = (s, name) => typeof globalThis[name] === 'function' && s instanceof globalThis[name];
const SOURCE_KINDS = ['HTMLImageElement', 'HTMLCanvasElement', 'OffscreenCanvas', 'ImageBitmap', 'ImageData', 'HTMLVideoElement', 'VideoFrame'];

// The array of image sources x, checked ({ source, w, h, what } each); null when x is not an array
// of objects (then it is a Float32Array of values, or wrong).
function imageList(x) {
  if (!Array.isArray(x) || !x.length || typeof x[0] !== 'object' || x[0] === null) return null;
  return x.map((s, i) => {
    const what = `sources[${i}] (${kindOf(s)})`;
    const bad = (why) => new TexelfitError('bad-input', `${what} ${why}`);
    let w, h;
    if (isA(s, 'HTMLImageElement')) {
      if (!s.complete || !s.naturalWidth) throw bad(`(src ${JSON.stringify(s.currentSrc || s.src)}) is not decoded: it has not loaded yet or is broken (await img.decode() first)`);
      [w, h] = [s.naturalWidth, s.naturalHeight];
    } else if (isA(s, 'HTMLVideoElement')) {
      if (s.readyState < 2 || !s.videoWidth) throw bad(`has no frame to read yet (readyState ${s.readyState}): wait for its loadeddata event`);
      [w, h] = [s.videoWidth, s.videoHeight];
    } else if (isA(s, 'VideoFrame')) {
      [w, h] = [s.displayWidth, s.displayHeight];
    } else if (SOURCE_KINDS.some((k) => isA(s, k))) {
      [w, h] = [s.width, s.height];
    } else {
      throw bad(`is not an image source: give ${SOURCE_KINDS.join(', ')}`);
    }
    if (!w || !h) throw bad(`has zero size (${w} x ${h}; a closed ImageBitmap or VideoFrame has none)`);
    return { source: s, w, h, what };
  });
}

// The model's input for the sources, NCHW: from px[n] = [the n-th source's filtered texels (RGBA, a
// row of W, then the next), whether they are normalised already (else values in [0, 1])].
function assembleImages(px) {
  const { channels: C, height: H, width: W } = IMAGE;
  const count = px.length, plane = H * W, out = new Float32Array(count * C * plane);
  for (let n = 0; n < count; n++) {
    const [t, normalised] = px[n];
    for (let c = 0; c < C; c++) {
      const mean = normalised ? 0 : IMAGE.mean[c], inv = normalised ? 1 : 1 / IMAGE.std[c];
      const o = (n * C + c) * plane;
      for (let k = 0; k < plane; k++) out[o + k] = (t[4 * k + c] - mean) * inv;
    }
  }
  return out;
}

const IMAGE_SHADER = `#version 300 es
// texelfit kernel: fromImages: the triangle filter along one axis (then luminance and normalisation)
precision highp float;
precision highp int;
uniform highp sampler2D u_src;
uniform int u_axis; // 0: along rows, 1: along columns
uniform ivec2 u_offset; // the crop's first pixel in u_src
uniform int u_size; // the crop's size along the axis
uniform float u_scale; // crop size / output size along the axis
uniform int u_gray;
uniform vec4 u_mean;
uniform vec4 u_inv_std;
out vec4 o;
void main() {
  ivec2 p = ivec2(gl_FragCoord.xy);
  int i = u_axis == 0 ? p.x : p.y;
  float support = max(u_scale, 1.0);
  float center = (float(i) + 0.5) * u_scale;
  int lo = max(int(center - support + 0.5), 0);
  int hi = min(int(center + support + 0.5), u_size);
  vec4 acc = vec4(0.0);
  float total = 0.0;
  for (int j = lo; j < hi; j++) {
    float w = max(0.0, 1.0 - abs((float(j) - center + 0.5) / support));
    acc += w * texelFetch(u_src, u_offset + (u_axis == 0 ? ivec2(j, p.y) : ivec2(p.x, j)), 0);
    total += w;
  }
  vec4 v = acc / total;
  if (u_gray == 1) v = vec4(dot(v.rgb, vec3(0.299, 0.587, 0.114)), 0.0, 0.0, 1.0);
  o = (v - u_mean) * u_inv_std;
}
`;

// The WebGL2 side: one program, the source texture (RGBA8, re-specified per source), the rows'
// result (W x crop height) and the output (W x H), float32 where the device renders to it, else
// RGBA8 (normalised in JS then; each pass rounds to 1/255, within the 2/255 of the tests). Made at
// the first fromImages, freed with the device (GpuDevice.dispose).
class ImagePipe {
  constructor(gl, caps) {
    this.gl = gl;
    this.float = caps.floatRenderTargets && caps.precision !== 'rgba8'; // (a forced rgba8 tier tests the RGBA8 path)
    this.maxSize = caps.textureLimit; // (createModel's maxTextureSize lowers it: the JS path is tested so)
    this.vs = compileVertexShader(gl);
    const built = compileProgramsNow(gl, this.vs,
      [{ kernel: { name: 'fromImages', inputs: ['u_src'], uniforms: [] }, source: IMAGE_SHADER }]);
    this.program = built[0].program;
    this.shader = built[0].shader;
    this.loc = {};
    for (const n of ['u_axis', 'u_offset', 'u_size', 'u_scale', 'u_gray', 'u_mean', 'u_inv_std']) this.loc[n] = gl.getUniformLocation(this.program, n);
    this.tex = [0, 1, 2].map(() => {
      const t = gl.createTexture();
      gl.bindTexture(gl.TEXTURE_2D, t);
      for (const [k, v] of [[gl.TEXTURE_MIN_FILTER, gl.NEAREST], [gl.TEXTURE_MAG_FILTER, gl.NEAREST],
        [gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE], [gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE]]) gl.texParameteri(gl.TEXTURE_2D, k, v);
      return t;
    });
    this.fbo = gl.createFramebuffer();
    this.buffer = gl.createBuffer();
    this.midHeight = 0;
    this.#target(this.tex[2], IMAGE.width, IMAGE.height);
  }

  #target(tex, w, h) {
    const gl = this.gl;
    gl.activeTexture(gl.TEXTURE0 + UPLOAD_UNIT);
    gl.bindTexture(gl.TEXTURE_2D, tex);
    gl.texImage2D(gl.TEXTURE_2D, 0, this.float ? gl.RGBA32F : gl.RGBA8, w, h, 0, gl.RGBA, this.float ? gl.FLOAT : gl.UNSIGNED_BYTE, null);
  }

  // One pass into `tex` (w x h) from `src` along `axis`.
  #draw(src, tex, w, h, axis, offset, size, scale, last) {
    const gl = this.gl, l = this.loc, norm = last && this.float;
    gl.bindFramebuffer(gl.FRAMEBUFFER, this.fbo);
    gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, tex, 0);
    gl.drawBuffers([gl.COLOR_ATTACHMENT0]);
    gl.viewport(0, 0, w, h);
    gl.useProgram(this.program);
    gl.activeTexture(gl.TEXTURE0 + UPLOAD_UNIT);
    gl.bindTexture(gl.TEXTURE_2D, src);
    gl.uniform1i(gl.getUniformLocation(this.program, 'u_src'), UPLOAD_UNIT);
    gl.uniform1i(l.u_axis, axis);
    gl.uniform2i(l.u_offset, offset[0], offset[1]);
    gl.uniform1i(l.u_size, size);
    gl.uniform1f(l.u_scale, scale);
    gl.uniform1i(l.u_gray, last && IMAGE.channels === 1 ? 1 : 0);
    const pad = (v, x) => [0, 1, 2].map((c) => v[Math.min(c, v.length - 1)]).concat([x]);
    gl.uniform4fv(l.u_mean, norm ? pad(IMAGE.mean, 0) : [0, 0, 0, 0]);
    gl.uniform4fv(l.u_inv_std, norm ? pad(IMAGE.std.map((s) => 1 / s), 1) : [1, 1, 1, 1]);
    gl.drawArrays(gl.TRIANGLES, 0, 3);
  }

  // The filtered texels of one source (Float32Array or Uint8Array, RGBA, W x H); null if the context was lost.
  async run({ source, w, h, what }) {
    const gl = this.gl, W = IMAGE.width, H = IMAGE.height;
    const [x0, y0, cw, ch] = cropBox(w, h, W, H);
    gl.activeTexture(gl.TEXTURE0 + UPLOAD_UNIT);
    gl.bindTexture(gl.TEXTURE_2D, this.tex[0]);
    gl.pixelStorei(gl.UNPACK_FLIP_Y_WEBGL, false);
    gl.pixelStorei(gl.UNPACK_PREMULTIPLY_ALPHA_WEBGL, false);
    gl.pixelStorei(gl.UNPACK_COLORSPACE_CONVERSION_WEBGL, gl.NONE);
    try {
      gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA8, gl.RGBA, gl.UNSIGNED_BYTE, source);
    } catch (e) {
      throw new TexelfitError('bad-input', e && e.name === 'SecurityError'
        ? `${what} is tainted (cross-origin without CORS): the page may not read its pixels` : `${what} cannot be uploaded (${e})`, { cause: e });
    }
    if (ch !== this.midHeight) {
      this.#target(this.tex[1], W, ch);
      this.midHeight = ch;
    }
    this.#draw(this.tex[0], this.tex[1], W, ch, 0, [x0, y0], cw, cw / W, false);
    this.#draw(this.tex[1], this.tex[2], W, H, 1, [0, 0], ch, ch / H, true);
    const bytes = W * H * 4 * (this.float ? 4 : 1);
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, this.buffer);
    gl.bufferData(gl.PIXEL_PACK_BUFFER, bytes, gl.STREAM_READ);
    gl.readBuffer(gl.COLOR_ATTACHMENT0);
    gl.readPixels(0, 0, W, H, gl.RGBA, this.float ? gl.FLOAT : gl.UNSIGNED_BYTE, 0);
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    if (!(await gpuDone(gl, gl.fenceSync(gl.SYNC_GPU_COMMANDS_COMPLETE, 0)))) return null;
    const px = this.float ? new Float32Array(W * H * 4) : new Uint8Array(W * H * 4);
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, this.buffer);
    gl.getBufferSubData(gl.PIXEL_PACK_BUFFER, 0, px);
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    return this.float ? px : Float32Array.from(px, (v) => v / 255);
  }

  dispose() {
    const gl = this.gl;
    for (const t of this.tex) gl.deleteTexture(t);
    gl.deleteFramebuffer(this.fbo);
    gl.deleteBuffer(this.buffer);
    gl.deleteProgram(this.program);
    gl.deleteShader(this.shader);
    gl.deleteShader(this.vs);
  }
}

function readImages(gpu, list) {
  return gpu.backend === 'webgl2' ? imagesOnGpu(gpu, list) : imagesOnCpu(list);
}

// (a source larger than the device's textures is filtered in JS)
async function imagesOnGpu(gpu, list) {
  const pipe = gpu.imagePipe ?? (gpu.imagePipe = new ImagePipe(gpu.gl, gpu.caps));
  const px = [];
  for (const item of list) {
    if (Math.max(item.w, item.h) > pipe.maxSize) {
      px.push([filterOnCpu(item), false]);
      continue;
    }
    const t = await pipe.run(item);
    if (!t) throw new TexelfitError('context-lost', 'the WebGL context was lost during fromImages');
    px.push([t, pipe.float]);
  }
  return assembleImages(px);
}

// ---- the same in JS (the CPU backend) ------------------------------------------------------------
// [lo, weights] of each output position of the triangle filter from `size` values to `out`.
function filterTaps(size, out) {
  const scale = size / out, support = Math.max(scale, 1), taps = [];
  for (let i = 0; i < out; i++) {
    const center = (i + 0.5) * scale;
    const lo = Math.max(Math.trunc(center - support + 0.5), 0), hi = Math.min(Math.trunc(center + support + 0.5), size);
    const w = [];
    for (let j = lo; j < hi; j++) w.push(Math.max(0, 1 - Math.abs((j - center + 0.5) / support)));
    const total = w.reduce((a, b) => a + b, 0);
    taps.push([lo, w.map((v) => v / total)]);
  }
  return taps;
}

// The crop's RGBA bytes (cw x ch): an ImageData's own, anything else drawn into a 2-D canvas.
function cropPixels({ source, what }, [x0, y0, cw, ch]) {
  if (isA(source, 'ImageData')) {
    const px = new Uint8ClampedArray(cw * ch * 4);
    for (let y = 0; y < ch; y++) px.set(source.data.subarray(((y0 + y) * source.width + x0) * 4, ((y0 + y) * source.width + x0 + cw) * 4), y * cw * 4);
    return px;
  }
  const canvas = typeof OffscreenCanvas === 'function' ? new OffscreenCanvas(cw, ch)
    : Object.assign(document.createElement('canvas'), { width: cw, height: ch });
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  ctx.drawImage(source, x0, y0, cw, ch, 0, 0, cw, ch);
  try {
    return ctx.getImageData(0, 0, cw, ch).data;
  } catch (e) {
    throw new TexelfitError('bad-input', `${what} is tainted (cross-origin without CORS): the page may not read its pixels`, { cause: e });
  }
}

function imagesOnCpu(list) {
  return assembleImages(list.map((item) => [filterOnCpu(item), false]));
}

// One source's filtered texels (RGBA, values in [0, 1]), in JS.
function filterOnCpu(item) {
  const W = IMAGE.width, H = IMAGE.height;
  const box = cropBox(item.w, item.h, W, H), [, , cw, ch] = box;
  const src = cropPixels(item, box);
  const rows = new Float64Array(ch * W * 4), out = new Float32Array(W * H * 4);
  filterTaps(cw, W).forEach(([lo, w], x) => {
    for (let y = 0; y < ch; y++) {
      for (let k = 0; k < w.length; k++) for (let c = 0; c < 3; c++) rows[(y * W + x) * 4 + c] += w[k] * src[(y * cw + lo + k) * 4 + c] / 255;
    }
  });
  filterTaps(ch, H).forEach(([lo, w], y) => {
    for (let x = 0; x < W; x++) {
      const o = (y * W + x) * 4;
      for (let k = 0; k < w.length; k++) for (let c = 0; c < 3; c++) out[o + c] += w[k] * rows[((lo + k) * W + x) * 4 + c];
      if (IMAGE.channels === 1) out[o] = LUMA[0] * out[o] + LUMA[1] * out[o + 1] + LUMA[2] * out[o + 2];
    }
  });
  return out;
}

// predict's and features' [image list or null, batch]: an image list's batch is its length (it may be left out)
function sourcesBatch(x, batch) {
  const list = imageList(x);
  if (!list || batch === undefined) return [list, list ? list.length : batch];
  if (batch !== list.length) throw new TexelfitError('bad-batch', `batch is ${describe(batch)} for ${list.length} image sources: leave it out`);
  return [list, batch];
}

// Model.fromImages (model.js): the model's input for an array of image sources, read on the device.
function imagesInput(s, sources) {
  let list;
  return soon(s, () => { requireContext(s, 'read images'); return readImages(s.gpu, list); }, () => {
    list = imageList(sources);
    if (!list) throw new TexelfitError('bad-input', `fromImages needs a non-empty array of image sources, got ${kindOf(sources)}`);
  });
}
