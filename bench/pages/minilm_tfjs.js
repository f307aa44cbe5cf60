// TensorFlow.js side of the MiniLM benchmark (bench/minilm.py). tf.layers has no attention layer, so
// the same encoder is written with tf ops, as texelfit.minilm.MiniLMEncoder computes it: word embedding
// of the ids + the position rows + token type 0, LayerNorm; per layer the self-attention with the
// additive mask, the feed-forward with exact (erf) GELU, two post-LayerNorms; the mean over the
// unmasked tokens, L2-normalised; a Linear head on it. The weights are the PyTorch state_dict's,
// written by Python into one float32 blob ({name: [offset, shape]}; Linear weights [out, in]).
import { loadF32, loadI32, tfjsInit } from './common.js';
import { compare, timed, rowsOf, failedChecks, tfjsSteps, tfjsStepRow } from './effnet_common.js';

const tf = window.tf;
const HEADS = 12;
const FLOAT32_MIN = -3.4028234663852886e38;

function tensors(spec, blob, variables) {
  const w = {};
  for (const [name, [off, shape]] of Object.entries(spec)) {
    const size = shape.reduce((p, q) => p * q, 1);
    const t = tf.tensor(blob.subarray(off, off + size), shape);
    w[name] = variables(name) ? tf.variable(t) : t;
  }
  return w;
}

const linear = (x, w, b) => tf.add(tf.matMul(x, w, false, true), b); // x [M, in], w [out, in]
function layerNorm(x, g, b) {
  const { mean, variance } = tf.moments(x, -1, true);
  return x.sub(mean).div(variance.add(1e-12).sqrt()).mul(g).add(b);
}
const gelu = (x) => x.mul(0.5).mul(tf.erf(x.mul(Math.SQRT1_2)).add(1));

function encoderLayer(w, k, h, additive, n, t) { // h [n*t, F]
  const p = (s) => w[`bert.encoder.layer.${k}.${s}`];
  const f = h.shape[1];
  const d = f / HEADS;
  const heads = (z) => z.reshape([n, t, HEADS, d]).transpose([0, 2, 1, 3]);
  const q = heads(linear(h, p('attention.self.query.weight'), p('attention.self.query.bias')));
  const kk = heads(linear(h, p('attention.self.key.weight'), p('attention.self.key.bias')));
  const v = heads(linear(h, p('attention.self.value.weight'), p('attention.self.value.bias')));
  const scores = tf.matMul(q, kk, false, true).mul(1 / Math.sqrt(d)).add(additive);
  const ctx = tf.matMul(tf.softmax(scores), v).transpose([0, 2, 1, 3]).reshape([n * t, f]);
  const att = layerNorm(linear(ctx, p('attention.output.dense.weight'), p('attention.output.dense.bias')).add(h),
                        p('attention.output.LayerNorm.weight'), p('attention.output.LayerNorm.bias'));
  const inter = gelu(linear(att, p('intermediate.dense.weight'), p('intermediate.dense.bias')));
  return layerNorm(linear(inter, p('output.dense.weight'), p('output.dense.bias')).add(att),
                   p('output.LayerNorm.weight'), p('output.LayerNorm.bias'));
}

// ids, mask: int32 tensors [n, t]; layers [from, to) of the encoder; h: the hidden state entering `from`
function embed(w, ids) {
  const [n, t] = ids.shape;
  const e = tf.gather(w['bert.embeddings.word_embeddings.weight'], ids.reshape([n * t]))
    .add(tf.tile(w.position_embeddings.slice([0, 0], [t, -1]), [n, 1]))
    .add(w.token_type_0.reshape([1, -1])); // (texelfit.minilm's buffer: token type 0's row, the only one read)
  return layerNorm(e, w['bert.embeddings.LayerNorm.weight'], w['bert.embeddings.LayerNorm.bias']);
}
function layers(w, h, mask, from, to) {
  const [n, t] = mask.shape;
  const additive = tf.sub(1, mask.toFloat()).mul(FLOAT32_MIN).reshape([n, 1, 1, t]);
  for (let k = from; k < to; k++) h = encoderLayer(w, k, h, additive, n, t);
  return h;
}
function pool(h, mask) {
  const [n, t] = mask.shape;
  const m = mask.toFloat().reshape([n, t, 1]);
  const mean = h.reshape([n, t, -1]).mul(m).sum(1).div(m.sum(1).maximum(1e-9));
  return mean.div(mean.norm('euclidean', 1, true).maximum(1e-12));
}
const head = (w, e) => linear(e, w['head.weight'], w['head.bias']);
const loss = (logits, y, classes) => tf.losses.softmaxCrossEntropy(tf.oneHot(y, classes), logits);

