// The same bundle used from a module worker (lib "WebWorker": no DOM, no HTMLCanvasElement), type-checked
// by `npm run typecheck`. The page forwards its visibility, as the README shows.
import { createModel, TexelfitError, type StepInfo } from "../../dist/typecheck/model.js";

const m = await createModel({ canvas: new OffscreenCanvas(1, 1), contextRestoreTimeout: 5000 });
self.onmessage = (e: MessageEvent<{ hidden?: boolean; x?: Float32Array; y?: Int32Array }>) => {
  if (e.data.hidden !== undefined) {
    if (e.data.hidden) m.pause();
    else m.resume();
  }
  const { x, y } = e.data;
  if (x && y) {
    m.fit(x, y, {
      epochs: 1,
      onStep: ({ step, losses }: StepInfo) => { for (const l of losses) self.postMessage({ step, lossStep: l.step, loss: l.loss }); },
    }).then((r) => self.postMessage({ done: r.loss.length }), (err: unknown) => {
      if (err instanceof TexelfitError) self.postMessage({ error: err.code, step: err.step });
    });
  }
};
console.log(await m.listCheckpoints(), await m.deleteCheckpoint("old"));
console.log((await m.fromImages([await createImageBitmap(new ImageData(2, 2)), new OffscreenCanvas(2, 2)])).length);

export {};
