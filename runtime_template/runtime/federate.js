// ---- federated learning: m.federate(url, { x, y, onRound }) with `texelfit federate` ----------------
// The bridge at `url` (texelfit/bridge.py draws its endpoints) holds this page's Flower node. Each
// round: the global weights and the fit config in, a fresh optimizer and a local fit, the weight
// delta out (float32, or int8: a float32 scale per tensor, then a byte a value). Only weights travel.
// The samples y holds for the outputs' default losses (the first output's y: class indices or targets), which the
// update's metadata reports.
function ySamples(y) {
  const out = OUTPUTS[0], y0 = OUTPUTS.length > 1 ? y[out.name] : y;
  return out.loss === 'cross_entropy' ? y0.length : y0.length / out.size;
}

async function joinFederation(m, url, { x, y, onRound } = {}) {
  requireTrainable('federate');
  let headers = {};
  const call = async (path, init) => {
    const r = await fetch(new URL('/federation/' + path, url), { method: 'POST', headers, ...init }).catch((e) => {
      throw new TexelfitError('network', `${url}: ${e.message}`);
    });
    const body = await r.json().catch(() => ({}));
    if (r.ok) return body;
    throw new TexelfitError(r.status === 410 ? 'federation-closed' : r.status < 500 ? 'federation-refused' : 'network',
      `federation ${path}: ${r.status} ${body.error}`);
  };
  if (x == null || y == null) throw new TexelfitError('bad-option', 'federate(url, { x, y }) needs x and y');
  const join = await call('join', { body: JSON.stringify(WEIGHTS_LISTED.map((p) => [p.name, p.length])) });
  headers = { authorization: 'Bearer ' + join.token };
  const beat = setInterval(() => call('alive').catch(() => {}), join.heartbeat * 400);
  try {
    for (;;) {
      const t = await call('task'), { names, sizes, config: c } = t;
      if (t.wait) continue;
      const flat = new Float32Array(Uint8Array.from(atob(t.weights ?? ''), (ch) => ch.charCodeAt(0)).buffer), global = {};
      let k = 0;
      names?.forEach((n, i) => { global[n] = flat.subarray(k, k += sizes[i]); });
      if (names) await m.setWeights(global);
      if (t.done) return;
      await m.resetOptimizer();
      // (c.proximalMu: FedProx's mu, the proximal term's pull towards the global weights it started from)
      const r = await m.fit(x, y, { epochs: c.epochs, batchSize: c.batchSize, shuffle: c.shuffle, seed: t.round,
                                    optimizer: { type: c.optimizer, lr: c.lr }, proximal: { mu: c.proximalMu ?? 0 } });
      const now = await m.getWeights(), d = new Float32Array(flat.length), int8 = c.quantize === 'int8';
      k = 0;
      for (const n of names) for (const v of now[n]) d[k] = v - flat[k++];
      if (c.clip) { // --dp-clip: the delta clipped to L2 norm c.clip here, before it leaves (Flower's fixed clipping)
        const norm = Math.sqrt(d.reduce((a, v) => a + v * v, 0));
        if (norm > c.clip) d.forEach((v, j) => { d[j] = v * (c.clip / norm); });
      }
      let body = d;
      if (int8) { // one scale per tensor: max |delta| / 127
        body = new Uint8Array(4 * sizes.length + k);
        const s = new Float32Array(body.buffer, 0, sizes.length), q = new Int8Array(body.buffer, 4 * sizes.length);
        k = 0;
        sizes.forEach((n, i) => {
          const part = d.subarray(k, k + n);
          s[i] = part.reduce((a, v) => Math.max(a, Math.abs(v)), 0) / 127;
          part.forEach((v, j) => { q[k + j] = s[i] && Math.round(v / s[i]); });
          k += n;
        });
      }
      const loss = r.loss.reduce((a, b) => a + b) / r.loss.length;
      const meta = { round: t.round, samples: ySamples(y),
                     loss, format: int8 ? 'int8' : 'float32', names, sizes };
      await call('update', { headers: { ...headers, 'x-texelfit-update': JSON.stringify(meta) }, body });
      onRound?.({ round: t.round, loss, sent: body.byteLength });
    }
  } catch (e) {
    call('leave', { keepalive: true }).catch(() => {});
    throw e;
  } finally {
    clearInterval(beat);
  }
}
