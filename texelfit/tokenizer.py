"""The WordPiece tokenizer of `m.fromText(strings)` (build --tokenizer PATH): loading and checking the
vocabulary, what the bundle records of it, and its Python twin (for tests, and for `texelfit
import-weights` users who feed the trained model from PyTorch).

    load_tokenizer(path) -> Tokenizer;  Tokenizer.encode(texts, length) -> (input_ids, attention_mask)

The reference is Hugging Face's BERT tokenizer (`transformers.AutoTokenizer`, backed by `tokenizers`)
called with padding="max_length", truncation=True, max_length=T. A text goes through, in this order:

1. special tokens: [CLS], [SEP], [PAD], [UNK], [MASK] (and the other added tokens of a tokenizer.json)
   written in the text as they are (case and all) are those tokens; the longest one first at the
   leftmost place. Steps 2 to 5 run on the pieces between them;
2. clean_text: NUL, U+FFFD and control characters (Cc, Cf, Co) dropped, every whitespace character
   (White_Space; tab, newline and carriage return included) a space;
3. handle_chinese_chars: a space before and after every CJK ideograph (CJK_RANGES);
4. strip_accents (default: when lower-casing): NFD, then non-spacing marks (Mn) dropped;
5. lowercase (do_lower_case): each character lower-cased alone (no final-sigma rule; after step 4,
   as `tokenizers` does: the dot of a lower-cased U+0130 stays);
6. words: split at whitespace, every punctuation character (ASCII symbols, P*) a word of its own;
7. WordPiece: the longest vocabulary entry that starts the word, then the longest "##" entry that
   starts the rest, and so on; a word that cannot be covered so, or of over 100 characters, is [UNK];
8. [CLS] + the first T - 2 ids + [SEP], then [PAD] to T; the mask 1 on the real tokens, 0 on padding.

"Control", "punctuation" and "non-spacing mark" are those of `tokenizers`' own (old) Unicode tables,
which texelfit/bert_unicode.py holds as ranges (scripts/bert_unicode_tables.py reads them off the
library); the bundle carries the same ranges, so the browser's Unicode version does not matter for
them. NFD and lower-casing are the browser's (String.prototype.normalize, toLowerCase) and Python's
(unicodedata; str.lower with bert_unicode.LOWERCASE for characters newer than Python's Unicode).

The browser twin is runtime_template/runtime/tokenizer.js; a lone surrogate in a JavaScript
string counts as U+FFFD there (a Python string given to `tokenizers` cannot hold one).
"""
from __future__ import annotations

import json
import os
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from texelfit.prep.errors import BuildError

# White_Space (Rust's char::is_whitespace, the split of BertPreTokenizer and clean_text's spaces)
SPACES = (0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
          0x3000)
# the CJK ideographs of BERT's _is_chinese_char as `tokenizers` has them, inclusive (its fifth range starts
# at U+2B920, where BERT's Python has U+2B820)
CJK_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2A6DF), (0x2A700, 0x2B81F),
              (0x2B920, 0x2CEAF), (0x2F800, 0x2FA1F))
MAX_WORD_CHARS = 100  # WordPiece's max_input_chars_per_word
PREFIX = "##"  # WordPiece's continuing_subword_prefix
ROLES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}
# tokenizer_config.json's tokenizer_class values that mean this tokenizer (BERT's basic tokenizer + WordPiece)
BERT_CLASSES = ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast",
                "ElectraTokenizer", "ElectraTokenizerFast")
MAX_VOCAB = 1 << 20


class CodeClass:
    """A set of code points given as inclusive ranges (bert_unicode's text: "21-2f 3a ...")."""

    def __init__(self, ranges):
        self.ranges = tuple(ranges)
        self.bounds = [b for lo, hi in self.ranges for b in (lo, hi + 1)]  # c is in it: odd count of bounds <= c

    @classmethod
    def parse(cls, text: str) -> "CodeClass":
        out = []
        for part in text.split():
            lo, _, hi = part.partition("-")
            out.append((int(lo, 16), int(hi or lo, 16)))
        return cls(out)

    def __contains__(self, c: int) -> bool:
        return bisect_right(self.bounds, c) % 2 == 1

    def deltas(self) -> list[int]:
        """The bounds delta-coded (what the bundle carries): b[0], b[1] - b[0], b[2] - b[1], ..."""
        return [b - (self.bounds[i - 1] if i else 0) for i, b in enumerate(self.bounds)]


