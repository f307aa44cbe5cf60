// ---- raw GL: context, capability probe, program compilation ------------------------------------

const VERTEX_SHADER = `#version 300 es
// texelfit: one triangle that covers the viewport; no vertex attributes
void main() {
  vec2 p = vec2(float((gl_VertexID << 1) & 2), float(gl_VertexID & 2));
  gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
}
`;


// `given`: the canvas is the page's (createModel options.canvas).
function getContext(canvas, given) {
  const gl = canvas.getContext('webgl2', {
    alpha: false, antialias: false, depth: false, stencil: false,
    premultipliedAlpha: false, preserveDrawingBuffer: false, powerPreference: 'high-performance',
  });
  if (!gl) {
    throw new TexelfitError('no-webgl2', given
      ? 'the canvas given to createModel gives no WebGL2 context: it may have another context already (a canvas holds one '
        + 'kind only: call getContext("webgl2") on it first, or pass a fresh canvas), or this browser lacks WebGL2'
      : 'WebGL2 is not available (this browser gives no webgl2 context)');
  }
  return gl;
}

const PRECISIONS = ['float32', 'float16', 'rgba8'];

// ---- GL errors: gl.getError() is a round trip to the GPU process in Chromium, so the runtime asks only
// where a failure would otherwise pass silently: after allocating the textures (createModel, a restore),
// at a fit's block readbacks and at snapshots. A WebGL error flag stays set until read, so a clean
// answer vouches for every command since the last one.
const GL_ERRORS = { 1280: 'INVALID_ENUM', 1281: 'INVALID_VALUE', 1282: 'INVALID_OPERATION', 1285: 'OUT_OF_MEMORY',
  1286: 'INVALID_FRAMEBUFFER_OPERATION' };

// The GL errors set now (cleared), as a TexelfitError (out-of-memory when the GPU ran out of it, else
// gpu-error) that names them and `what`; null for none. A lost context is not one (the lifecycle's).
function glFailure(gl, what) {
  const names = new Set();
  for (let i = 0, e; i < 8 && (e = gl.getError()) && e !== gl.CONTEXT_LOST_WEBGL; i++) names.add('GL_' + (GL_ERRORS[e] ?? e));
  return names.size ? new TexelfitError(names.has('GL_OUT_OF_MEMORY') ? 'out-of-memory' : 'gpu-error',
    `the GPU reported ${[...names].join(', ')} ${what}`) : null;
}

// Device limits and extensions, probed once and kept as data. The precision tier is the best
// the device renders to (float32, then half floats, then RGBA8 bytes) unless one is forced.
function probe(gl, options) {
  const caps = {
    maxTextureSize: gl.getParameter(gl.MAX_TEXTURE_SIZE),
    maxDrawBuffers: gl.getParameter(gl.MAX_DRAW_BUFFERS),
    maxTextureUnits: gl.getParameter(gl.MAX_TEXTURE_IMAGE_UNITS),
    floatRenderTargets: gl.getExtension('EXT_color_buffer_float') !== null,
    parallelCompile: gl.getExtension('KHR_parallel_shader_compile'),
  };
  caps.halfFloatRenderTargets = caps.floatRenderTargets || gl.getExtension('EXT_color_buffer_half_float') !== null;
  const available = { float32: caps.floatRenderTargets, float16: caps.halfFloatRenderTargets, rgba8: true };
  const wanted = options.precision ?? PRECISIONS.find((p) => available[p]);
  if (!PRECISIONS.includes(wanted)) {
    throw new TexelfitError('bad-option', `precision must be one of ${PRECISIONS.join(', ')}, got ${wanted}`);
  }
  if (!available[wanted]) {
    const ext = wanted === 'float32' ? 'EXT_color_buffer_float' : 'EXT_color_buffer_half_float';
    throw new TexelfitError('unsupported-precision', `precision "${wanted}" needs ${ext}, which this device lacks`);
  }
  caps.precision = wanted;
  let limit = caps.maxTextureSize;
  if (options.maxTextureSize !== undefined) {
    const m = options.maxTextureSize;
    if (!Number.isInteger(m) || m < 4) {
      throw new TexelfitError('bad-option', `maxTextureSize must be an integer of at least 4, got ${m}`);
    }
    limit = Math.min(limit, m);
  }
  caps.textureLimit = limit;
  // render targets a pass can write at once; sample-blocked passes need MODEL.sampleBlock (runner.js)
  caps.drawBuffers = Math.min(caps.maxDrawBuffers, gl.getParameter(gl.MAX_COLOR_ATTACHMENTS));
  if (options.maxDrawBuffers !== undefined) {
    const m = options.maxDrawBuffers;
    if (!Number.isInteger(m) || m < 1) {
      throw new TexelfitError('bad-option', `maxDrawBuffers must be a positive integer, got ${m}`);
    }
    caps.drawBuffers = Math.min(caps.drawBuffers, m);
  }
  return caps;
}

