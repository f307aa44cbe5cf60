// ---- errors -------------------------------------------------------------------------------------
// Every rejection of the API is a TexelfitError whose `code` names the problem and whose message
// says what was wrong with the call. One class per page (kept under a registered symbol), so that
// `instanceof TexelfitError` holds across two bundles loaded into one page.
const ERROR_CLASS = Symbol.for('texelfit.TexelfitError');

function makeErrorClass() {
  return class TexelfitError extends Error {
    // (code, message, { cause, step }): internal; the page reads code, message, cause and step
    constructor(code, message, extra = {}) {
      super(`texelfit: ${message}`, 'cause' in extra ? { cause: extra.cause } : undefined);
      this.name = 'TexelfitError';
      this.code = code;
      if (extra.step !== undefined) this.step = extra.step;
    }
  };
}

if (!globalThis[ERROR_CLASS]) {
  Object.defineProperty(globalThis, ERROR_CLASS, { value: makeErrorClass(), configurable: false, enumerable: false, writable: false });
}
const TexelfitError = globalThis[ERROR_CLASS];
export { TexelfitError };