def _classes():
    from texelfit import bert_unicode as u

    spaces = CodeClass((c, c) for c in SPACES)
    return (CodeClass.parse(u.CONTROL), CodeClass.parse(u.PUNCTUATION), CodeClass.parse(u.MARK), spaces,
            CodeClass(CJK_RANGES), u.LOWERCASE)


@dataclass(frozen=True)
class Tokenizer:
    vocab: tuple[str, ...]  # a token's id is its index (a repeated token: its last index, as Hugging Face)
    lowercase: bool = True
    strip_accents: bool = True
    chinese_chars: bool = True
    clean_text: bool = True
    tokens: dict = field(default_factory=lambda: dict(DEFAULT_TOKENS))  # role -> token (unk_token: "[UNK]", ...)
    special: tuple[str, ...] = ()  # the tokens matched in the raw text (step 1)
    max_word_chars: int = MAX_WORD_CHARS

    def __post_init__(self):
        object.__setattr__(self, "ids", {t: i for i, t in enumerate(self.vocab)})
        object.__setattr__(self, "_cls", _classes())

    def id_of(self, role: str) -> int:
        return self.ids[self.tokens[role]]

    # ---- the steps --------------------------------------------------------------------------------
    def _pieces(self, text: str):
        """Step 1: (piece, None) for plain text, (token, id) for a special token."""
        start = i = 0
        special = sorted(self.special, key=len, reverse=True)
        while i < len(text):
            hit = next((s for s in special if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            if start < i:
                yield text[start:i], None
            yield hit, self.ids[hit]
            i = start = i + len(hit)
        if start < len(text):
            yield text[start:], None

    def normalize(self, text: str) -> str:
        """Steps 2 to 5."""
        control, _, mark, spaces, cjk, lower = self._cls
        out = []
        for ch in text:
            c = ord(ch)
            if self.clean_text:
                if c in control:
                    continue
                if c in spaces:
                    ch, c = " ", 0x20
            out.append(f" {ch} " if self.chinese_chars and c in cjk else ch)
        text = "".join(out)
        if self.strip_accents:
            text = "".join(ch for ch in unicodedata.normalize("NFD", text) if ord(ch) not in mark)
        if self.lowercase:
            text = "".join(lower.get(ord(ch), ch.lower()) for ch in text)
        return text

    def words(self, text: str) -> list[str]:
        """Step 6."""
        _, punctuation, _, spaces, _, _ = self._cls
        out, cur = [], []
        for ch in text:
            c = ord(ch)
            if c in spaces or c in punctuation:
                if cur:
                    out.append("".join(cur))
                cur = []
                if c not in spaces:
                    out.append(ch)
            else:
                cur.append(ch)
        if cur:
            out.append("".join(cur))
        return out

    def wordpiece(self, word: str) -> list[int]:
        """Step 7."""
        unk = self.id_of("unk_token")
        if len(word) > self.max_word_chars:
            return [unk]
        out, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                hit = self.ids.get((PREFIX if start else "") + word[start:end])
                if hit is not None:
                    break
            else:
                return [unk]
            out.append(hit)
            start = end
        return out

    def token_ids(self, text: str) -> list[int]:
        """Steps 1 to 7: the ids of the text, without [CLS], [SEP] or truncation."""
        out = []
        for piece, special in self._pieces(text):
            if special is not None:
                out.append(special)
                continue
            for word in self.words(self.normalize(piece)):
                out.extend(self.wordpiece(word))
        return out

    def encode(self, texts, length: int) -> tuple[np.ndarray, np.ndarray]:
        """int32 input_ids and attention_mask [N, length] of a list of strings, as m.fromText gives them
        (flattened there)."""
        if isinstance(texts, str):
            texts = [texts]
        if length < 2:
            raise ValueError(f"the length must hold [CLS] and [SEP]: at least 2, got {length}")
        ids = np.full((len(texts), length), self.id_of("pad_token"), dtype=np.int32)
        mask = np.zeros((len(texts), length), dtype=np.int32)
        for n, text in enumerate(texts):
            row = [self.id_of("cls_token"), *self.token_ids(text)[:length - 2], self.id_of("sep_token")]
            ids[n, :len(row)] = row
            mask[n, :len(row)] = 1
        return ids, mask

    # ---- the bundle's record ------------------------------------------------------------------------
    def record(self, length: int) -> dict:
        """MODEL.tokenizer (runtime/tokenizer.js); the vocabulary goes beside it (VOCAB)."""
        control, punctuation, mark, spaces, cjk, _ = self._cls
        special = sorted(self.special, key=lambda s: (-len(s), s))  # longest first: step 1's choice
        return {
            "length": length, "lowercase": self.lowercase, "stripAccents": self.strip_accents,
            "chineseChars": self.chinese_chars, "cleanText": self.clean_text, "maxWordChars": self.max_word_chars,
            "prefix": PREFIX, "unk": self.id_of("unk_token"), "cls": self.id_of("cls_token"),
            "sep": self.id_of("sep_token"), "pad": self.id_of("pad_token"),
            "special": [[s, self.ids[s]] for s in special],
            "control": control.deltas(), "punctuation": punctuation.deltas(), "mark": mark.deltas(),
            "space": spaces.deltas(), "cjk": cjk.deltas(),
        }

    def report(self, length: int) -> dict:
        return {"vocab_size": len(self.vocab), "length": length, "lowercase": self.lowercase,
                "strip_accents": self.strip_accents, "chinese_chars": self.chinese_chars,
                "clean_text": self.clean_text, "special": sorted(self.special), **self.tokens}


# ---- loading ------------------------------------------------------------------------------------

def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"--tokenizer: cannot read {what} {path}: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise BuildError(f"--tokenizer: {what} {path} is not a JSON object")
    return data


def _flag(config: dict, key: str, default, path: str, *, nullable=False):
    v = config.get(key, default)
    if v is None and nullable:
        return None
    if not isinstance(v, bool):
        raise BuildError(f"--tokenizer: {path}: {key} must be true or false{' or null' if nullable else ''}, got {v!r}")
    return v


def _token_name(v, role: str, path: str) -> str:
    if isinstance(v, dict):  # an AddedToken as older configs write it: {"__type": "AddedToken", "content": ...}
        v = v.get("content")
    if not isinstance(v, str) or not v:
        raise BuildError(f"--tokenizer: {path}: {role} must be a token (a non-empty string), got {v!r}")
    return v


def read_vocab(path: str) -> tuple[str, ...]:
    """vocab.txt: one token a line, UTF-8; a line's end (\\n, \\r\\n) is not part of its token."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BuildError(f"--tokenizer: cannot read the vocabulary {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BuildError(f"--tokenizer: the vocabulary {path} is not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the last line's end
    vocab = tuple(line[:-1] if line.endswith("\r") else line for line in lines)
    if not vocab:
        raise BuildError(f"--tokenizer: the vocabulary {path} is empty")
    if len(vocab) > MAX_VOCAB:
        raise BuildError(f"--tokenizer: the vocabulary {path} has {len(vocab)} tokens, over {MAX_VOCAB}")
    return vocab


def load_tokenizer(path: str) -> Tokenizer:
    """A vocab.txt, or a folder holding vocab.txt and (optionally) tokenizer_config.json, whose
    do_lower_case, strip_accents, tokenize_chinese_chars, clean_text and special tokens it reads (BERT's
    defaults without one: lower-casing, accents stripped, CJK split). A tokenizer.json beside them adds
    its added tokens and WordPiece's max_input_chars_per_word, and must describe a BERT tokenizer."""
    if not isinstance(path, str) or not path:
        raise BuildError("--tokenizer needs a path: a vocab.txt, or a folder holding vocab.txt")
    folder = None
    if os.path.isdir(path):
        folder, vocab_path = path, os.path.join(path, "vocab.txt")
        if not os.path.isfile(vocab_path):
            raise BuildError(f"--tokenizer: the folder {path} holds no vocab.txt")
    elif os.path.isfile(path):
        vocab_path = path
    else:
        raise BuildError(f"--tokenizer: {path} does not exist (give a vocab.txt, or a folder holding vocab.txt)")
    vocab = read_vocab(vocab_path)
    config, config_path = {}, "BERT's defaults"
    if folder and os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        config_path = os.path.join(folder, "tokenizer_config.json")
        config = _read_json(config_path, "the tokenizer config")
        cls = config.get("tokenizer_class")
        if cls is not None and cls not in BERT_CLASSES:
            raise BuildError(f"--tokenizer: {config_path} names tokenizer_class {cls!r}; texelfit's tokenizer is BERT's "
                             f"WordPiece ({', '.join(BERT_CLASSES)})")
        if config.get("do_basic_tokenize", True) is not True:
            raise BuildError(f"--tokenizer: {config_path}: do_basic_tokenize false is not supported (texelfit always "
                             "cleans, splits punctuation and lower-cases as do_lower_case says)")
    lowercase = _flag(config, "do_lower_case", True, config_path)
    strip = _flag(config, "strip_accents", None, config_path, nullable=True)
    chinese = _flag(config, "tokenize_chinese_chars", True, config_path)
    clean = _flag(config, "clean_text", True, config_path)
    tokens = {role: _token_name(config.get(role, DEFAULT_TOKENS[role]), role, config_path) for role in ROLES}
    ids = {t: i for i, t in enumerate(vocab)}
    for role in ("unk_token", "cls_token", "sep_token", "pad_token"):
        if tokens[role] not in ids:
            raise BuildError(f"--tokenizer: the vocabulary {vocab_path} lacks the {role} {tokens[role]!r}")
    special = {t for t in tokens.values() if t in ids}
    max_word = MAX_WORD_CHARS
    if folder and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        special, max_word = _read_tokenizer_json(os.path.join(folder, "tokenizer.json"), ids, special)
    return Tokenizer(vocab, lowercase=lowercase, strip_accents=lowercase if strip is None else strip,
                     chinese_chars=chinese, clean_text=clean, tokens=tokens, special=tuple(sorted(special)),
                     max_word_chars=max_word)


def _read_tokenizer_json(path: str, ids: dict, special: set) -> tuple[set, int]:
    data = _read_json(path, "the tokenizer")
    kinds = {k: (data.get(k) or {}).get("type") for k in ("normalizer", "pre_tokenizer", "model")}
    want = {"normalizer": "BertNormalizer", "pre_tokenizer": "BertPreTokenizer", "model": "WordPiece"}
    for k, v in want.items():
        if kinds[k] not in (None, v):
            raise BuildError(f"--tokenizer: {path}: its {k} is {kinds[k]}, not {v}: texelfit's tokenizer is BERT's WordPiece")
    model = data.get("model") or {}
    if model.get("continuing_subword_prefix", PREFIX) != PREFIX:
        raise BuildError(f"--tokenizer: {path}: continuing_subword_prefix {model['continuing_subword_prefix']!r} "
                         f"is not supported (only {PREFIX!r})")
    max_word = model.get("max_input_chars_per_word", MAX_WORD_CHARS)
    if not isinstance(max_word, int) or isinstance(max_word, bool) or max_word < 1:
        raise BuildError(f"--tokenizer: {path}: max_input_chars_per_word must be a positive integer, got {max_word!r}")
    special = set(special)
    for t in data.get("added_tokens") or []:
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(content, str) or not content:
            raise BuildError(f"--tokenizer: {path}: an added token without content: {t!r}")
        if any(t.get(k) for k in ("normalized", "lstrip", "rstrip", "single_word")):
            raise BuildError(f"--tokenizer: {path}: the added token {content!r} is normalized, lstrip, rstrip or "
                             "single_word: not supported (only tokens matched as written)")
        if ids.get(content) != t.get("id"):
            raise BuildError(f"--tokenizer: {path}: the added token {content!r} has id {t.get('id')!r}, not its line "
                             f"in vocab.txt ({ids.get(content)!r})")
        special.add(content)
    return special, max_word


def tokenizer_input(tok: Tokenizer | None, input_shape) -> int | None:
    """The sequence length T of a build with a tokenizer: the input's one dimension (T,)."""
    if tok is None:
        return None
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 1:
        raise BuildError(f"--tokenizer needs a model whose input is one sequence of T tokens (input shape T, e.g. "
                         f"--input-shape 128); this input is {list(shape)}")
    if shape[0] < 2:
        raise BuildError(f"--tokenizer: the sequence length {shape[0]} cannot hold [CLS] and [SEP] (at least 2)")
    return shape[0]