function numberedSource(source, badLines) {
  return source.split('\n').map((line, i) => {
    const n = i + 1;
    return `${badLines.has(n) ? '>>' : '  '}${String(n).padStart(4)}| ${line}`;
  }).join('\n');
}

function compileError(name, source, log) {
  const bad = new Set();
  for (const m of log.matchAll(/ERROR:\s*\d+:(\d+)/g)) bad.add(Number(m[1]));
  return new TexelfitError('shader-compile',
    `kernel "${name}" failed to compile:\n${log}\n${numberedSource(source, bad)}`);
}

// The next macrotask: lets the page run, without the 4 ms clamp of nested setTimeout and without
// requestAnimationFrame (which never fires in a hidden tab). One channel serves every call.
const tasks = [];
let taskChannel = null;
function nextTask() {
  if (!taskChannel) {
    taskChannel = new MessageChannel();
    taskChannel.port1.onmessage = () => tasks.shift()();
  }
  return new Promise((resolve) => {
    tasks.push(resolve);
    taskChannel.port2.postMessage(0);
  });
}

// Wait while polling something the GPU finishes: next tasks for the first 2 ms (a readback of a
// few passes is that quick), then timers, so a long wait does not keep a core busy.
function pollWait(since) {
  return performance.now() - since < 2 ? nextTask() : new Promise((resolve) => setTimeout(resolve, 1));
}

// The vertex shader every program shares.
function compileVertexShader(gl) {
  const vs = gl.createShader(gl.VERTEX_SHADER);
  gl.shaderSource(vs, VERTEX_SHADER);
  gl.compileShader(vs);
  return vs;
}

// Compile and link programs. `units` are {kernel, source} with the final source (tiling defines in
// place); all shaders are submitted before any status is queried, so drivers with
// KHR_parallel_shader_compile compile them in parallel, polled without blocking.
async function compilePrograms(gl, caps, vs, units) {
  const built = submitPrograms(gl, vs, units);
  if (caps.parallelCompile) {
    const done = caps.parallelCompile.COMPLETION_STATUS_KHR;
    const since = performance.now();
    while (!built.every((b) => gl.getProgramParameter(b.program, done))) await pollWait(since);
  }
  return finishPrograms(gl, vs, built);
}

// The same, blocking until done.
function compileProgramsNow(gl, vs, units) {
  return finishPrograms(gl, vs, submitPrograms(gl, vs, units));
}

function submitPrograms(gl, vs, units) {
  const built = units.map((unit) => {
    const fs = gl.createShader(gl.FRAGMENT_SHADER);
    gl.shaderSource(fs, unit.source);
    gl.compileShader(fs);
    return { unit, fs, program: null };
  });
  for (const b of built) {
    b.program = gl.createProgram();
    gl.attachShader(b.program, vs);
    gl.attachShader(b.program, b.fs);
    gl.linkProgram(b.program);
  }
  return built;
}

// The programs, ready to use; null where the context was lost meanwhile (nothing to report).
function finishPrograms(gl, vs, built) {
  if (gl.isContextLost()) return null;
  if (!gl.getShaderParameter(vs, gl.COMPILE_STATUS)) {
    throw new TexelfitError('shader-compile', `vertex shader failed to compile: ${gl.getShaderInfoLog(vs)}`);
  }
  const programs = built.map(({ unit, fs, program }) => {
    const kernel = unit.kernel;
    if (!gl.getProgramParameter(program, gl.LINK_STATUS)) {
      if (!gl.getShaderParameter(fs, gl.COMPILE_STATUS)) throw compileError(kernel.name, unit.source, gl.getShaderInfoLog(fs));
      throw new TexelfitError('shader-link', `kernel "${kernel.name}" failed to link: ${gl.getProgramInfoLog(program)}`);
    }
    gl.useProgram(program);
    kernel.inputs.forEach((name, unit) => gl.uniform1i(gl.getUniformLocation(program, name), unit));
    const uniforms = [];
    for (const name of kernel.uniforms) {
      const loc = gl.getUniformLocation(program, name);
      if (loc !== null) uniforms.push({ loc, name, isInt: INT_UNIFORMS.has(name), value: undefined }); // value: last set
    }
    return { program, uniforms, kernel, shader: fs };
  });
  return programs;
}
