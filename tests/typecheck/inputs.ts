// A multi-input bundle's typed API (build --inputs x,mask): x is an object keyed by input name.
// tests/test_typecheck.py builds the bundle into dist/typecheck_inputs/ first.
import { createModel, modelInfo, type Inputs } from "../../dist/typecheck_inputs/model.js";

async function main(): Promise<string[]> {
  const m = await createModel({ backend: "cpu" });
  const x: Inputs = { x: new Float32Array(2 * 7 * 16), mask: new Float32Array(2 * 7) };
  const out: Float32Array = await m.predict(x, 2);
  await m.fit(x, new Int32Array(2), { epochs: 1 });
  const grads = await m.gradients(x, new Int32Array(2));
  console.log(out.length, Object.keys(grads).length);
  return m.info.inputs.map((i) => `${i.name} [${i.shape}] ${i.dtype}`).concat(modelInfo.inputs.map((i) => i.name));
}

main();
