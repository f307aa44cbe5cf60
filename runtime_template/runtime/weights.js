// ---- the weights blob ---------------------------------------------------------------------------
// Written by prep/quantize.py, where the format is drawn: header, tensor table, data (float32,
// float16, or int8 with a float32 scale per output channel), and a CRC-32 of all of it.
// The bytes are embedded (WEIGHTS, base64), or in NAME.weights.bin beside the module (WEIGHTS_FILE:
// fetched relative to import.meta.url, the bundle's only request), or given to createModel
// ({ weights: ArrayBuffer | URL }): weightBytes. decodeWeights returns every tensor as float32, one
// after another in MODEL.params order (the state_dict layout), which createModel uploads; training
// then runs in float32. Anything that does not check out (invalid base64, a wrong length, magic or
// version, a checksum mismatch, a table that does not fit the model) throws
// TexelfitError('corrupt-weights'), never silent garbage; a file that cannot be fetched,
// 'weights-unavailable'.

// The weights getWeights (weights_api.js) lists and setWeights takes: the parameters, trainable or frozen, without the big
// constants (MODEL.params[i].constant: a buffer too big for a kernel, a frozen texture that is no weight).
const WEIGHTS_LISTED = MODEL.params.filter((p) => !p.constant);

const WEIGHTS_MAGIC = 0x57465854; // "TXFW", read little-endian
const WEIGHTS_F32 = 0, WEIGHTS_F16 = 1, WEIGHTS_I8 = 2;

let weightsFrom = 'this bundle'; // where the weights being checked came from, for the messages (decodeWeights sets it)

function corruptWeights(why) {
  return new TexelfitError('corrupt-weights',
    `the weights in ${weightsFrom} are corrupted (${why}): the file was damaged; build or download it again`);
}

// The weights' bytes: `given` (createModel's options.weights: an ArrayBuffer, or a URL fetched),
// else NAME.weights.bin beside this module, else the embedded blob. Resolves to [bytes, where they
// came from, the length and CRC-32 they must have (WEIGHTS_FILE, for the file beside the module)].
async function weightBytes(given) {
  if (given instanceof ArrayBuffer) return [new Uint8Array(given), 'the ArrayBuffer given'];
  if (!given && !WEIGHTS_FILE) return [base64Bytes(WEIGHTS), 'this bundle'];
  const url = given ?? new URL(WEIGHTS_FILE.name, import.meta.url);
  try {
    const response = await fetch(url); // (same-origin credentials, the default)
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return [new Uint8Array(await response.arrayBuffer()), String(url), !given && WEIGHTS_FILE];
  } catch (e) {
    throw new TexelfitError('weights-unavailable', `the weights could not be loaded from ${url} (${e.message})`, { cause: e });
  }
}

let crcTable = null;
function crc32(bytes, end) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < end; i++) c = crcTable[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// IEEE half -> float, exactly (subnormals, signed zero, infinities and NaN included).
function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1024 + m) * 2 ** (e - 25);
}

// base64 -> bytes, natively where the browser can (Uint8Array.fromBase64)
function base64Bytes(b64) {
  try {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  } catch (e) {
    throw corruptWeights('the base64 text is not valid');
  }
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function decodeWeights(bytes, from, expect) {
  weightsFrom = from;
  const n = bytes.length;
  if (n < WEIGHTS_FORMAT.header + 4) throw corruptWeights(`${n} bytes is too short`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, n);
  const stored = view.getUint32(n - 4, true), computed = crc32(bytes, n - 4);
  if (expect && (n !== expect.bytes || stored !== expect.crc32)) {
    throw corruptWeights(`${n} bytes, CRC-32 ${stored.toString(16)}; built: ${expect.bytes} bytes, CRC-32 ${expect.crc32.toString(16)}`);
  }
  if (stored !== computed) {
    throw corruptWeights(`checksum mismatch: stored ${stored.toString(16)}, computed ${computed.toString(16)}`);
  }
  if (view.getUint32(0, true) !== WEIGHTS_MAGIC) throw corruptWeights('it is not a texelfit weights blob');
  const version = view.getUint8(4);
  if (version !== WEIGHTS_FORMAT.version) throw corruptWeights(`format version ${version}, expected ${WEIGHTS_FORMAT.version}`);
  const count = view.getUint32(8, true);
  if (count !== MODEL.params.length) {
    throw corruptWeights(`it holds ${count} tensors, the model has ${MODEL.params.length}`);
  }
  let total = 0;
  for (const p of MODEL.params) total = Math.max(total, p.offset + p.length);
  const out = new Float32Array(total);
  const end = n - 4;
  let pos = WEIGHTS_FORMAT.header + WEIGHTS_FORMAT.entry * count;
  for (let t = 0; t < count; t++) {
    const e = WEIGHTS_FORMAT.header + WEIGHTS_FORMAT.entry * t;
    const dtype = view.getUint8(e), len = view.getUint32(e + 4, true);
    const scales = view.getUint32(e + 8, true), inner = view.getUint32(e + 12, true);
    const p = MODEL.params[t];
    if (len !== p.length) throw corruptWeights(`tensor "${p.name}" has ${len} values, the model expects ${p.length}`);
    const size = dtype === WEIGHTS_F32 ? 4 * len : dtype === WEIGHTS_F16 ? 2 * len : 4 * scales + len;
    if (dtype > WEIGHTS_I8 || pos + size > end ||
        (dtype === WEIGHTS_I8 && (scales === 0 || inner === 0 || len % (scales * inner) !== 0))) {
      throw corruptWeights(`the table entry of tensor "${p.name}" does not fit the data`);
    }
    const o = p.offset;
    if (dtype === WEIGHTS_F32 && LITTLE_ENDIAN) { // (tensors start 4-byte aligned: see the padding below)
      out.set(new Float32Array(bytes.buffer, bytes.byteOffset + pos, len), o);
    } else if (dtype === WEIGHTS_F32) {
      for (let i = 0; i < len; i++) out[o + i] = view.getFloat32(pos + 4 * i, true);
    } else if (dtype === WEIGHTS_F16) {
      for (let i = 0; i < len; i++) out[o + i] = halfToFloat(view.getUint16(pos + 2 * i, true));
    } else {
      const scale = new Float32Array(scales);
      for (let c = 0; c < scales; c++) scale[c] = view.getFloat32(pos + 4 * c, true);
      const q = pos + 4 * scales;
      for (let i = 0; i < len; i++) out[o + i] = view.getInt8(q + i) * scale[Math.floor(i / inner) % scales];
    }
    pos += size + ((4 - (size % 4)) % 4);
  }
  if (pos !== end) throw corruptWeights(`${end - pos} bytes after the last tensor`);
  return out;
}
