"""What trains is what PyTorch trains (issue 30): freshly initialised models, unperturbed, where zero biases,
unit norm weights and equal initial values used to be removed, merged or folded into constants.

For each model the build's trainable set equals `named_parameters()`, the IR run in PyTorch gives the module's
output and every parameter's gradient, and (in the page) Adam and SGD train as PyTorch does; a parameter that
texelfit cannot train yet (a tied one, one read as a constant) fails the build naming it, unless --trainable
leaves it out; a parameter forward does not use is named in the report.
"""
from __future__ import annotations

import pytest
import torch
import transformers as hf
from torch import nn

from helpers import TRAJ_LOSS, TRAJ_W, check_training
from texelfit.build import compile_onnx
from texelfit.prep.graph import to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.torch_ir import IRModule, key


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer as constructed: in_proj_bias and out_proj.bias are zeros, the norms ones."""

    def __init__(self, d=16):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, 2, 32, 0.0, batch_first=True)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        return self.head(self.layer(x)[:, 0])


class Text(nn.Module):
    """A Hugging Face text model on token ids: its logits, or the first token's hidden state."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, ids):
        out = self.m(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state[:, 0]


class Image(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m(pixel_values=x).logits


def encoder():
    return Encoder()


def distilbert():
    return Text(hf.DistilBertForSequenceClassification(hf.DistilBertConfig(
        vocab_size=40, max_position_embeddings=16, dim=16, n_layers=1, n_heads=2, hidden_dim=32, num_labels=3,
        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)))


def vit():
    return Image(hf.ViTForImageClassification(hf.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=3)))


def deit():
    return Image(hf.DeiTForImageClassification(hf.DeiTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=3)))


def gpt2():
    class LastToken(Text):
        def forward(self, ids):
            return self.m(input_ids=ids).logits[:, -1]

    return LastToken(hf.GPT2LMHeadModel(hf.GPT2Config(
        vocab_size=30, n_positions=16, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)))


def t5_encoder():
    return Text(hf.T5EncoderModel(hf.T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                              num_heads=2, dropout_rate=0.0)))


TOKENS = (6,)
IMAGE = (3, 8, 8)
MODELS = {"encoder": (encoder, (5, 16), None), "distilbert": (distilbert, TOKENS, 40), "vit": (vit, IMAGE, None),
          "deit": (deit, IMAGE, None), "t5_encoder": (t5_encoder, TOKENS, 30)}


def _sample(shape, ids, n=3):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, ids, (n,) + shape, generator=g) if ids else torch.randn((n,) + shape, generator=g)


