// ---- text inputs: fromText (build --tokenizer) --------------------------------------------------
// BERT's WordPiece as Hugging Face's tokenizer does it, the steps of texelfit/tokenizer.py one for one:
// 1. special tokens written in the text ([CLS], [MASK], ...: TOKENIZER.special, longest first) are
// those tokens; on the pieces between them: 2. clean (control characters dropped, whitespace a
// space); 3. a space around every CJK ideograph; 4. NFD, non-spacing marks dropped; 5. each
// character lower-cased alone; 6. words split at whitespace, each punctuation character a word;
// 7. greedy longest-match-first WordPiece with '##', [UNK] for a word it cannot cover or of over
// maxWordChars characters; 8. [CLS] ids [SEP] truncated and padded to TOKENIZER.length.
// The character classes are `tokenizers`' own tables (texelfit/bert_unicode.py), shipped as ranges,
// so the browser's Unicode version changes only NFD and toLowerCase.

const TOKENIZER = MODEL.tokenizer; // { length, lowercase, stripAccents, chineseChars, cleanText, maxWordChars, prefix, unk, cls, sep, pad, special, control, punctuation, mark, space, cjk }

// A class of code points from the bounds of its ranges, delta-coded (tokenizer.py: CodeClass.deltas):
// c is in it when an odd number of bounds are <= c.
function codeClass(deltas) {
  const bounds = new Int32Array(deltas.length);
  let at = 0;
  deltas.forEach((d, i) => { bounds[i] = at += d; });
  return (c) => {
    let lo = 0, hi = bounds.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (bounds[mid] <= c) lo = mid + 1; else hi = mid;
    }
    return (lo & 1) === 1;
  };
}

// The vocabulary (token -> id: a repeated token takes its last line, as Hugging Face) and the
// classes, made at the first fromText.
let wordPieces = null;
function wordPieceTables() {
  if (wordPieces) return wordPieces;
  const ids = new Map();
  VOCAB.split('\n').forEach((token, i) => ids.set(token, i));
  const t = TOKENIZER;
  wordPieces = { ids, control: codeClass(t.control), punctuation: codeClass(t.punctuation), mark: codeClass(t.mark),
                 space: codeClass(t.space), cjk: codeClass(t.cjk) };
  return wordPieces;
}

// Step 1: [[piece, id]]: id undefined for plain text, a special token's id for one.
function textPieces(text) {
  const out = [];
  let start = 0;
  for (let i = 0; i < text.length;) {
    const hit = TOKENIZER.special.find(([s]) => text.startsWith(s, i));
    if (!hit) { i++; continue; }
    if (start < i) out.push([text.slice(start, i), undefined]);
    out.push(hit);
    i = start = i + hit[0].length;
  }
  if (start < text.length) out.push([text.slice(start), undefined]);
  return out;
}

// Steps 2 to 5. A lone surrogate counts as U+FFFD.
function normalizeText(text, w) {
  const t = TOKENIZER, out = [];
  for (const ch of text) {
    let c = ch.codePointAt(0);
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    if (t.cleanText) {
      if (w.control(c)) continue;
      if (w.space(c)) c = 32;
    }
    const s = String.fromCodePoint(c);
    out.push(t.chineseChars && w.cjk(c) ? ` ${s} ` : s);
  }
  let s = out.join('');
  if (t.stripAccents) s = Array.from(s.normalize('NFD')).filter((ch) => !w.mark(ch.codePointAt(0))).join('');
  if (t.lowercase) s = Array.from(s, (ch) => ch.toLowerCase()).join('');
  return s;
}

// Step 6.
function textWords(s, w) {
  const out = [];
  let cur = '';
  for (const ch of s) {
    const c = ch.codePointAt(0), space = w.space(c);
    if (space || w.punctuation(c)) {
      if (cur) out.push(cur);
      cur = '';
      if (!space) out.push(ch);
    } else {
      cur += ch;
    }
  }
  if (cur) out.push(cur);
  return out;
}

// Step 7: the word's ids pushed onto out.
function wordPiece(word, w, out) {
  const chars = Array.from(word), t = TOKENIZER, first = out.length;
  if (chars.length > t.maxWordChars) { out.push(t.unk); return; }
  for (let start = 0; start < chars.length;) {
    let end = chars.length, id;
    for (; end > start; end--) {
      id = w.ids.get((start ? t.prefix : '') + chars.slice(start, end).join(''));
      if (id !== undefined) break;
    }
    if (end === start) { out.length = first; out.push(t.unk); return; }
    out.push(id);
    start = end;
  }
}

// Step 8, for every text: { input_ids, attention_mask }, Int32Array [N, length] each.
function encodeTexts(texts) {
  const w = wordPieceTables(), t = TOKENIZER, T = t.length;
  const input_ids = new Int32Array(texts.length * T).fill(t.pad), attention_mask = new Int32Array(texts.length * T);
  texts.forEach((text, n) => {
    const ids = [];
    for (const [piece, id] of textPieces(text)) {
      if (ids.length >= T - 2) break;
      if (id !== undefined) { ids.push(id); continue; }
      for (const word of textWords(normalizeText(piece, w), w)) wordPiece(word, w, ids);
    }
    const row = [t.cls, ...ids.slice(0, T - 2), t.sep];
    input_ids.set(row, n * T);
    attention_mask.fill(1, n * T, n * T + row.length);
  });
  return { input_ids, attention_mask };
}

// Model.fromText (rendered after model.js): the token ids and attention mask of an array of strings, each
// an Int32Array [N, T] (T: the build's sequence length, inputShape[0]), exactly as Hugging Face's tokenizer
// with padding 'max_length' and truncation to T. Asynchronous, like fromImages; it runs at once.
addMethods({
  fromText(strings) {
    try {
      checkDisposed(stateOf(this));
      if (!Array.isArray(strings) || !strings.length) throw new TexelfitError('bad-input', `fromText needs a non-empty array of strings, got ${kindOf(strings)}`);
      const bad = strings.findIndex((s) => typeof s !== 'string');
      if (bad >= 0) throw new TexelfitError('bad-input', `strings[${bad}] is ${kindOf(strings[bad])}: fromText takes an array of strings`);
      return Promise.resolve(encodeTexts(strings));
    } catch (e) {
      return Promise.reject(e);
    }
  },
});
