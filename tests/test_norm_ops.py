"""Normalisations that do not fold: a batch-norm anywhere (DenseNet), GroupNorm and InstanceNorm (lowered at import
into the ops the IR has, prep/normalization.py), against PyTorch: forward, every gradient and optimizer trajectories,
on WebGL2 (float32), in the rgba8 tier and on the CPU backend, at the README's tolerances (helpers.py).

The op checks start from perturbed parameters and running statistics (a scale of ones and a shift of zeros would
hide a swap of the two); the trajectories from PyTorch's own fresh initialisation (ones and zeros), which must train
exactly as PyTorch trains them.
"""
from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}


def _seed(case: str) -> int:
    return zlib.crc32(case.encode()) % 1000


class DenseBlock(nn.Module):
    """DenseNet's pattern: batch-norm after a max-pool and after a concat (BN-ReLU-conv)."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = nn.BatchNorm2d(6)
        self.conv1 = nn.Conv2d(6, 5, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(11)
        self.fc = nn.Linear(11, 4)

    def forward(self, x):
        x = self.pool(self.conv0(x))
        y = self.conv1(F.relu(self.norm1(x)))
        z = F.relu(self.norm2(torch.cat([x, y], 1)))
        return self.fc(z.mean((2, 3)))


class GroupNormCNN(nn.Module):
    """GroupNorm of 3 groups (affine), one group (LayerNorm over C, H, W), one group a channel without affine."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.gn1 = nn.GroupNorm(3, 6)
        self.conv2 = nn.Conv2d(6, 5, 3, stride=2)
        self.gn2 = nn.GroupNorm(1, 5)
        self.gn3 = nn.GroupNorm(5, 5, affine=False)
        self.fc = nn.Linear(5 * 2 * 3, 4)

    def forward(self, x):
        x = F.relu(self.gn1(self.conv1(x)))
        x = self.gn3(F.silu(self.gn2(self.conv2(x))))
        return self.fc(x.flatten(1))


class InstanceNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        # (a conv's bias right before an instance norm is cancelled by it: no gradient, in PyTorch too)
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.in1 = nn.InstanceNorm2d(6, affine=True)
        self.conv2 = nn.Conv2d(6, 4, 3, bias=False)
        self.in2 = nn.InstanceNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 3, 3)

    def forward(self, x):  # (a mean over H and W of an instance-normalised map would be 0: flattened instead)
        x = F.relu(self.in1(self.conv1(x)))
        return self.fc(self.in2(self.conv2(x)).flatten(1))


class Wav2Vec2Features(nn.Module):
    """wav2vec2's feature extractor: Conv1d + GroupNorm (a group per channel) + GELU, then Conv1d + GELU, and an
    InstanceNorm1d (affine) before a head on every frame (a mean over time of it would be its bias alone)."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv1d(1, 8, 5, stride=2, bias=False)
        self.norm0 = nn.GroupNorm(8, 8)
        self.conv1 = nn.Conv1d(8, 6, 3, stride=2, bias=False)
        self.norm1 = nn.InstanceNorm1d(6, affine=True)
        self.head = nn.Linear(6 * 9, 3)

    def forward(self, x):
        x = F.gelu(self.norm0(self.conv0(x)))
        x = self.norm1(F.gelu(self.conv1(x)))
        return self.head(x.flatten(1))


CASES = {"dense_block": (DenseBlock, (3, 9, 10)), "group_norm": (GroupNormCNN, (3, 5, 7)),
         "instance_norm": (InstanceNormCNN, (3, 6, 5)), "wav2vec2_features": (Wav2Vec2Features, (1, 41))}


def _perturbed(factory):
    def make():
        m = factory()
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, t in list(m.named_parameters()) + list(m.named_buffers()):
                if name.endswith("running_var"):
                    t.uniform_(0.5, 2.0, generator=g)
                elif name.endswith("running_mean"):
                    t.uniform_(-0.5, 0.5, generator=g)
                elif t.is_floating_point():
                    t.add_(0.3 * torch.randn(t.shape, generator=g))
        return m
    make.__name__ = factory.__name__
    return make


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients(web, site, case, backend):
    factory, shape = CASES[case]
    check_op(web, site, f"norm_{case}_{backend}", _perturbed(factory), shape, "cross_entropy", batch=5,
             seed=_seed(case), options=BACKENDS[backend])


@pytest.mark.parametrize("case,opt,backend", [("dense_block", "adam", "webgl"), ("dense_block", "sgd_momentum_wd", "cpu"),
                                              ("group_norm", "adam", "webgl"), ("group_norm", "sgd", "rgba8"),
                                              ("instance_norm", "sgd_momentum_wd", "webgl"),
                                              ("wav2vec2_features", "adam", "cpu")])
def test_fresh_model_trains_like_pytorch(web, site, case, opt, backend):
    """From PyTorch's own initialisation (scales of ones, shifts of zeros, running mean 0 and variance 1)."""
    factory, shape = CASES[case]
    check_training(web, site, factory, shape, opt, "cross_entropy", samples=13, batch_size=5, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=_seed(case), options=BACKENDS[backend])


