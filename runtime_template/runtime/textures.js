// ---- texture pool and the channel-packed layout -------------------------------------------------
// The layout is drawn in codegen/webgl2/layout.py. A packing pk = [rows, r2, blocks, chans, s_r1, s_r2, s_b, s_c]
// says: texel (x = b * C4 + c4, y = r) holds channels 4*c4 .. 4*c4+3 of (row r, block b), and
// element (r, b, c) of the source array sits at (r / r2 | 0) * s_r1 + (r % r2) * s_r2 + b * s_b + c * s_c.

// Source (from `offset`) -> texel rows [0, rows) of `dst` (rows x blocks x ceil4(chans) floats); padding zeroed.
function packTexels(src, offset, pk, rows, dst) {
  const r2 = pk[1], blocks = pk[2], chans = pk[3], sr1 = pk[4], sr2 = pk[5], sb = pk[6], sc = pk[7];
  const stride = Math.ceil(chans / 4) * 4;
  let d = 0;
  for (let r = 0; r < rows; r++) {
    const rowBase = offset + Math.floor(r / r2) * sr1 + (r % r2) * sr2;
    for (let b = 0; b < blocks; b++) {
      const s = rowBase + b * sb;
      for (let c = 0; c < chans; c++) dst[d + c] = src[s + c * sc];
      for (let c = chans; c < stride; c++) dst[d + c] = 0;
      d += stride;
    }
  }
}

// Whether packing one sample of `size` floats into `rows` texel rows is a plain copy (the texels
// hold the sample's floats in their order, no padding: an MLP's input): packTexels then is one
// memcpy, `set`, where its loop costs the page a tenth of a millisecond a batch of 64 x 784.
function isPlainPacking(pk, rows, size) {
  if (rows * pk[2] * Math.ceil(pk[3] / 4) * 4 !== size) return false; // padded
  const texels = new Float32Array(size);
  packTexels(Float32Array.from({ length: size }, (_, i) => i), 0, pk, rows, texels);
  return texels.every((v, i) => v === i);
}

// Texel rows [0, rows) of `src` -> the source array `dst` (from `offset`).
function unpackTexels(src, pk, rows, dst, offset) {
  const r2 = pk[1], blocks = pk[2], chans = pk[3], sr1 = pk[4], sr2 = pk[5], sb = pk[6], sc = pk[7];
  const stride = Math.ceil(chans / 4) * 4;
  let d = 0;
  for (let r = 0; r < rows; r++) {
    const rowBase = offset + Math.floor(r / r2) * sr1 + (r % r2) * sr2;
    for (let b = 0; b < blocks; b++) {
      const s = rowBase + b * sb;
      for (let c = 0; c < chans; c++) dst[s + c * sc] = src[d + c];
      d += stride;
    }
  }
}

// How a texture stores its floats, by precision tier:
//   'f32'    RGBA32F, one logical texel per texel
//   'f16'    RGBA16F (the float16 tier's activations and their gradients)
//   'rgba8'  RGBA8, each float32 in the 4 bytes of one texel: a logical texel is 4 texels wide.
// In the float16 tier what half floats cannot hold safely (weights, optimizer state, their
// gradients, labels, targets, the loss ring, the output that is read back, token ids) stays exact in rgba8;
// the outputs of one pass share one format.
const FORMATS = {
  f32: { internal: 'RGBA32F', expand: 1 },
  f16: { internal: 'RGBA16F', expand: 1 },
  rgba8: { internal: 'RGBA8', expand: 4 },
};

function textureFormats(precision) {
  const formats = new Map();
  for (const spec of TEXTURES) {
    let f = precision === 'float32' ? 'f32' : 'rgba8';
    if (precision === 'float16' && (spec.role === 'activation' || spec.role === 'gradient') &&
        !MODEL.outputs.some((o) => o.texture === spec.name) && !MODEL.textures.ints?.includes(spec.name)) f = 'f16';
    formats.set(spec.name, f);
  }
  const lists = [SCHEDULE.forward, SCHEDULE.backward, ...SCHEDULE.loss.flatMap(Object.values), ...Object.values(SCHEDULE.optimizer)];
  for (const list of lists) {
    for (const p of list) {
      const names = p.outputs.map((i) => TEXTURES[i].name);
      if (new Set(names.map((n) => formats.get(n))).size > 1) for (const n of names) formats.set(n, 'rgba8');
    }
  }
  return formats;
}

function makeTexture(gl, internal, pw, ph) {
  const t = gl.createTexture();
  gl.bindTexture(gl.TEXTURE_2D, t);
  gl.texStorage2D(gl.TEXTURE_2D, 1, gl[internal], pw, ph);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE);
  return t;
}