@pytest.mark.parametrize("case", sorted(MODELS))
def test_fresh_models_train_every_parameter(case):
    """The trainable set is named_parameters() (none removed for a zero value, none merged with an equal one),
    and the IR in PyTorch gives the module's output and the gradient of every parameter."""
    factory, shape, ids = MODELS[case]
    torch.manual_seed(0)
    m = factory().eval()
    dtype = "int64" if ids else "float32"
    onnx_model = export_simplified(m, shape, input_dtype=dtype)
    result = compile_onnx(onnx_model, name="m", input_shape=shape, max_batch=4)
    names = sorted(n for n, _ in m.named_parameters())
    assert sorted(result.report["trainable"]) == names
    assert result.report["trainable_set"]["frozen"] == [] and result.report["trainable_set"]["unused"] == []
    g = to_ir(onnx_model, shape, dtype if ids else None)
    x = _sample(shape, ids)
    ir = IRModule(g)
    got = ir(x.float() if ids else x)
    ref = m(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    (got * w).sum().backward()
    (ref * w).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(ir.p[key(n)].grad.reshape(p.shape) if not g.params[n].transposed else
                                   ir.p[key(n)].grad.T.reshape(p.shape), p.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_a_tied_embedding_and_head_train_as_one_tensor():
    """GPT-2's lm_head.weight is transformer.wte.weight: one trainable tensor, read by the embedding and (in the
    table's layout) by the head's matmul, whose gradient is the sum of both; the position table (read at constant
    positions) trains too. The IR in PyTorch gives the module's gradient of the tied weight."""
    torch.manual_seed(0)
    m = gpt2().eval()
    onnx_model = export_simplified(m, TOKENS, input_dtype="int64")
    result = compile_onnx(onnx_model, name="m", input_shape=TOKENS, max_batch=4)
    names = [n for n, _ in m.named_parameters()]
    assert sorted(result.report["trainable"]) == sorted(names)
    wte = "m.transformer.wte.weight"
    assert len(result.report["trainable_set"]["tied"][wte]) == 2
    g = to_ir(onnx_model, TOKENS, "int64")
    x = _sample(TOKENS, 30)
    ir = IRModule(g)
    got, ref = ir(x.float()), m(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    got.square().sum().backward()
    ref.square().sum().backward()
    torch.testing.assert_close(ir.p[key(wte)].grad, m.m.transformer.wte.weight.grad, atol=1e-5, rtol=1e-4)


class LinearTwice(nn.Module):
    """One Linear applied twice on (F,) data: a tie of two dense layers reading it in one layout, which trains as one
    tensor on the sum of their gradients (as ALBERT's shared layers and an unrolled RNN's steps do)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.relu(self.fc(x)))))


def test_a_linear_applied_twice_trains_as_one_tensor(web, site):
    check_training(web, site, LinearTwice, (8,), "adam", "cross_entropy", samples=6, batch_size=3, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


class LinearOnTokensAndVector(nn.Module):
    """One Linear applied to every token and to their mean: its readers need different layouts (a token-wise matmul
    reads [I, O], a dense layer [O, I]), so texelfit does not train it as one tensor yet."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.fc(x).mean(1) + self.fc(x.mean(1)))


class ConstantIndices(nn.Module):
    """A table read at constant indices of two axes, then a column of it: texelfit trains such a read only added to
    attention's scores (T5's relative-position bias)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 4))
        self.register_buffer("idx", torch.tensor([[0, 1, 2], [2, 3, 4]]))
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x + self.table[self.idx][:, :, 0].reshape(-1))


class Folded(nn.Module):
    """`scale * 2` of a parameter alone: the ONNX exporter computes it into a constant."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.ones(3))
        self.spare = nn.Linear(4, 4)  # never used by forward

    def forward(self, x):
        return self.fc(x) * (self.scale * 2)


# model, input shape, what the build says with every parameter trainable, --trainable that freezes the culprit,
# what is then frozen, and what forward does not use
REFUSED = {
    "tie of readers in two layouts": (LinearOnTokensAndVector, (4, 8), r"'fc\.weight': a tied parameter", "out.*",
                                      ["fc.bias", "fc.weight"], []),
    "table read at constant indices of two axes": (
        ConstantIndices, (6,), r"parameter 'table' read at constant indices of two axes", "fc.*", ["table"], []),
    "parameter computed into a constant": (
        Folded, (4,), r"'scale': the ONNX exporter computed it into a constant", "fc.*", ["scale"],
        ["spare.bias", "spare.weight"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_parameter_that_would_not_train_fails_the_build_naming_it_and_builds_frozen(case):
    """The build names the parameter and why; left out of --trainable it ships frozen (a constant), and the report
    lists it, and the parameters forward does not use."""
    factory, shape, says, trainable, frozen, unused = REFUSED[case]
    torch.manual_seed(0)
    onnx_model = export_simplified(factory().eval(), shape)
    with pytest.raises(BuildError, match=says):
        compile_onnx(onnx_model, name="m", input_shape=shape, max_batch=4)
    result = compile_onnx(onnx_model, name="m", input_shape=shape, max_batch=4, trainable=trainable)
    assert result.report["trainable_set"]["frozen"] == frozen
    assert result.report["trainable_set"]["unused"] == unused


def test_export_is_deterministic_and_keeps_real_values():
    """The marks that keep parameters apart at export are never shipped: the initializers hold the module's
    values, and two exports are byte-identical."""
    import numpy as np
    from onnx import numpy_helper

    torch.manual_seed(0)
    m = Encoder().eval()
    a = export_simplified(m, (5, 16))
    b = export_simplified(m, (5, 16))
    assert a.SerializeToString() == b.SerializeToString()
    inits = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    assert np.array_equal(inits["layer.self_attn.in_proj_bias"], np.zeros(48, np.float32))
    assert np.array_equal(inits["layer.norm1.weight"], np.ones(16, np.float32))


@pytest.mark.parametrize("opt,backend", [("sgd_momentum_wd", None), ("adam", None), ("sgd", {"backend": "cpu"}),
                                         ("adam", {"precision": "rgba8"})])
def test_a_tied_gpt2_trains_like_pytorch(web, site, opt, backend):
    """3 steps of a freshly initialised GPT-2 (tied embedding and head, zero biases, position table): every
    parameter, the tied one under its one name, ends where PyTorch's does."""
    noise = {"m.transformer.h.0.attn.c_attn.bias": slice(16, 32)} if opt == "adam" else None  # (the key's bias)

    def make():
        return gpt2()

    make.__name__ = f"fresh_gpt2_{opt}_{len(backend or {})}{sorted(backend or {})}".replace("[", "").replace("]", "").replace("'", "")
    got = check_training(web, site, make, TOKENS, opt, "cross_entropy", samples=6, batch_size=2, epochs=1,
                         tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=12, options=backend, max_batch=4, ids=30, noise=noise)
    assert sorted(got["weights"]) == sorted(make().state_dict())  # lm_head.weight too: the tied one, twice
    assert got["weights"]["m.lm_head.weight"] == got["weights"]["m.transformer.wte.weight"]


@pytest.mark.parametrize("case,opt,backend", [
    ("encoder", "sgd_momentum_wd", None), ("encoder", "adam", None), ("distilbert", "sgd", None),
    ("distilbert", "adam", {"backend": "cpu"}), ("vit", "sgd_nesterov", None), ("vit", "adam", None),
    ("deit", "sgd", {"backend": "cpu"}), ("deit", "adam", None), ("t5_encoder", "adam", None),
    ("t5_encoder", "sgd_momentum_wd", {"precision": "rgba8"}),
])
def test_fresh_models_train_like_pytorch(web, site, case, opt, backend):
    """3 steps from the fresh initialisation, every parameter compared. The attention key's bias (zeros at init)
    has a gradient of exactly zero in exact arithmetic (the softmax cancels it): under Adam both sides train
    rounding noise there (helpers.check_training's `noise`)."""
    factory, shape, ids = MODELS[case]
    keys = {"encoder": "layer.self_attn.in_proj_bias", "distilbert": "m.distilbert.transformer.layer.0.attention.k_lin.bias",
            "vit": "m.vit.layers.0.attention.k_proj.bias",
            "deit": "m.deit.layers.0.attention.k_proj.bias"}
    noise = {keys[case]: slice(16, 32) if case == "encoder" else slice(0, 16)} if opt == "adam" and case in keys else None

    def make():
        return factory()

    make.__name__ = f"fresh_{case}_{opt}"
    got = check_training(web, site, make, shape, opt, "cross_entropy", samples=6, batch_size=2, epochs=1, tol_w=TRAJ_W,
                         tol_loss=TRAJ_LOSS, seed=11, options=backend, max_batch=4, ids=ids, noise=noise)
    assert sorted(got["weights"]) == sorted(make().state_dict())  # getWeights is keyed as the state_dict


def _fresh_torchvision_vit():
    """test_vit.py's torchvision-style ViT with torchvision's initial values: the class token and every bias
    zeros, the norms ones (so the exporter merges them into a few initializers)."""
    from test_vit import TorchvisionStyleViT

    torch.manual_seed(0)
    m = TorchvisionStyleViT()
    with torch.no_grad():
        m.class_token.zero_()
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.fill_(1.0)
                mod.bias.zero_()
            elif isinstance(mod, nn.MultiheadAttention):
                mod.in_proj_bias.zero_()
                mod.out_proj.bias.zero_()
            elif isinstance(mod, nn.Linear):
                mod.bias.zero_()
    return m


@pytest.fixture(scope="module")
def user_onnx_vit(tmp_path_factory):
    """The ViT exported by its user (the legacy exporter, opset 17, constant folding on), its state_dict beside."""
    folder = tmp_path_factory.mktemp("user_vit")
    m = _fresh_torchvision_vit().eval()
    torch.onnx.export(m, torch.randn(1, *IMAGE), str(folder / "vit.onnx"), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    torch.save(m.state_dict(), folder / "vit.pt")
    return folder


def test_a_user_exported_onnx_file_trains_every_initializer_used_as_a_parameter(user_onnx_vit):
    """Every initializer used as a parameter trains, the merged ones untied (as many trainable tensors as the
    module has parameters); with --weights the transposed Linear weights get their state_dict names back, and
    the report lists the untied copies whose names could not be recovered."""
    from texelfit.prep.load import load_onnx

    m = _fresh_torchvision_vit()
    names = [n for n, _ in m.named_parameters()]
    plain = compile_onnx(load_onnx(str(user_onnx_vit / "vit.onnx")), name="v", max_batch=4)
    assert len(plain.report["trainable"]) == len(names)
    assert plain.report["trainable_set"]["untied"]  # zeros and ones merged by the exporter
    assert any(n.startswith("onnx::MatMul") for n in plain.report["trainable"])
    named = compile_onnx(load_onnx(str(user_onnx_vit / "vit.onnx"), weights=str(user_onnx_vit / "vit.pt")),
                         name="v", max_batch=4)
    assert len(named.report["trainable"]) == len(names)
    assert not any(n.startswith("onnx::") for n in named.report["trainable"])
    unrecovered = named.report["trainable_set"]["unrecovered"]
    assert sorted(set(named.report["trainable"]) - set(unrecovered)) == sorted(set(names) & set(named.report["trainable"]))
    assert set(unrecovered) <= set(named.report["trainable_set"]["untied"])
    for n in named.report["trainable"]:
        assert named.report["trainable_set"]["consumers"][n], n


@pytest.mark.parametrize("opt", ["sgd_momentum_wd", "adam"])
def test_a_user_exported_onnx_file_trains_like_pytorch(web, site, user_onnx_vit, opt):
    """3 steps: the losses are PyTorch's (an untied copy left untrained would change them from the second step
    on), and every tensor under a state_dict name ends where PyTorch's does."""
    import numpy as np

    from helpers import FIT, OPTIMIZERS, assert_close, run_model, torch_fit
    from texelfit.prep.load import load_onnx

    result = compile_onnx(load_onnx(str(user_onnx_vit / "vit.onnx"), weights=str(user_onnx_vit / "vit.pt")),
                          name="v", max_batch=4)
    url = f"{site.add_files(f'user_vit_{opt}', result.files)}/v.js"
    m = _fresh_torchvision_vit()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn((6,) + IMAGE, generator=g), torch.randint(0, 5, (6,), generator=g)
    cfg = OPTIMIZERS[opt]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "loss": "cross_entropy",
                                    "optimizer": cfg, "batchSize": 2, "epochs": 1, "shuffle": False, "ids": False})
    ref = torch_fit(m, x, y, "cross_entropy", cfg, 2, 1)
    assert_close(f"{opt} losses", got["loss"], ref, **TRAJ_LOSS)
    noise = {"blocks.0.self_attention.in_proj_bias", "blocks.1.self_attention.in_proj_bias"}
    compared = 0
    for n, p in m.named_parameters():
        if n in got["weights"] and not (opt == "adam" and n in noise):  # (the key's bias: rounding noise, above)
            assert_close(f"{opt} {n}", np.asarray(got["weights"][n]), p.detach().numpy(), **TRAJ_W)
            compared += 1
    assert compared >= 17


def test_import_weights_gives_a_tied_parameter_under_each_key(tmp_path):
    """getWeights gives GPT-2's tied weight as transformer.wte.weight and lm_head.weight; import-weights takes them
    (equal) back into a state_dict that the module loads strictly."""
    import json

    from texelfit.importer import import_weights

    torch.manual_seed(0)
    m = gpt2().eval()
    (tmp_path / "m.onnx").write_bytes(export_simplified(m, TOKENS, input_dtype="int64").SerializeToString())
    new = {k: (v + 0.5).reshape(-1).tolist() for k, v in m.state_dict().items()}
    (tmp_path / "w.json").write_text(json.dumps(new))
    import_weights(str(tmp_path / "w.json"), str(tmp_path / "m.onnx"), str(tmp_path / "w.pt"))
    fresh = gpt2()
    fresh.load_state_dict(torch.load(tmp_path / "w.pt"), strict=True)
    assert torch.equal(fresh.m.lm_head.weight, m.m.transformer.wte.weight.detach() + 0.5)
    new["m.lm_head.weight"] = [0.0] * len(new["m.lm_head.weight"])
    (tmp_path / "w.json").write_text(json.dumps(new))
    with pytest.raises(BuildError, match="one tied parameter"):
        import_weights(str(tmp_path / "w.json"), str(tmp_path / "m.onnx"), str(tmp_path / "w.pt"))


class _PreActivation(nn.Module):
    """BN-ReLU-conv of an input that the block's sum reads too (pre-activation ResNet, as DenseNet's BN-ReLU-conv
    of a concatenation): batch-norms that cannot fold, all of one size."""

    def __init__(self, c=4):
        super().__init__()
        self.f = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False))

    def forward(self, x):
        return x + self.f(x)


def fresh_preactivation_net():
    """Three units and a BN-ReLU-pool head, as constructed: every batch-norm's scale 1 and shift 0, which the ONNX
    exporter merges into one initializer each."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _PreActivation(), _PreActivation(), _PreActivation(),
                         nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


def test_a_fresh_onnx_files_merged_batch_norms_train_each_like_pytorch(web, site):
    """The exporter merged the batch-norms' equal scales and shifts (a fresh DenseNet's): each trains as its own
    tensor, under its state_dict name, and Adam trains them as PyTorch does (before: a build error, 'a tied
    batch-norm parameter')."""
    check_training(web, site, fresh_preactivation_net, (3, 6, 6), "adam", "cross_entropy", samples=4, batch_size=2,
                   epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, onnx_file=True)
