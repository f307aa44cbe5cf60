// ---- no image input (rendered in place of images.js' image list where MODEL.image is null) ------------

// (no image input, MODEL.image is null: x is never a list of sources, and readImages is never reached)
const imageList = () => null, sourcesBatch = (x, batch) => [null, batch];
// Model.fromImages (model.js) rejects
const imagesInput = () => Promise.reject(new TexelfitError('bad-input', 'this bundle has no image input: build it with --input-normalize'));