// One record per texture of the plan. Double-buffered ones hold a ping-pong pair and `cur`, the
// index of the half that holds the current value. A texture wider or higher than the limit is
// folded: its texels, in row-major order, fill rows of `pw` texels (layout.py); so is one with spec.fold.
// Textures of one storage (spec.storage >= 0: codegen/memory.py, their lifetimes never overlap) and
// one format are one texture, as large as the largest of them in each dimension.
function createTextures(gl, limit, precision) {
  const records = new Map();
  const formats = textureFormats(precision);
  const shared = new Map(); // storage and format -> { pw, ph, tex, recs }
  for (const spec of TEXTURES) {
    const format = formats.get(spec.name);
    const expand = FORMATS[format].expand;
    const width = spec.width * expand;
    const fits = width <= limit && spec.height <= limit;
    // (a blocked part of few rows, spec.fold, is folded on every device: webgl2/blocking.py: blocked_fold)
    const pw = fits ? (spec.fold || spec.width) * expand : limit - (limit % expand); // whole logical texels per row
    const ph = Math.ceil((width * spec.height) / pw);
    if (ph > limit) {
      throw new TexelfitError('texture-too-large',
        `texture "${spec.name}" (${spec.width}x${spec.height} texels${expand > 1 ? `, ${width}x${spec.height} as ${format}` : ''}) ` +
        `cannot be laid out within the texture size limit of ${limit}`);
    }
    const tex = [];
    const rec = { spec, tex, cur: 0, double: spec.double, tiled: pw !== width, pw, ph, format, expand, tw: pw, th: ph };
    records.set(spec.name, rec);
    if (spec.storage >= 0) {
      const key = `${spec.storage}:${format}`;
      const s = shared.get(key) ?? { pw: 0, ph: 0, recs: [] };
      shared.set(key, { pw: Math.max(s.pw, pw), ph: Math.max(s.ph, ph), recs: [...s.recs, rec] });
      continue;
    }
    for (let i = 0; i < (spec.double ? 2 : 1); i++) tex.push(makeTexture(gl, FORMATS[format].internal, pw, ph));
  }
  for (const s of shared.values()) {
    const t = makeTexture(gl, FORMATS[s.recs[0].format].internal, s.pw, s.ph);
    for (const rec of s.recs) {
      rec.tex.push(t);
      [rec.tw, rec.th] = [s.pw, s.ph]; // (the texture's size: a kernel samples its texel centres, runner.js)
    }
  }
  return records;
}

// The samples a 'batch' pass draws (u_batch), or a 'blocks' pass (a sample-blocked forward or
// grad_input: MODEL.sampleBlock samples a row, layout.py)
function sampleRowsDrawn(rows, batch) {
  return rows === 'blocks' ? Math.ceil(batch / MODEL.sampleBlock) : batch;
}

// Physical rows holding the first `rows` logical rows of a texture.
function physicalRows(rec, rows) {
  return rec.tiled || rec.expand > 1 ? Math.ceil((rows * rec.spec.width * rec.expand) / rec.pw) : rows;
}

// The bytes of a Float32Array, as one view per array (no allocation per upload).
const byteViews = new WeakMap();
function bytesOf(data) {
  let v = byteViews.get(data);
  if (!v) {
    v = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    byteViews.set(data, v);
  }
  return v;
}

// Upload texel data (logical rows [0, rows), row-major) into the current half. An rgba8 texture
// takes the same floats as bytes: a float's 4 bytes are one texel.
// Uploads bind their texture to a unit of their own, so the runner's bindings stay (runner.js);
// WebGL2 has at least 16 texture units, and no kernel reads that many inputs.
const UPLOAD_UNIT = 15;

// Whole rows of pw texels go up in bands of at most TRANSFER_PIECE bytes (as reads do, gpu.js: read);
// a folded texture's last, partial row after them. (Not folded: pw is the width, and rows fill it.)
function uploadRows(gl, rec, data, rows) {
  gl.activeTexture(gl.TEXTURE0 + UPLOAD_UNIT);
  gl.bindTexture(gl.TEXTURE_2D, rec.tex[rec.cur]);
  const bytes = rec.format === 'rgba8';
  const src = bytes ? bytesOf(data) : data;
  const type = bytes ? gl.UNSIGNED_BYTE : gl.FLOAT;
  const texels = rows * rec.spec.width * rec.expand;
  const full = Math.floor(texels / rec.pw);
  const rest = texels - full * rec.pw;
  const band = Math.max(1, Math.floor(TRANSFER_PIECE / (rec.pw * (bytes ? 4 : 16))));
  for (let y = 0; y < full; y += band) gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, y, rec.pw, Math.min(band, full - y), gl.RGBA, type, src, y * rec.pw * 4);
  if (rest > 0) gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, full, rest, 1, gl.RGBA, type, src, full * rec.pw * 4);
}
