"""What a read costs on this machine's software GPU (issues 33 and 35 diagnostic, not a test): one matmul alone in
one page, its variants timed in turns, median ms a draw or dispatch.

    .venv/bin/python bench/fetch_micro.py [--rounds 5]

WebGL2: an 8-row token matmul as the row-blocked kernels compute it (512 x 384 -> 384, 8 rows of 4 outputs a fragment
into 8 render targets, the weight texels as a mat4), its texels read with texelFetch, by sampling their centres (what
the kernels do: common.glsl.j2, fetchTexel), with textureLod, with textureSize queried at each read, or not read
(values computed from the loop index: the math alone). WebGPU: the MLP's 784 -> 128 forward at batch 64 (8 samples by
2 texels an invocation, workgroups of 8, as webgpu.js sizes them), reading storage buffers, textures (textureLoad),
sampled textures (textureSampleLevel, a nearest sampler), or nothing; the same in 2 workgroups of 64; and the round
trip of a write, N dispatches of the forward at batch 8, a copy and mapAsync, for N = 0, 1, 8. Each variant's output is checked equal
to the first's (those that read nothing, and the batch of 8, excepted).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

PAGE = """<!doctype html><script>
const fill = (n) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.5);
const checksum = (a) => a.reduce((s, v, i) => s + v * ((i % 7) + 1), 0);
globalThis.glRun = (fs, ins, w, h, reps) => {
  const gl = (globalThis.gl ??= document.createElement('canvas').getContext('webgl2'));
  gl.getExtension('EXT_color_buffer_float');
  const tex = (tw, th, data) => {
    const t = gl.createTexture(); gl.bindTexture(gl.TEXTURE_2D, t); gl.texStorage2D(gl.TEXTURE_2D, 1, gl.RGBA32F, tw, th);
    if (data) gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, 0, tw, th, gl.RGBA, gl.FLOAT, data);
    for (const p of [gl.TEXTURE_MIN_FILTER, gl.TEXTURE_MAG_FILTER]) gl.texParameteri(gl.TEXTURE_2D, p, gl.NEAREST);
    return t;
  };
  const textures = ins.map(([tw, th]) => tex(tw, th, fill(tw * th * 4))), outs = Array.from({ length: 8 }, () => tex(w, h));
  const fb = gl.createFramebuffer(); gl.bindFramebuffer(gl.FRAMEBUFFER, fb);
  outs.forEach((t, i) => gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0 + i, gl.TEXTURE_2D, t, 0));
  gl.drawBuffers(outs.map((_, i) => gl.COLOR_ATTACHMENT0 + i));
  const p = gl.createProgram(), vs = '#version 300 es\\nvoid main() { gl_Position = vec4(vec2((gl_VertexID & 1) * 4 - 1, (gl_VertexID & 2) * 2 - 1), 0, 1); }';
  for (const [type, src] of [[gl.VERTEX_SHADER, vs], [gl.FRAGMENT_SHADER, fs]]) {
    const s = gl.createShader(type); gl.shaderSource(s, src); gl.compileShader(s);
    if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
    gl.attachShader(p, s);
  }
  gl.linkProgram(p); gl.useProgram(p);
  textures.forEach((t, i) => { gl.activeTexture(gl.TEXTURE0 + i); gl.bindTexture(gl.TEXTURE_2D, t); gl.uniform1i(gl.getUniformLocation(p, 'T' + i), i); });
  gl.viewport(0, 0, w, h);
  const px = new Float32Array(w * h * 4);
  const go = (n) => { for (let i = 0; i < n; i++) gl.drawArrays(gl.TRIANGLES, 0, 3); gl.readPixels(0, 0, 1, 1, gl.RGBA, gl.FLOAT, px); };
  go(2);
  const t0 = performance.now(); go(reps); const ms = (performance.now() - t0) / reps;
  gl.readBuffer(gl.COLOR_ATTACHMENT7); gl.readPixels(0, 0, w, h, gl.RGBA, gl.FLOAT, px); gl.readBuffer(gl.COLOR_ATTACHMENT0);
  [...textures, ...outs].forEach((t) => gl.deleteTexture(t)); gl.deleteFramebuffer(fb); gl.deleteProgram(p);
  return { ms, check: checksum(px) };
};
globalThis.gpuRun = async (code, bindings, uniforms, groups, reps, trips) => {
  if (!globalThis.dev) {
    const a = await navigator.gpu.requestAdapter();
    globalThis.dev = await a.requestDevice({ requiredFeatures: a.features.has('float32-filterable') ? ['float32-filterable'] : [] });
  }
  const dev = globalThis.dev, usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  const made = bindings.map((b) => {
    if (b === 'sampler') return dev.createSampler({ magFilter: 'nearest', minFilter: 'nearest' });
    if (Array.isArray(b)) {
      const t = dev.createTexture({ size: b, format: 'rgba32float', usage: GPUTextureUsage.TEXTURE_BINDING | GPUTextureUsage.COPY_DST });
      dev.queue.writeTexture({ texture: t }, fill(b[0] * b[1] * 4), { bytesPerRow: b[0] * 16 }, b);
      return t;
    }
    const buf = dev.createBuffer({ size: Math.abs(b) * 16, usage });
    if (b > 0) dev.queue.writeBuffer(buf, 0, fill(b * 4)); // (negative: the output)
    return buf;
  });
  const u = dev.createBuffer({ size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  dev.queue.writeBuffer(u, 0, new Int32Array([...uniforms, 0, 0]));
  const pipeline = dev.createComputePipeline({ layout: 'auto', compute: { module: dev.createShaderModule({ code }), entryPoint: 'main' } });
  const entries = made.map((m, binding) => ({ binding, resource: m instanceof GPUBuffer ? { buffer: m } : m instanceof GPUTexture ? m.createView() : m }));
  entries.push({ binding: made.length, resource: { buffer: u } });
  const group = dev.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries });
  const out = made.find((m, i) => bindings[i] < 0), staging = dev.createBuffer({ size: out.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const go = async (n, read) => {
    const e = dev.createCommandEncoder(), pass = e.beginComputePass();
    pass.setPipeline(pipeline); pass.setBindGroup(0, group);
    for (let i = 0; i < n; i++) pass.dispatchWorkgroups(groups);
    pass.end();
    if (read) e.copyBufferToBuffer(out, 0, staging, 0, out.size);
    dev.queue.submit([e.finish()]);
    if (read) { await staging.mapAsync(GPUMapMode.READ); const r = new Float32Array(staging.getMappedRange().slice(0)); staging.unmap(); return r; }
    await dev.queue.onSubmittedWorkDone();
  };
  await go(2);
  let t0 = performance.now(); await go(reps); const ms = (performance.now() - t0) / reps;
  const check = checksum(await go(1, true)), trip = {};
  for (const n of trips) {
    for (let i = 0; i < 3; i++) await go(n, true);
    const ts = []; for (let i = 0; i < 15; i++) { t0 = performance.now(); await go(n, true); ts.push(performance.now() - t0); }
    trip[n] = ts.sort((a, b) => a - b)[7];
  }
  made.forEach((m) => m.destroy?.()); u.destroy(); staging.destroy();
  return { ms, check, trip };
};
</script>"""


def gl_matmul(read: str, m=512, k=384, p=384) -> tuple:
    """The fragment shader, its inputs' sizes and the output's size: A (m x k/4 texels) times B (k x p/4), 8 rows of
    4 outputs a fragment, read as `read` says."""
    kq, p4 = k // 4, p // 4
    fetch = {"texelFetch": "texelFetch({t}, ivec2({x}, {y}), 0)",
             "texture": "texture({t}, (vec2({x}, {y}) + 0.5) / vec2({w}.0, {h}.0))",
             "textureLod": "textureLod({t}, (vec2({x}, {y}) + 0.5) / vec2({w}.0, {h}.0), 0.0)",
             "textureSize": "texture({t}, (vec2({x}, {y}) + 0.5) / vec2(textureSize({t}, 0)))",
             "none": "vec4(float({y}) * 0.001 + float({x}))"}[read]
    b = [fetch.format(t="T1", x="col", y=f"4 * k4 + {i}", w=p4, h=k) for i in range(4)]
    a = [fetch.format(t="T0", x="k4", y=f"8 * rb + {r}", w=kq, h=m) for r in range(8)]
    lines = ["#version 300 es", "precision highp float; precision highp int; precision highp sampler2D;",
             "uniform sampler2D T0; uniform sampler2D T1;",
             *[f"layout(location = {r}) out vec4 o{r};" for r in range(8)],
             "void main() {", "  int col = int(gl_FragCoord.x), rb = int(gl_FragCoord.y);",
             *[f"  vec4 acc{r} = vec4(0.0);" for r in range(8)],
             f"  for (int k4 = 0; k4 < {kq}; k4++) {{", f"    mat4 B = mat4({', '.join(b)});",
             *[f"    acc{r} += B * {a[r]};" for r in range(8)], "  }",
             *[f"  o{r} = acc{r};" for r in range(8)], "}"]
    return "\n".join(lines), [[kq, m], [p4, k]], p4, m // 8


def wgsl_dense(read: str, workgroup=8, batch=64, k=784, n=128) -> tuple:
    """The compute shader and its bindings: X (batch x k/4 texels) times W (n x k/4), 8 samples by 2 output texels
    an invocation, read as `read` says; the uniforms and the workgroups."""
    k4, n4 = k // 4, n // 4
    size = {"X": (k4, batch), "W": (k4, n)}

    def load(name, row, col):
        if read == "storage":
            return f"{name}[({row}) * {k4} + {col}]"
        if read == "textureLoad":
            return f"textureLoad({name}, vec2<i32>({col}, {row}), 0)"
        if read == "sample":
            w, h = size[name]
            return f"textureSampleLevel({name}, S, (vec2<f32>(vec2<i32>({col}, {row})) + 0.5) / vec2<f32>({w}.0, {h}.0), 0.0)"
        return f"vec4<f32>(f32({col}) * 0.001 + f32({row}))"
    texels = read in ("textureLoad", "sample")
    decl = [f"@group(0) @binding({i}) var {name}: texture_2d<f32>;" if texels else
            f"@group(0) @binding({i}) var<storage, read> {name}: array<vec4<f32>, {size[name][0] * size[name][1]}>;"
            for i, name in enumerate(("X", "W"))]
    decl += [f"@group(0) @binding(2) var<storage, read_write> O: array<vec4<f32>, {batch * n4}>;"]
    decl += ["@group(0) @binding(3) var S: sampler;"] if read == "sample" else []
    u = 4 if read == "sample" else 3
    lines = [*decl, "struct D { rows: i32, width: i32, batch: i32, pad: i32, }", f"@group(0) @binding({u}) var<uniform> d: D;",
             f"@compute @workgroup_size({workgroup})", "fn main(@builtin(global_invocation_id) g: vec3<u32>) {",
             "  let w = u32(d.width) / 2u;", "  if (g.x >= u32(d.rows) * w) { return; }",
             "  let row = i32(g.x / w) * 8; let col = i32(g.x % w) * 2;",
             *[f"  var a{r}_{c}: vec4<f32> = vec4<f32>(0.0);" for r in range(8) for c in range(2)],
             "  _ = X[0]; _ = W[0];" if read == "none" else "",
             f"  for (var i: i32 = 0; i < {k4}; i++) {{",
             *[f"    let w{c}_{j} = {load('W', f'4 * (col + {c}) + {j}', 'i')};" for c in range(2) for j in range(4)]]
    for r in range(8):
        lines.append(f"    let x{r} = {load('X', f'row + {r}', 'i')};")
        lines += [f"    a{r}_{c} += vec4<f32>(dot(x{r}, w{c}_0), dot(x{r}, w{c}_1), dot(x{r}, w{c}_2), dot(x{r}, w{c}_3));"
                  for c in range(2)]
    lines += ["  }", *[f"  O[(row + {r}) * {n4} + col + {c}] = a{r}_{c};" for r in range(8) for c in range(2)], "}"]
    binds = ([list(size["X"]), list(size["W"])] if texels else [size["X"][0] * size["X"][1], size["W"][0] * size["W"][1]])
    binds += [-(batch * n4)] + (["sampler"] if read == "sample" else [])
    invocations = (batch // 8) * (n4 // 2)
    return "\n".join(line for line in lines if line), binds, [batch // 8, n4, batch, 0], -(-invocations // workgroup)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright
    gl = {r: gl_matmul(r) for r in ("texelFetch", "texture", "textureLod", "textureSize", "none")}
    gpu = {r: wgsl_dense(r) for r in ("storage", "textureLoad", "sample", "none")}
    gpu["storage, 4 workgroups of 32"] = wgsl_dense("storage", workgroup=32)
    gpu["storage, 2 workgroups of 64"] = wgsl_dense("storage", workgroup=64)
    gpu["storage, batch 8"] = wgsl_dense("storage", batch=8)  # (0.2-0.4 ms: the round trips')
    times, checks, trips = {}, {}, []
    with tempfile.TemporaryDirectory() as site:
        with open(os.path.join(site, "index.html"), "w") as f:
            f.write(PAGE)
        httpd, url = run.serve(site)
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=run.CHROMIUM, headless=True, args=run.CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
                page = b.new_page()
                page.goto(url + "/index.html")
                for _ in range(args.rounds):
                    for name, (fs, ins, w, h) in gl.items():
                        r = page.evaluate("([f, i, w, h]) => glRun(f, i, w, h, 8)", [fs, ins, w, h])
                        times.setdefault(f"WebGL2 {name}", []).append(r["ms"])
                        checks.setdefault(f"WebGL2 {name}", r["check"])
                    for name, (code, binds, uniforms, groups) in gpu.items():
                        r = page.evaluate("([c, b, u, g, t]) => gpuRun(c, b, u, g, 40, t)",
                                          [code, binds, uniforms, groups, [0, 1, 8] if name == "storage, batch 8" else []])
                        times.setdefault(f"WebGPU {name}", []).append(r["ms"])
                        checks.setdefault(f"WebGPU {name}", r["check"])
                        trips += [r["trip"]] if r["trip"] else []
                b.close()
        finally:
            httpd.shutdown()
    for api, first in (("WebGL2", "texelFetch"), ("WebGPU", "storage")):
        for name, ms in times.items():
            if name.startswith(api):
                ok = "none" in name or "batch 8" in name or abs(checks[name] - checks[f"{api} {first}"]) <= 1e-6 * abs(checks[f"{api} {first}"])
                print(f"{name:36s} median {statistics.median(ms):7.2f} ms  ({min(ms):.2f}-{max(ms):.2f})"
                      f"{'' if ok else '  OUTPUT DIFFERS'}")
    for n in ("0", "1", "8"):
        vals = [t[n] for t in trips]
        print(f"WebGPU write + {n} dispatches + mapAsync: median {statistics.median(vals):.2f} ms ({min(vals):.2f}-{max(vals):.2f})")


if __name__ == "__main__":
    main()
