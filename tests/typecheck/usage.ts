// A web developer's use of a generated bundle, type-checked against its NAME.d.ts by `npm run typecheck`.
// tests/test_typecheck.py builds the bundle into dist/typecheck/ first.
import { createModel, modelInfo, TexelfitError, type Model, type RoundInfo, type StepInfo, type TokenizedText, type Weights } from "../../dist/typecheck/model.js";

async function main(canvas: HTMLCanvasElement): Promise<number> {
  const m: Model = await createModel({ canvas, maxTextureSize: 4096, precision: "float32", backend: "webgl2" });
  const info = m.info;
  const features = info.inputShape.reduce((a, b) => a * b, 1);
  const x = new Float32Array(8 * features);
  const y = new Int32Array(8);
  const out: Float32Array = await m.predict(x, 8);
  const result = await m.fit(x, y, {
    batchSize: 4,
    epochs: 2,
    shuffle: false,
    loss: "cross_entropy",
    optimizer: { type: "adamw", lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 },
    onStep: (s: StepInfo) => { for (const l of s.losses) console.log(s.step, s.epoch, l.step, l.loss.toFixed(3)); },
  });
  const last: number = result.loss[result.loss.length - 1];
  const w: Weights = await m.getWeights();
  await m.setWeights({ "0.bias": w["0.bias"] });
  const g = await m.gradients(x, y, { loss: "cross_entropy" });
  m.pause();
  m.resume();
  const state: "idle" | "training" | "paused" | "lost" = m.state;
  await m.save("key");
  await m.restore("key");
  const keys: string[] = await m.listCheckpoints();
  const deleted: boolean = await m.deleteCheckpoint(keys[0]);
  // image sources (a bundle built with --input-normalize), and weights from elsewhere
  const img = new Image();
  const pixels: Float32Array = await m.fromImages([img, canvas, new ImageData(4, 4)]);
  const probs: Float32Array = await m.predict([img, canvas]);
  await m.fit([img, canvas], new Int32Array([1, 2]), { epochs: 1 });
  const norm = m.info.image ? m.info.image.mean[0] : 0;
  const m2 = await createModel({ weights: new URL("model.weights.bin", location.href) });
  m2.dispose();
  // text (a bundle built with --tokenizer): token ids and attention mask, [N, T] each
  const text: TokenizedText = await m.fromText(["Hello, world!", "a second text"]);
  const ids: Int32Array = text.input_ids, mask: Int32Array = text.attention_mask;
  console.log(pixels.length, probs.length, norm, ids.length, mask.length);
  // federated learning with `texelfit federate` (its bridge serves this page)
  await m.federate(location.origin, { x, y, onRound: (r: RoundInfo) => console.log(r.round, r.loss.toFixed(3), r.sent) });
  // the page forwards its visibility to a model in a worker the same way: pause() / resume()
  document.addEventListener("visibilitychange", () => (document.hidden ? m.pause() : m.resume()));
  try {
    await m.predict(x, 1000);
  } catch (e) {
    if (e instanceof TexelfitError) console.log(e.code, e.step, e.cause);
  }
  m.dispose();
  console.log(modelInfo.weights.map((p) => p.name), out.length, g["0.weight"].length, state, info.precision, info.backend, deleted);
  return last;
}

export { main };
