// ---- no WGSL (rendered in place of webgpu.js in a bundle built without --webgpu) ---------

async function webgpuDevice() {
  throw new TexelfitError('no-webgpu', 'this bundle has no WGSL kernels: build it with --webgpu');
}

function watchDevice() {} // (never called: no model of this bundle is on WebGPU)
