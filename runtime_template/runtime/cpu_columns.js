// ---- column-blocked convs on the CPU backend (a bundle with a column-blocked conv forward; no_cpu_columns.js
// otherwise) ---------

// Where texel k of position ow of a row of a column-blocked tensor lies (webgl2/blocking.py: column_blocked; b positions a
// block, qb blocks a row, c4h texels a half): texel column (k - g*c4h) * qb + ow / b of part b*g + ow % b, g = k / c4h
// its half (the interleave_cols kernel reads them so: codegen/ops/conv_kl.py). [part, texel column]
function cpuColumnAt(ow, k, b, qb, c4h) {
  const g = Math.floor(k / c4h);
  return [b * g + ow % b, (k - g * c4h) * qb + Math.floor(ow / b)];
}

// A column-blocked conv forward (c.colblock, layout.py) writes its output as such parts, out0.. . Its generic
// kernel computes the whole rows as one output, then the texels are dealt out, zeros past c.ow and c.oc4. One
// reading its input as such parts (c.colin: layout.py column_only) gets them interleaved first, as the generic kernel
// reads it. (Only the draw into all the parts runs here: runsAt.)
function cpuColumns(generic) {
  return (c, inputs, outputs, u, rows) => {
    if (!c.colblock) return generic(c, inputs, outputs, u, rows);
    const b = c.colblock, nh = c.halves.length, c4 = c.oc4, width = c.ow * c4;
    if (c.colin) {
      const xrows = rows / c.oh * c.ih, xw = c.iw * c.ic4, qb = Math.ceil(c.iw / b), c4h = Math.ceil(c.ic4 / nh);
      const X = { data: new Float32Array(xrows * xw * 4), width: xw, height: xrows, spec: inputs[0].spec };
      for (let r = 0; r < xrows; r++) {
        for (let iw = 0; iw < c.iw; iw++) {
          for (let k = 0; k < c.ic4; k++) {
            const [p, col] = cpuColumnAt(iw, k, b, qb, c4h), at = texelAt(inputs[p], r, col);
            X.data.set(inputs[p].data.subarray(at, at + 4), texelAt(X, r, iw * c.ic4 + k));
          }
        }
      }
      inputs = [X, ...inputs.slice(nh * b)];
    }
    const all = { data: new Float32Array(rows * width * 4), width, height: rows, spec: outputs[0].spec };
    generic(c, inputs, [all], u, rows);
    const qb = Math.ceil(c.ow / b), c4h = Math.ceil(c4 / nh);
    for (let r = 0; r < rows; r++) {
      for (let ow = 0; ow < b * qb; ow++) {
        for (let k = 0; k < nh * c4h; k++) {
          const [p, col] = cpuColumnAt(ow, k, b, qb, c4h), part = outputs[p], at = texelAt(part, r, col);
          const from = texelAt(all, r, ow * c4 + k);
          if (ow < c.ow && k < c4) part.data.set(all.data.subarray(from, from + 4), at);
          else part.data.fill(0, at, at + 4);
        }
      }
    }
  };
}