function adam(o) {
  return tf.train.adam(o.lr, o.beta1, o.beta2, o.eps);
}

async function run(a) {
  const env = await tfjsInit(tf, a.backend, a.wasmPath);
  const spec = await (await fetch(a.spec)).json();
  const blob = await loadF32(a.weights);
  const [idsAll, maskAll, y] = [await loadI32(a.ids), await loadI32(a.mask), await loadI32(a.y)];
  const t = a.tokens;
  const n = idsAll.length / t;
  const t0 = performance.now();
  const tuned = (name) => name.startsWith('head.') || name.startsWith(`bert.encoder.layer.${a.lastLayer}.`);
  const w = tensors(spec, blob, tuned);
  env.buildMs = performance.now() - t0;
  const classes = spec['head.bias'][1][0];
  const batch = (k, size) => [tf.tensor2d(idsAll.subarray(k * t, (k + size) * t), [size, t], 'int32'),
                              tf.tensor2d(maskAll.subarray(k * t, (k + size) * t), [size, t], 'int32')];
  const embedAll = (size) => tf.tidy(() => {
    const [ids, mask] = batch(0, size);
    return pool(layers(w, embed(w, ids), mask, 0, a.layers), mask);
  });
  const readEmbeddings = async (size) => {
    const e = embedAll(size);
    const v = await e.data();
    e.dispose();
    return v;
  };
  const checks = {};
  const t1 = performance.now();
  checks.embedding_1 = compare(await readEmbeddings(1), (await loadF32(a.refEmbeddings)).subarray(0, spec['head.weight'][1][1]), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  checks.embeddings = compare(await readEmbeddings(n), await loadF32(a.refEmbeddings), a.checkTol);
  const bad = failedChecks(checks);
  if (bad) return { env, checks, error: bad };
  const rows = await rowsOf([
    ['embed_1', () => timed(a.warmup, a.repeats, () => readEmbeddings(1), a.slow)],
    ['embed_16', () => timed(a.warmup, a.repeats, () => readEmbeddings(n), a.slow)],
    ['head_step', async () => {
      // the embeddings computed once (not timed); the head trains on batches of them, a readback
      // of the last loss ending the timed steps (as texelfit's fit on cached features)
      const feats = embedAll(n);
      await feats.data();
      const ys = tf.tensor1d(y.subarray(0, n), 'int32');
      const opt = adam(a.optimizer);
      const perEpoch = Math.ceil(n / a.batch);
      let k = 0;
      const one = () => tf.tidy(() => {
        const i = k++ % perEpoch;
        const xb = feats.slice([i * a.batch, 0], [Math.min(a.batch, n - i * a.batch), -1]);
        const yb = ys.slice([i * a.batch], [xb.shape[0]]);
        return opt.minimize(() => loss(head(w, xb), yb, classes), true, [w['head.weight'], w['head.bias']]);
      });
      const r = await tfjsSteps(one, 1, a.headSteps);
      feats.dispose();
      ys.dispose();
      return r;
    }],
    ['finetune_step', async () => {
      // one Adam step of the last encoder layer and the head: the frozen layers' forward, then the
      // last layer's and the head's forward and backward, on a batch of a.batch sentences
      const opt = adam(a.optimizer);
      const yb = tf.tensor1d(y.subarray(0, a.batch), 'int32');
      const trained = Object.keys(w).filter(tuned).map((k) => w[k]);
      const r = await tfjsStepRow(() => tf.tidy(() => {
        const [ids, mask] = batch(0, a.batch);
        const below = layers(w, embed(w, ids), mask, 0, a.lastLayer);
        return opt.minimize(() => loss(head(w, pool(layers(w, below, mask, a.lastLayer, a.layers), mask)), yb, classes),
                            true, trained);
      }), a);
      yb.dispose();
      return r;
    }],
  ]);
  env.numTensors = tf.memory().numTensors;
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
