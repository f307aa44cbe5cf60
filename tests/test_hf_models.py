"""Hugging Face text classifiers as people load them (issue 32): `AutoModelForSequenceClassification` of BERT,
ELECTRA, DistilBERT and ALBERT (its layers sharing one layer's parameters), and T5's encoder with a head, from small
random-init configs (no download), exported as they are and called
(input_ids, attention_mask[, token_type_ids]). transformers 5 builds their padding masks with vmapped functions
(Range over the batch, And, a Cast to bool, a GatherElements of token-type ids): prep/lower_masks.py and the
import rules cast_bool and where_boolean take them (the batch never moves).

Forward, the gradient of every parameter (keyed by named_parameters(): the trainable set is the module's) and
Adam steps against PyTorch on WebGL2 float32 for each family, on the CPU backend and in the rgba8 tier for BERT,
with rows padded to different lengths; the token types as a third input; and the same BERT exported to an ONNX
file by its user.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from helpers import FWD, GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, run_model, torch_optimizer
from texelfit.build import compile_onnx
from texelfit.prep.errors import BuildError
from texelfit.prep.load import export_simplified, load_onnx

T, V, LABELS = 12, 40, 3
SMALL = dict(vocab_size=V, num_labels=LABELS, attn_implementation="eager", max_position_embeddings=32)
FAMILIES = {
    "bert": (tf.BertForSequenceClassification, tf.BertConfig, dict(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)),
    "electra": (tf.ElectraForSequenceClassification, tf.ElectraConfig, dict(
        embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)),
    "distilbert": (tf.DistilBertForSequenceClassification, tf.DistilBertConfig, dict(
        dim=16, n_layers=2, n_heads=2, hidden_dim=24)),
    # position ids computed from the ids (a cumulative sum of ids != padding, times it, plus the padding id): an
    # embedding of computed integers (prep/onnx_import/ctx.py: keep_integers); token types a zeros buffer read there
    "roberta": (tf.RobertaForSequenceClassification, tf.RobertaConfig, dict(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)),
    # every layer reads one layer's parameters (cross-layer sharing): each trains on the sum of its readers'
    # gradients (prep/graph.py: untie_unsupported keeps such ties)
    "albert": (tf.AlbertForSequenceClassification, tf.AlbertConfig, dict(
        embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24)),
}
BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}


class GPT2Classifier(tf.GPT2ForSequenceClassification):
    """GPT-2's classifier called (input_ids, attention_mask) as the others are (its forward takes past_key_values
    second). It classifies by its last token that is not padding: an ArgMax of the ids that are not pad_token_id
    (prep/lower_masks.py: _argmax_pick)."""

    def forward(self, input_ids, attention_mask=None):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)


FAMILIES["gpt2"] = (GPT2Classifier, tf.GPT2Config, dict(n_embd=16, n_layer=2, n_head=2, pad_token_id=0))


def classifier(family: str, perturbed: bool = True):
    """The family's classifier, random init (seeded); `perturbed`: every parameter moved off its init (HF's zero
    biases and unit LayerNorm weights would hide a bias or scale read from the wrong place)."""
    cls, config, sizes = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(config(**SMALL, **sizes)).eval()
    return perturb(model) if perturbed else model


def perturb(model):
    """Every parameter moved off its init (seeded by the caller)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def data(batch, seed, types=False, family=None):
    """Ids, masks of rows padded to different lengths (row 0 not at all, row 1 to one token), labels; with
    `types`, token type ids (0 then 1 from a random point, as sentence pairs). GPT-2's padded places hold its
    pad_token_id (0), as a tokenizer pads: its classifier reads each row's last token that is not padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (batch, T), generator=g)
    lengths = torch.randint(1, T + 1, (batch,), generator=g)
    lengths[0], lengths[1 % batch] = T, 1
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    y = torch.randint(0, LABELS, (batch,), generator=g)
    x = {"input_ids": ids * mask if family == "gpt2" else ids, "attention_mask": mask}
    if types:
        x["token_type_ids"] = (torch.arange(T)[None, :] >= torch.randint(1, T, (batch, 1), generator=g)).long()
    return x, y


def build(site, folder, model, names=("input_ids", "attention_mask"), **options):
    shapes = [(T,)] * len(names)
    onnx_model = export_simplified(model, shapes, list(names), ["int64"] * len(names))
    result = compile_onnx(onnx_model, name="model", input_shape=shapes, input_dtype=["int64"] * len(names),
                          max_batch=8, **options)
    return f"{site.add_files(folder, result.files)}/model.js"


def js_inputs(x) -> dict:
    return {k: v.reshape(-1).tolist() for k, v in x.items()}


OP = """
    const x = Object.fromEntries(Object.entries(args.x).map(([k, v]) => [k, Int32Array.from(v)]));
    const y = Int32Array.from(args.y);
    return { out: Array.from(await m.predict(x, args.batch)), grads: arr(await m.gradients(x, y)),
             trainable: m.info.trainable };
