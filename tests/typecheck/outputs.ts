// A bundle of several outputs' typed API: predict returns `Outputs`, y is `Targets`, both keyed by output name.
// tests/test_typecheck.py builds the bundle (test_outputs.Detector: logits and box) into dist/typecheck_outputs/ first.
import { createModel, modelInfo, type Outputs, type Targets } from "../../dist/typecheck_outputs/model.js";

async function main(): Promise<string[]> {
  const m = await createModel({ backend: "cpu" });
  const x = new Float32Array(2 * 6);
  const out: Outputs = await m.predict(x, 2);
  const y: Targets = { logits: new Int32Array(2), box: new Float32Array(2 * 4) };
  const r = await m.fit(x, y, { loss: { logits: "cross_entropy", box: "mse" }, lossWeights: { box: 0.5 } });
  const grads = await m.gradients(x, y, { loss: "mse" });
  console.log(out.logits.length, out.box.length, r.loss.length, Object.keys(grads).length);
  return m.info.outputs.map((o) => `${o.name} [${o.shape}] ${o.loss}`).concat(modelInfo.outputs.map((o) => o.name));
}

main();
