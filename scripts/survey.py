"""Which real architectures texelfit builds: ~50 models, random init, small configs, offline, one after the other in
this process (torch.manual_seed(0) before each), at max_batch=2. A build works if it returns without raising; a
failure is recorded as its exception's type and the first line of its message. The models: torchvision's designs
written out small (survey_models.py: torchvision cannot be installed here; ViT and Swin below), recurrent layers,
two hand-written patterns, and Hugging Face models from small configs wrapped to return one tensor, as a user would.

--via, how a model is built:
  export  texelfit.export(model, examples, out_dir, max_batch=2, **options), the notebook API (issue 32)
  source  prep.load.export_simplified + build.compile_onnx: `texelfit build pkg.mod:factory` (texelfit.export's path)
  onnx    torch.onnx.export to a file (dynamo=False, opset 17, axis 0 of every input and output dynamic), then
          `texelfit build model.onnx` (prep.load.load_onnx + build.compile_onnx)
  auto    export where texelfit has it, else onnx
--repo imports texelfit from another checkout (a git worktree of an older commit), whatever the venv's editable
install points at. Run from the repository root:
  .venv/bin/python scripts/survey.py [--repo PATH] [--via VIA] [--only NAME] --json OUT.json
  .venv/bin/python scripts/survey.py --table A.json B.json --labels A B --md scripts/survey_results.md
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PACKAGES = {"texelfit": "texelfit", "texelfit.prep": "prep", "texelfit.codegen": "codegen",  # pyproject's package-dir
            "texelfit.runtime_template": "runtime_template"}


def use_repo(repo: str) -> dict[str, str]:
    """Import texelfit's packages from `repo` (laid out as pyproject.toml's package-dir says) through a finder ahead
    of the venv's editable install (mapped to /work/main). Returns their files, checked to lie under `repo`."""
    repo = os.path.abspath(repo)

    class RepoFinder:  # (a meta path finder)
        def find_spec(self, fullname, path=None, target=None):
            if fullname not in PACKAGES:
                return None  # (submodules: the standard finder, in the package's __path__ set here)
            folder = os.path.join(repo, PACKAGES[fullname])
            return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                          submodule_search_locations=[folder])

    sys.meta_path.insert(0, RepoFinder())
    files = {name: importlib.import_module(name).__file__ for name in PACKAGES}
    files["texelfit.prep.load"] = importlib.import_module("texelfit.prep.load").__file__
    files["texelfit.build"] = importlib.import_module("texelfit.build").__file__
    wrong = {k: f for k, f in files.items() if not os.path.abspath(f).startswith(repo + os.sep)}
    if wrong:
        sys.exit(f"survey: not imported from {repo}: {wrong}")
    return files


# ---------------------------------------------------------------- attention and sequence models
T, V, C = 16, 64, 10  # tokens a sequence, vocabulary, classes


class ViT(nn.Module):
    """torchvision's VisionTransformer: patch conv reshaped and permuted to tokens, class token expanded and
    concatenated, position embedding, pre-norm GELU nn.TransformerEncoder, final LayerNorm, head on the class token."""

    def __init__(self, d=32, patch=8, size=32):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 2, 64, 0.0, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        self.head = nn.Linear(d, C)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.conv_proj.out_channels, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos
        return self.head(self.encoder(x)[:, 0])


