// TensorFlow.js side of the EfficientNet-Lite0 benchmark: the same network built with tf.layers
// (NHWC; batch-norm folded into the conv before it, as texelfit folds it; ReLU6; padding 'same',
// which is the PyTorch model's static padding, checked in efficientnet.py), with the same weights.
import { loadF32, loadI32, tfjsInit } from './common.js';
import { PER_IMAGE, compare, timed, rowsOf, failedChecks, tfjsSteps, tfjsStepRow } from './effnet_common.js';

const tf = window.tf;

// layers: [{op: conv|dw|add|gap|dense, ...}] from efficientnet.py's tf_spec; weights [offset, shape]
// into one float32 blob
function build(layers, blob) {
  const input = tf.input({ shape: [224, 224, 3] });
  const outs = [];
  const assign = [];
  let cur = input;
  let pooled = null;
  let fc = null;
  const w = ([off, shape]) => tf.tensor(blob.subarray(off, off + shape.reduce((p, q) => p * q, 1)), shape);
  for (const l of layers) {
    let layer = null;
    const activation = l.act ?? 'linear';
    if (l.op === 'conv') {
      layer = tf.layers.conv2d({ filters: l.filters, kernelSize: l.kernel, strides: l.stride, padding: 'same',
                                 useBias: true, activation, name: l.name });
    } else if (l.op === 'dw') {
      layer = tf.layers.depthwiseConv2d({ kernelSize: l.kernel, strides: l.stride, padding: 'same', depthMultiplier: 1,
                                          useBias: true, activation, name: l.name });
    } else if (l.op === 'dense') {
      layer = tf.layers.dense({ units: l.units, name: l.name });
      fc = l;
    }
    if (l.op === 'add') cur = tf.layers.add({ name: l.name }).apply([cur, outs[l.from]]);
    else if (l.op === 'gap') cur = pooled = tf.layers.globalAveragePooling2d({ name: l.name }).apply(cur);
    else {
      cur = layer.apply(cur);
      assign.push([layer, l]);
    }
    outs.push(cur);
  }
  const model = tf.model({ inputs: input, outputs: cur });
  const trunk = tf.model({ inputs: input, outputs: pooled });
  for (const [layer, l] of assign) {
    const ws = [w(l.w), w(l.b)];
    layer.setWeights(ws);
    ws.forEach((t) => t.dispose());
  }
  // the head alone, trained on cached features: a dense layer with the classifier's weights
  const head = tf.sequential({ layers: [tf.layers.dense({ units: fc.units, inputShape: [fc.w[1][0]] })] });
  const hw = [w(fc.w), w(fc.b)];
  head.setWeights(hw);
  hw.forEach((t) => t.dispose());
  return { model, trunk, head };
}

function adam(o) {
  return tf.train.adam(o.lr, o.betas[0], o.betas[1], o.eps);
}

// one training step: minimize the mean cross-entropy; returns the loss tensor (not read back)
function step(opt, net, xb, yb, classes) {
  return tf.tidy(() => opt.minimize(() => tf.losses.softmaxCrossEntropy(tf.oneHot(yb, classes), net.apply(xb)), true));
}

async function run(a) {
  const env = await tfjsInit(tf, a.backend, a.wasmPath);
  const [x, y] = [await loadF32(a.x), await loadI32(a.y)];
  const layers = await (await fetch(a.layers)).json();
  const blob = await loadF32(a.weights);
  const t0 = performance.now();
  const { model, trunk, head } = build(layers, blob);
  env.buildMs = performance.now() - t0;
  const classes = layers[layers.length - 1].units;
  const one = x.subarray(0, PER_IMAGE);
  const predict = async (net, xs, n) => {
    const xt = tf.tensor(xs, [n, 224, 224, 3]);
    const out = net.predict(xt, { batchSize: n });
    const v = await out.data();
    xt.dispose();
    out.dispose();
    return v;
  };
  const checks = {};
  const t1 = performance.now();
  checks.logits = compare(await predict(model, one, 1), await loadF32(a.refLogits), a.checkTol);
  env.firstPredictMs = performance.now() - t1;
  checks.features = compare(await predict(trunk, x.subarray(0, 8 * PER_IMAGE), 8), await loadF32(a.refFeatures), a.checkTol);
  const bad = failedChecks(checks);
  if (bad) return { env, checks, error: bad };
  const rows = await rowsOf([
    ['predict_b1', () => timed(a.warmup, a.repeats, () => predict(model, one, 1), a.slow)],
    ['features_32', () => timed(a.warmup, a.repeats, () => predict(trunk, x, a.images), a.slow)],
    ['head_step_b8', async () => {
      // the features of the 32 images, computed once (not timed) and kept as a tensor; the head
      // trains on batches of 8 of them, a readback of the last loss ending the timed steps
      const xt = tf.tensor(x, [a.images, 224, 224, 3]);
      const feats = trunk.predict(xt, { batchSize: a.images });
      xt.dispose();
      await feats.data();
      const ys = tf.tensor1d(y.subarray(0, a.images), 'int32');
      const opt = adam(a.optimizer);
      const perEpoch = Math.ceil(a.images / a.batch);
      let k = 0;
      const one = () => {
        const i = k++ % perEpoch;
        const xb = feats.slice([i * a.batch, 0], [a.batch, -1]);
        const yb = ys.slice([i * a.batch], [a.batch]);
        const l = step(opt, head, xb, yb, classes);
        xb.dispose();
        yb.dispose();
        return l;
      };
      // warm-up: an epoch (compiles); then as many steps as texelfit's timed part
      const r = await tfjsSteps(one, perEpoch, perEpoch * (a.headEpochs - 1));
      feats.dispose();
      ys.dispose();
      return r;
    }],
    ['finetune_step_b8', async () => {
      const opt = adam(a.optimizer);
      const yb = tf.tensor1d(y.subarray(0, a.batch), 'int32');
      const xs = x.subarray(0, a.batch * PER_IMAGE);
      const r = await tfjsStepRow(() => {
        const xb = tf.tensor(xs, [a.batch, 224, 224, 3]); // uploaded every step, as texelfit's fit does
        const l = step(opt, model, xb, yb, classes);
        xb.dispose();
        return l;
      }, a);
      yb.dispose();
      return r;
    }],
  ], a.rows);
  env.numTensors = tf.memory().numTensors;
  return { env, checks, rows };
}

window.bench = { run };
window.benchReady = true;
