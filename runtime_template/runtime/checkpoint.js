// ---- saved progress in IndexedDB -----------------------------------------------------------------
// One record per checkpoint, under the key [model name, architecture fingerprint, key]: bundles of
// other models on the same origin never see each other's checkpoints, even under the same key. The
// fingerprint (codegen/render.py) hashes the layers' ops, attributes and parameter shapes. A save
// is one readwrite transaction, which IndexedDB applies whole or not at all: an interrupted save
// leaves the previous checkpoint valid, and concurrent saves to one key leave one record.

const DB_NAME = 'texelfit';
const STORE = 'checkpoints';
const CHECKPOINT_FORMAT = 'texelfit-checkpoint-2';

const scopedKey = (key) => [MODEL.name, MODEL.fingerprint, key];

function openDb() {
  return new Promise((resolve, reject) => {
    if (typeof indexedDB === 'undefined') {
      reject(new TexelfitError('no-storage', 'IndexedDB is not available here'));
      return;
    }
    const req = indexedDB.open(DB_NAME, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(storageError(req.error, 'open the checkpoint database'));
  });
}

function storageError(err, what) {
  if (err instanceof TexelfitError) return err;
  if (err && err.name === 'QuotaExceededError') {
    return new TexelfitError('quota-exceeded', `cannot ${what}: the storage quota is exceeded (${err.message})`);
  }
  return new TexelfitError('storage', `cannot ${what}: ${err ? `${err.name}: ${err.message}` : 'unknown error'}`);
}

// Run `body(store)` in one transaction; resolves to what its last request set `out.value` to.
async function transact(mode, what, body) {
  const db = await openDb();
  try {
    return await new Promise((resolve, reject) => {
      let tx;
      const out = { value: undefined };
      try {
        tx = db.transaction(STORE, mode);
        body(tx.objectStore(STORE), out);
      } catch (e) {
        reject(storageError(e, what));
        return;
      }
      tx.oncomplete = () => resolve(out.value);
      tx.onerror = () => reject(storageError(tx.error, what));
      tx.onabort = () => reject(storageError(tx.error, what));
    });
  } finally {
    db.close();
  }
}

function writeCheckpoint(key, record) {
  return transact('readwrite', `save checkpoint "${key}"`, (s) => { s.put(record, scopedKey(key)); });
}

// The record saved under `key` by this architecture; rejects when there is none (and says so when
// another architecture has one under that key).
async function readCheckpoint(key) {
  const found = await transact('readonly', `read checkpoint "${key}"`, (s, out) => {
    const req = s.get(scopedKey(key));
    req.onsuccess = () => {
      out.value = { record: req.result };
      if (req.result !== undefined) return;
      const keys = s.getAllKeys(); // few records: the other models' keys are looked at only here
      keys.onsuccess = () => {
        out.value.other = keys.result.find((k) => Array.isArray(k) && k[2] === key);
      };
    };
  });
  if (found.record !== undefined) return found.record;
  if (found.other) {
    throw new TexelfitError('architecture-mismatch',
      `the checkpoint "${key}" was saved by a model of another architecture (${found.other[0]}, fingerprint ${found.other[1]}); `
      + `this model is ${MODEL.name}, fingerprint ${MODEL.fingerprint}`);
  }
  throw new TexelfitError('no-checkpoint', `there is no checkpoint saved under "${key}"`);
}

function listCheckpointKeys() {
  const range = IDBKeyRange.bound([MODEL.name, MODEL.fingerprint], [MODEL.name, MODEL.fingerprint, []]);
  return transact('readonly', 'list checkpoints', (s, out) => {
    const req = s.getAllKeys(range);
    req.onsuccess = () => { out.value = req.result.map((k) => k[2]).filter((k) => typeof k === 'string').sort(); };
  });
}

function deleteCheckpointKey(key) {
  return transact('readwrite', `delete checkpoint "${key}"`, (s, out) => {
    const req = s.count(scopedKey(key));
    req.onsuccess = () => {
      out.value = req.result > 0;
      s.delete(scopedKey(key));
    };
  });
}