def test_every_parameter_has_a_gradient():
    """No case is degenerate (an output that some parameter cannot change would check nothing of it)."""
    for case, (factory, shape) in sorted(CASES.items()):
        torch.manual_seed(0)
        module = _perturbed(factory)().eval()
        F.cross_entropy(module(torch.randn((5,) + shape)), torch.tensor([0, 1, 2, 0, 1])).backward()
        for name, p in module.named_parameters():
            assert p.grad.abs().max() > 1e-4, (case, name)


def test_what_trains_is_named_parameters():
    """Every parameter trains under its state_dict name; a batch-norm that follows its conv still folds into it."""
    for case, (factory, shape) in sorted(CASES.items()):
        module = factory().eval()
        result = compile_onnx(export_simplified(module, shape), name="m", input_shape=shape, max_batch=4)
        names = {n for n, _ in module.named_parameters()}
        assert set(result.report["trainable"]) == names, (case, sorted(set(result.report["trainable"]) ^ names))
        assert result.report["batchnorm_folded"] == 0 and result.report["trainable_set"]["batchnorm_folded"] == []
    module = nn.Sequential(DenseBlock(), nn.BatchNorm1d(4)).eval()  # after the classifier alone: folded into it
    result = compile_onnx(export_simplified(module, (3, 9, 10)), name="m", input_shape=(3, 9, 10), max_batch=4)
    assert result.report["trainable_set"]["batchnorm_folded"] == ["1.bias", "1.weight"]
    assert result.report["batchnorm_folded"] == 1
    assert set(result.report["trainable"]) == {n for n, _ in module.named_parameters()} - {"1.weight", "1.bias"}


def test_frozen_free_batchnorm_ships_as_constants():
    module = DenseBlock().eval()
    result = compile_onnx(export_simplified(module, (3, 9, 10)), name="m", input_shape=(3, 9, 10), max_batch=4,
                          trainable="conv*,fc.*")
    assert set(result.report["trainable"]) == {"conv0.weight", "conv0.bias", "conv1.weight", "fc.weight", "fc.bias"}
    assert {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"} <= set(result.report["trainable_set"]["frozen"])


@pytest.mark.parametrize("case", ["group_norm", "instance_norm", "dense_block"])
def test_a_user_exported_onnx_file_trains_the_same_set(tmp_path, case):
    """Exported by its user (legacy exporter, opset 17) with its state_dict beside (--weights, which names the
    initializers the exporter computed: GroupNorm's [C, 1, 1] weight and bias become onnx::Mul_N and onnx::Add_N):
    the norms' weights and biases train, GroupNorm's exporter-made ones and zeros do not, and the built model
    computes what PyTorch does."""
    from texelfit.prep.load import load_onnx
    from texelfit.prep.fold import fold_batchnorm
    from texelfit.prep.graph import to_ir
    from texelfit.prep.torch_ir import IRModule

    factory, shape = CASES[case]
    m = _perturbed(factory)().eval()
    path = str(tmp_path / "m.onnx")
    torch.onnx.export(m, torch.randn(1, *shape), path, dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    torch.save(m.state_dict(), tmp_path / "m.pt")
    model = load_onnx(path, weights=str(tmp_path / "m.pt"))
    result = compile_onnx(model, name="m", max_batch=4)
    names = {n for n, _ in m.named_parameters()}
    assert set(result.report["trainable"]) == names, sorted(set(result.report["trainable"]) ^ names)
    x = torch.randn((3,) + shape)
    got = IRModule(fold_batchnorm(to_ir(model))).eval()(x).detach()
    assert torch.allclose(got, m(x), atol=1e-5), float((got - m(x)).abs().max())