"""


def check_forward_and_gradients(web, site, family, backend, *, types=False, batch=4):
    model = classifier(family)
    x, y = data(batch, 1, types, family)
    compare(web, build(site, f"hf_{family}_{backend}_{types}", model, tuple(x)), model, x, y, family, BACKENDS[backend])


def compare(web, url, model, x, y, what, options=None, tol=(FWD, GRAD), noise=()):
    """predict and every gradient in the page against PyTorch's (cross_entropy of the logits), every parameter
    training under its state_dict name. `noise`: parameters whose gradient is 0 in exact arithmetic (an attention
    key's bias: the softmax cancels it), both sides holding rounding noise: small, not compared."""
    got = run_model(web, url, OP, {"x": js_inputs(x), "y": y.tolist(), "batch": len(y)}, options)
    model.zero_grad()
    out = model(**x)
    F.cross_entropy(getattr(out, "logits", out), y).backward()
    assert_close(f"{what} forward", got["out"], getattr(out, "logits", out).detach().numpy(), **tol[0])
    named = dict(model.named_parameters())
    assert sorted(got["trainable"]) == sorted(named)  # every parameter trains, under its state_dict name
    assert sorted(got["grads"]) == sorted(named)
    for name, p in named.items():
        if name.endswith(noise):
            assert np.linalg.norm(got["grads"][name]) < 1e-4
            continue
        assert_close(f"{what} d/d{name}", got["grads"][name], p.grad.numpy(), **tol[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_classifier_as_loaded_gives_pytorchs_outputs_and_gradients(web, site, family):
    check_forward_and_gradients(web, site, family, "webgl")


@pytest.mark.parametrize("backend", ["cpu", "rgba8"])
def test_bert_on_the_cpu_backend_and_in_rgba8(web, site, backend):
    check_forward_and_gradients(web, site, "bert", backend)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_padded_rows_in_the_float16_tier(web, site, family):
    """transformers' additive mask is float32's lowest, which a half float cannot hold: the float16 tier's writes
    saturate (prelude.glsl.j2: OUT_F16) so it is -65504 there, and the padded rows are numbers (before: NaN), within
    the tier's tolerances (test_tiers.py)."""
    from test_tiers import F16_FWD, F16_GRAD

    model = classifier(family)
    x, y = data(4, 6)
    compare(web, build(site, f"hf_f16_{family}", model), model, x, y, f"{family} (float16)", {"precision": "float16"},
            (F16_FWD, F16_GRAD), noise=("attention.self.key.bias",))


@pytest.mark.parametrize("backend", ["webgl", "cpu", "rgba8"])
def test_robertas_position_ids_count_the_tokens_that_are_not_padding(web, site, backend):
    """Padded rows hold the padding id (1) where the mask is 0, and the ids hold it mid-row too: those positions
    read the table's row 1, the others 2, 3, ... counting only the tokens that are not padding."""
    model = classifier("roberta")
    x, y = data(4, 6)
    ids, mask = x["input_ids"], x["attention_mask"]
    ids[mask == 0] = model.config.pad_token_id
    ids[0, 3] = ids[2, 0] = model.config.pad_token_id
    compare(web, build(site, f"hf_roberta_pads_{backend}", model), model, x, y, "roberta", BACKENDS[backend])


def test_bert_with_token_types_as_a_third_input(web, site):
    check_forward_and_gradients(web, site, "bert", "webgl", types=True)


FIT = """
    const x = Object.fromEntries(Object.entries(args.x).map(([k, v]) => [k, Int32Array.from(v)]));
    const r = await m.fit(x, Int32Array.from(args.y), { batchSize: 3, epochs: 1, shuffle: false, dropout: false,
                                                         optimizer: args.optimizer });
    return { loss: r.loss, weights: arr(await m.getWeights()) };
"""


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta", "gpt2"])
def test_sgd_steps_from_a_fresh_init_are_pytorchs(web, site, family):
    """Three SGD steps (momentum, weight decay) from the family's own init (zero biases, unit LayerNorm weights),
    dropout off (the exported dropout modules would apply it in fit, as model.train() does). Not Adam: the key
    projection's bias has a gradient of exactly 0 in exact arithmetic (softmax is shift-invariant over the keys),
    so its float32 gradient is rounding noise, whose sign Adam turns into steps of lr either way: its trajectory
    would compare two roundings, in the browser and in PyTorch, not two trainings."""
    model = classifier(family, perturbed=False)
    x, y = data(9, 2, family=family)
    check_sgd_steps(web, build(site, f"hf_fit_{family}", model), family, model, x, y)


def check_sgd_steps(web, url, family, model, x, y):
    """fit's SGD steps (momentum, weight decay; batches of 3 in order) in the page against PyTorch's: every loss
    and every weight after them."""
    cfg = OPTIMIZERS["sgd_momentum_wd"]
    got = run_model(web, url, FIT, {"x": js_inputs(x), "y": y.tolist(), "optimizer": cfg})
    opt = torch_optimizer(cfg, list(model.parameters()))
    losses = []
    for s in range(0, len(y), 3):
        opt.zero_grad()
        out = model(**{k: v[s:s + 3] for k, v in x.items()})
        loss = F.cross_entropy(getattr(out, "logits", out), y[s:s + 3])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert_close(f"{family} losses", got["loss"], losses, **TRAJ_LOSS)
    for name, p in model.named_parameters():
        assert_close(f"{family} {name} after {len(losses)} steps", got["weights"][name], p.detach().numpy(), **TRAJ_W)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_classifier_exported_to_onnx_by_its_user_builds(web, site, tmp_path, family):
    """torch.onnx.export at opset 17, as a user writes it; with its state_dict (--weights) the parameters get
    their names back, and predict and every gradient are PyTorch's."""
    model = classifier(family)
    x, y = data(4, 3, family=family)
    if family == "bert":  # (an ONNX file has no padding_idx: row 0 would train here and not in PyTorch)
        x["input_ids"].clamp_(min=1)
    path, weights = str(tmp_path / f"{family}.onnx"), str(tmp_path / f"{family}.pt")
    torch.onnx.export(model, (x["input_ids"][:2], x["attention_mask"][:2]), path, dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "n"}, "attention_mask": {0: "n"}, "logits": {0: "n"}})
    torch.save(model.state_dict(), weights)
    result = compile_onnx(load_onnx(path, weights=weights), name="model", input_shape=[(T,), (T,)], max_batch=8)
    compare(web, f"{site.add_files(f'hf_onnx_file_{family}', result.files)}/model.js", model, x, y, f"{family}.onnx")


def test_albert_trains_its_shared_layer_as_one_tensor(web, site):
    """ALBERT's three layers read one layer's parameters: each is one tensor (the trainable set is
    named_parameters(), with no copies), and SGD steps from the family's init are PyTorch's (every reader's
    gradient summed)."""
    model = classifier("albert", perturbed=False)
    x, y = data(6, 4)
    onnx_model = export_simplified(model, [(T,), (T,)], ["input_ids", "attention_mask"], ["int64", "int64"])
    result = compile_onnx(onnx_model, name="model", input_shape=[(T,), (T,)], input_dtype=["int64", "int64"],
                          max_batch=8)
    named = dict(model.named_parameters())
    assert sorted(result.report["trainable"]) == sorted(named)
    assert any(len(r) == 3 for r in result.report["trainable_set"]["tied"].values())
    check_sgd_steps(web, f"{site.add_files('hf_albert_fit', result.files)}/model.js", "albert", model, x, y)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_default_attention_builds_too(web, site, family):
    """transformers' default attention ("sdpa") exports as torch's scaled_dot_product_attention: the mask a Where of
    -inf, and the softmax's NaN (a row of keys all masked) put to 0 by Where(IsNaN(p), 0, p), which is nan_to."""
    cls, config, sizes = FAMILIES[family]
    torch.manual_seed(0)
    model = perturb(cls(config(**{k: v for k, v in SMALL.items() if k != "attn_implementation"}, **sizes)).eval())
    assert model.config._attn_implementation == "sdpa"
    x, y = data(4, 8)
    compare(web, build(site, f"hf_sdpa_{family}", model), model, x, y, f"{family} (sdpa)")


class T5Classifier(torch.nn.Module):
    """T5's encoder as loaded (`T5EncoderModel`: relative-position buckets, a bias table shared by the layers and
    added to the padding mask, RMS norms) with a head on the first token, as a user puts one on it."""

    def __init__(self, attention="eager"):
        super().__init__()
        self.t5 = tf.T5EncoderModel(tf.T5Config(vocab_size=V, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_heads=2,
                                                relative_attention_num_buckets=8, attn_implementation=attention))
        self.head = torch.nn.Linear(16, LABELS)

    def forward(self, input_ids, attention_mask):
        return self.head(self.t5(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_t5s_encoder_gives_pytorchs_outputs_gradients_and_steps(web, site, attention):
    """Forward and every gradient (the relative-position table's included) of the perturbed model, then SGD steps
    from T5's own init. With sdpa, the bias reaches the scores masked by a Where of -inf (prep/lower_masks.py:
    _where_masked)."""
    torch.manual_seed(0)
    model = perturb(T5Classifier(attention).eval())
    x, y = data(4, 1)
    compare(web, build(site, f"hf_t5_{attention}", model), model, x, y, f"t5 ({attention})")
    torch.manual_seed(1)
    fresh = T5Classifier(attention).eval()
    x, y = data(6, 2)
    check_sgd_steps(web, build(site, f"hf_t5_fit_{attention}", fresh), "t5", fresh, x, y)


def bert_classifier():
    """A factory as a user writes one for `texelfit build mypkg.nets:model` (the CLI test below)."""
    return classifier("bert")


def test_the_cli_builds_a_classifier_as_loaded(tmp_path):
    from helpers import run_cli

    r = run_cli("build", "test_hf_models:bert_classifier", "--inputs", "input_ids,attention_mask", "--input-dtype",
                "int64", "--input-shape", str(T), "--input-shape", str(T), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bert_classifier.js").exists()
    assert "Traceback" not in r.stderr and "failed to run" not in r.stderr, r.stderr


class GPT2LM(torch.nn.Module):
    """GPT-2 with its language-model head as loaded (its head tied to the token embedding), called (input_ids,
    attention_mask): [N, T, V] logits under the causal and padding mask transformers 5 builds (a Range over the batch
    through a Reshape that shape inference loses: prep/lower_masks.py)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.m = perturb(tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                                          attn_implementation="eager")).eval())

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_gpt2s_language_model_head_as_loaded(web, site, backend):
    """Every token's logits, and every gradient of the mean squared error against random targets (padded rows
    too: their keys are masked), as PyTorch's."""
    model = GPT2LM()
    x, _ = data(3, 4)
    target = torch.randn(3, T, V, generator=torch.Generator().manual_seed(5))
    url = build(site, f"hf_gpt2_lm_{backend}", model)
    got = run_model(web, url, """
        const x = Object.fromEntries(Object.entries(args.x).map(([k, v]) => [k, Int32Array.from(v)]));
        const y = new Float32Array(args.y);
        return { out: Array.from(await m.predict(x, 3)), grads: arr(await m.gradients(x, y, { loss: 'mse' })) };
    """, {"x": js_inputs(x), "y": target.reshape(-1).tolist()}, BACKENDS[backend])
    model.zero_grad()
    out = model(**x)
    F.mse_loss(out, target).backward()
    assert_close("gpt2 lm forward", got["out"], out.detach().numpy(), **FWD)
    named = dict(model.named_parameters())
    assert sorted(got["grads"]) == sorted(named)
    for name, p in named.items():
        assert_close(f"gpt2 lm d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)