class SwinBlock(nn.Module):
    """Swin's block: LayerNorm, cyclic shift (roll), windows folded into the batch, attention in each window plus a
    relative position bias gathered from a table, windows unfolded, shift back; MLP. (No shifted-window mask.)"""

    def __init__(self, d, ws, shift, heads=2):
        super().__init__()
        self.ws, self.shift, self.heads = ws, shift, heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads) * 0.02)
        xy = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (xy[:, :, None] - xy[:, None, :]).permute(1, 2, 0) + (ws - 1)
        self.register_buffer("index", (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).flatten(), persistent=False)

    def attention(self, x):  # [B * windows, ws * ws, d]
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = (q * (d // self.heads) ** -0.5) @ k.transpose(-2, -1)
        a = a + self.table[self.index].reshape(n, n, -1).permute(2, 0, 1)[None]
        return self.proj((a.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x):  # [B, H, W, d]
        b, h, w, d = x.shape
        ws, y = self.ws, self.norm1(x)
        y = torch.roll(y, (-self.shift, -self.shift), (1, 2)) if self.shift else y
        y = y.view(b, h // ws, ws, w // ws, ws, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, d)
        y = self.attention(y).view(b, h // ws, w // ws, ws, ws, d).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, d)
        x = x + (torch.roll(y, (self.shift, self.shift), (1, 2)) if self.shift else y)
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.patch, self.norm0 = nn.Conv2d(3, d, 4, 4), nn.LayerNorm(d)
        self.blocks = nn.Sequential(SwinBlock(d, 4, 0), SwinBlock(d, 4, 2))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, C)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.norm0(self.patch(x).permute(0, 2, 3, 1)))).mean([1, 2]))


class Recurrent(nn.Module):
    """Ids (nn.Embedding) or features into nn.LSTM/GRU/RNN, a Linear on h_n[-1] (both directions') or every step."""

    def __init__(self, cell, tokens=True, layers=1, bidirectional=False, tagger=False, h=32):
        super().__init__()
        self.emb = nn.Embedding(V, 32) if tokens else None
        self.rnn = cell(32 if tokens else 8, h, layers, batch_first=True, bidirectional=bidirectional)
        self.fc, self.tagger = nn.Linear(h * (1 + bidirectional), C), tagger

    def forward(self, x):
        out, state = self.rnn(x if self.emb is None else self.emb(x))
        if self.tagger:
            return self.fc(out)
        h = state[0] if isinstance(state, tuple) else state
        return self.fc(torch.cat([h[-2], h[-1]], 1) if self.rnn.bidirectional else h[-1])


class Detector(nn.Module):
    """A small CNN with two heads, returned as a tuple: class logits and a box (4 numbers in [0, 1])."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls, self.box = nn.Linear(16, C), nn.Linear(16, 4)

    def forward(self, x):
        f = self.trunk(x)
        return self.cls(f), torch.sigmoid(self.box(f))


class Text(nn.Module):
    """A Hugging Face text model called (input_ids, attention_mask), returning one output: what a user wraps."""

    def __init__(self, hf, key="logits"):
        super().__init__()
        self.hf, self.key = hf, key

    def forward(self, input_ids, attention_mask):
        return getattr(self.hf(input_ids=input_ids, attention_mask=attention_mask), self.key)


class Pixels(Text):
    """A Hugging Face vision (or audio: arg="input_features") model called with one tensor, returning one output."""

    def __init__(self, hf, key="logits", arg="pixel_values"):
        super().__init__(hf, key)
        self.arg = arg

    def forward(self, pixel_values):
        return getattr(self.hf(**{self.arg: pixel_values}), self.key)


def catalogue():
    """[(family, name, factory)]; a factory returns (module, example inputs as a tuple, build options)."""
    import transformers as tf
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from survey_models import MSE, TORCHVISION

    image = lambda size: (torch.randn(2, 3, size, size),)  # noqa: E731
    text = lambda: (torch.randint(1, V, (2, T)), torch.ones(2, T, dtype=torch.int64))  # noqa: E731
    eager = dict(attn_implementation="eager")  # (the default, sdpa, in the two "default attention" rows)
    txt0 = dict(vocab_size=V, num_labels=3, max_position_embeddings=64)
    txt = dict(**txt0, **eager)
    t5 = dict(vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    bert = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    vit = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, num_labels=C, **eager)
    cnx = dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=C)
    gpt2 = dict(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0, **eager)
    hf_text = [  # (family, name, model class, config, output, options)
        ("HF encoder", "BERT", tf.BertForSequenceClassification, tf.BertConfig(**txt, **bert), "logits", {}),
        ("HF encoder", "DistilBERT", tf.DistilBertForSequenceClassification, tf.DistilBertConfig(
            **txt, dim=32, n_layers=2, n_heads=2, hidden_dim=64), "logits", {}),
        ("HF encoder", "RoBERTa", tf.RobertaForSequenceClassification, tf.RobertaConfig(**txt, **bert), "logits", {}),
        ("HF encoder", "ALBERT", tf.AlbertForSequenceClassification, tf.AlbertConfig(**txt, embedding_size=16, **bert),
         "logits", {}),
        ("HF encoder", "ELECTRA", tf.ElectraForSequenceClassification, tf.ElectraConfig(
            **txt, embedding_size=16, **bert), "logits", {}),
        ("HF encoder", "T5EncoderModel (last_hidden_state)", tf.T5EncoderModel, tf.T5Config(**t5, **eager),
         "last_hidden_state", MSE),
        ("HF encoder", "BERT (default attention: sdpa)", tf.BertForSequenceClassification,
         tf.BertConfig(**txt0, **bert), "logits", {}),
        ("HF encoder", "T5EncoderModel (default attention: sdpa)", tf.T5EncoderModel, tf.T5Config(**t5),
         "last_hidden_state", MSE),
        ("HF decoder", "GPT-2 (sequence classification)", tf.GPT2ForSequenceClassification, tf.GPT2Config(
            **gpt2, num_labels=3, pad_token_id=0), "logits", {}),
        ("HF decoder", "GPT-2 (LM head, [N, T, V] logits)", tf.GPT2LMHeadModel, tf.GPT2Config(**gpt2), "logits", MSE),
    ]
    hf_vision = [  # (name, model class, config, image size, options)
        ("ViT", tf.ViTForImageClassification, tf.ViTConfig(**vit), 32, {}),
        ("DeiT", tf.DeiTForImageClassification, tf.DeiTConfig(**vit), 32, {}),
        ("Swin", tf.SwinForImageClassification, tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                              num_heads=[2, 2], window_size=4, num_labels=C, **eager),
         32, {}),
        ("MobileViT", tf.MobileViTForImageClassification, tf.MobileViTConfig(
            image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
            num_attention_heads=2, num_labels=C, **eager), 64, {}),
        ("ConvNext", tf.ConvNextForImageClassification, tf.ConvNextConfig(**cnx), 32, {}),
        ("ConvNextV2", tf.ConvNextV2ForImageClassification, tf.ConvNextV2Config(**cnx), 32, {}),
        ("ResNet (bottleneck)", tf.ResNetForImageClassification, tf.ResNetConfig(
            num_stages=2, embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], num_labels=C), 32, {}),
        ("MobileNetV2 (depth 0.25)", tf.MobileNetV2ForImageClassification, tf.MobileNetV2Config(
            image_size=32, depth_multiplier=0.25, num_labels=C), 32, {}),
        ("EfficientNet (width, depth 0.25)", tf.EfficientNetForImageClassification, tf.EfficientNetConfig(
            image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=C), 32, {}),
        ("SegFormer ([N, K, H/4, W/4] logits)", tf.SegformerForSemanticSegmentation, tf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=4,
            **eager), 64, MSE),
    ]
    whisper = tf.WhisperConfig(num_mel_bins=16, max_source_positions=16, d_model=32, encoder_layers=2,
                               encoder_attention_heads=2, encoder_ffn_dim=64, vocab_size=V, **eager)

    models = [("torchvision-style", name, lambda f=f, s=s, o=o: (f(), image(s), o)) for name, f, s, o in TORCHVISION]
    models += [
        ("torchvision-style", "ViT (class token, nn.TransformerEncoder)", lambda: (ViT(), image(32), {})),
        ("torchvision-style", "Swin-style window attention", lambda: (Swin(), image(32), {})),
        ("recurrent", "nn.LSTM classifier (embedding, h_n[-1])", lambda: (Recurrent(nn.LSTM), text()[:1], {})),
        ("recurrent", "nn.GRU tagger (per-step Linear)", lambda: (Recurrent(nn.GRU, tagger=True), text()[:1], MSE)),
        ("recurrent", "bidirectional 2-layer nn.LSTM (features)", lambda: (
            Recurrent(nn.LSTM, False, 2, True), (torch.randn(2, T, 8),), {})),
        ("recurrent", "nn.RNN (tanh, features)", lambda: (Recurrent(nn.RNN, False), (torch.randn(2, T, 8),), {})),
        ("hand-written", "MLP", lambda: (nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                                       nn.Linear(32, C)), (torch.randn(2, 64),), {})),
        ("hand-written", "two outputs (logits, box)", lambda: (Detector(), image(32), {})),
    ]
    models += [(fam, name, lambda c=c, k=k, o=o, key=key: (Text(c(k), key), text(), o))
               for fam, name, c, k, key, o in hf_text]
    models += [("HF vision", name, lambda c=c, k=k, s=s, o=o: (Pixels(c(k)), image(s), o))
               for name, c, k, s, o in hf_vision]
    models.append(("HF encoder", "Whisper encoder (last_hidden_state)", lambda: (
        Pixels(WhisperEncoder(whisper), "last_hidden_state", "input_features"), (torch.randn(2, 16, 32),), MSE)))
    return models


# ---------------------------------------------------------------- building
def build(module, examples, options, out, via):
    import texelfit

    if via == "export":
        return texelfit.export(module, examples, out, max_batch=2, **options)
    from texelfit.build import compile_onnx, write_files
    from texelfit.prep.load import export_simplified, load_onnx

    one = len(examples) == 1  # (one input: "input" and a shape; several: the forward's names and a list of shapes)
    names = ["input"] if one else [p for p in inspect.signature(module.forward).parameters][:len(examples)]
    shapes = [tuple(t.shape[1:]) for t in examples]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in examples]
    if via == "source":
        shape, dtype = (shapes[0], dtypes[0]) if one else (shapes, dtypes)
        onnx_model = export_simplified(module, shape, None if one else names, dtype)
        result = compile_onnx(onnx_model, name="model", input_shape=shape, input_dtype=dtype, max_batch=2, **options)
    else:  # an ONNX file as its user exports it, then `texelfit build model.onnx --max-batch 2`
        with torch.no_grad():
            outputs = module(*examples)
        outs = ["output"] + [f"output{i}" for i in range(1, len(outputs) if isinstance(outputs, tuple) else 1)]
        path = os.path.join(out, "model.onnx")
        os.makedirs(out, exist_ok=True)
        torch.onnx.export(module, tuple(examples), path, dynamo=False, opset_version=17, input_names=names,
                          output_names=outs, dynamic_axes={n: {0: "batch"} for n in names + outs})
        result = compile_onnx(load_onnx(path), name="model", input_shape=None, max_batch=2, **options)
    write_files(out, result.files)
    return result.report


def failure(e: BaseException, repo: str, limit=160) -> tuple[str, str]:
    """Its type and first line (`limit` characters at most), and its innermost frame in `repo` (else anywhere)."""
    first = (str(e).strip().splitlines() or [""])[0]
    text = f"{type(e).__name__}: {first}".strip()
    frames = traceback.extract_tb(e.__traceback__)
    inside = [f for f in frames if os.path.abspath(f.filename).startswith(repo + os.sep)]
    f = (inside or frames)[-1]
    where = f"{os.path.relpath(f.filename, repo) if inside else f.filename}:{f.lineno} ({f.name})"
    return (text if len(text) <= limit else text[:limit - 3] + "..."), where


def survey(models, via, repo):
    rows = []
    for family, name, factory in models:
        torch.manual_seed(0)
        start, row = time.time(), {"family": family, "name": name, "ok": False, "error": None, "where": None}
        try:
            module, examples, options = factory()
            module.eval()
            with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                build(module, examples, dict(options), out, via)
            row["ok"] = True
        except Exception as e:  # noqa: BLE001 (every failure is a result)
            row["error"], row["where"] = failure(e, repo)
        row["seconds"] = round(time.time() - start, 1)
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {row['seconds']:6.1f}s {family} / {name}"
              f"{'' if row['ok'] else ': ' + row['error']}", flush=True)
        rows.append(row)
    return rows


def describe(repo):
    """The checkout's commit, and how many tracked files differ from it (someone's uncommitted work)."""
    git = lambda *a: subprocess.run(["git", "-C", repo, *a], capture_output=True, text=True).stdout  # noqa: E731
    n = len(git("status", "--short", "--untracked-files=no").splitlines())
    return git("log", "-1", "--format=%h %s").strip()[:90] + (f" + {n} uncommitted tracked file(s)" if n else "")


# ---------------------------------------------------------------- the table
def write_table(paths, labels, md):
    """One row a model, one column a run; a failure with the error of the column before it says so."""
    runs = [json.load(open(p, encoding="utf-8")) for p in paths]
    by = [{(r["family"], r["name"]): r for r in run["results"]} for run in runs]
    lines = ["# Which architectures texelfit builds", "", "Written by `scripts/survey.py --table` (its docstring says "
             "how each model is built). A build works if it returns without raising; a failure shows its exception "
             "and the first line of its message (160 characters at most).", "", "## Runs", ""]
    for label, run in zip(labels, runs):
        ok = sum(r["ok"] for r in run["results"])
        lines += [f"- **{label}**: {run['commit']} (`--via {run['via']}`): **{ok} of {len(run['results'])} build** "
                  f"({run['seconds']:.0f} s)", f"  `{run['command']}`"]
    lines += ["", "## Models", "", "| family | model | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(runs)]
    for key in [(r["family"], r["name"]) for r in runs[-1]["results"]]:
        rows = [b.get(key) for b in by]
        cells = ["(not run)" if r is None else "builds" if r["ok"] else r["error"].replace("|", "\\|") for r in rows]
        cells = [c if i == 0 or c != cells[i - 1] or c == "builds" else "same error as ←"
                 for i, c in enumerate(cells)]
        changed = " **(changed)**" if len({r is not None and r["ok"] for r in rows}) > 1 else ""
        lines.append(f"| {key[0]} | {key[1]}{changed} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(r['ok'] for r in run['results'])} of {len(run['results'])} build**" for run in runs]
    lines += ["| | total | " + " | ".join(totals) + " |", ""]
    with open(md, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=os.path.dirname(HERE), help="the texelfit checkout to import (default: this one)")
    ap.add_argument("--via", choices=["auto", "export", "source", "onnx"], default="auto")
    ap.add_argument("--only", help="build the models whose name contains this (case-insensitive)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="write the markdown table of these runs (no building)")
    ap.add_argument("--labels", nargs="+", help="a column label per --table file")
    ap.add_argument("--md", default=os.path.join(HERE, "survey_results.md"))
    args = ap.parse_args(argv)
    if args.table:
        write_table(args.table, args.labels or [os.path.basename(p) for p in args.table], args.md)
        return 0
    repo = os.path.abspath(args.repo)
    files = use_repo(repo)
    import texelfit

    via = args.via if args.via != "auto" else ("export" if hasattr(texelfit, "export") else "onnx")
    models = [m for m in catalogue() if not args.only or args.only.lower() in m[1].lower()]
    print(f"survey: texelfit from {repo} ({describe(repo)}), --via {via}", flush=True)
    print("".join(f"survey:   {name}: {path}\n" for name, path in files.items()), end="", flush=True)
    start = time.time()
    rows = survey(models, via, repo)
    took = time.time() - start
    stray = sorted(n for n, m in sys.modules.items() if n.startswith("texelfit") and getattr(m, "__file__", None)
                   and not os.path.abspath(m.__file__).startswith(repo + os.sep))
    print(f"survey: {sum(r['ok'] for r in rows)} of {len(rows)} build ({took:.0f} s); texelfit modules from "
          f"outside {repo}: {', '.join(stray) or 'none'}")
    if args.json:
        command = " ".join([".venv/bin/python", os.path.relpath(__file__, os.getcwd())] + (argv or sys.argv[1:]))
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"repo": repo, "commit": describe(repo), "via": via, "imported": files, "stray": stray,
                       "command": command, "seconds": took, "results": rows}, f, indent=1)
    return 1 if stray else 0


if __name__ == "__main__":
    sys.exit(main())
