// ---- no tokenizer (rendered in place of tokenizer.js where the input is one sequence (T,) but the bundle
// was built without --tokenizer, after model.js; an image model has no fromText at all) -------------------

addMethods({
  fromText() {
    return Promise.reject(new TexelfitError('no-tokenizer', 'this bundle has no tokenizer: build it with --tokenizer'));
  },
});
