"""Small models used by the tests (and importable as package.module:Attr sources)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class MatMulAdd(nn.Module):
    """x @ W + b with W stored [in, out]: exports MatMul + Add, weights transposed against Gemm."""

    def __init__(self, i=45, o=7):
        super().__init__()
        self.w = nn.Parameter(torch.randn(i, o) * 0.2)
        self.b = nn.Parameter(torch.randn(o) * 0.1)

    def forward(self, x):
        return torch.tanh(x @ self.w + self.b)


class ViewFlatten(nn.Module):
    """x.view(x.size(0), -1): a Shape/Gather/Concat subgraph in front of the Reshape."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(45, 7)

    def forward(self, x):
        return self.fc(x.view(x.size(0), -1))


def mlp_45_31_7():
    return nn.Sequential(nn.Linear(45, 31), nn.ReLU(), nn.Linear(31, 7))


def mlp_48_31_7():
    """An input whose texels hold its 48 floats as they are (model.js: isPlainPacking)."""
    return nn.Sequential(nn.Linear(48, 31), nn.ReLU(), nn.Linear(31, 7))


def sample_blocked_mlp():
    """45-200-96-7: the 200->96 layer is past layout.SAMPLE_BLOCK_MIN_MACS, so its forward, grad_input and
    weight gradient compute 8 samples (rows) a fragment from batch 8 on, and its optimizer reads the weight gradient
    through the interleave."""
    return nn.Sequential(nn.Linear(45, 200), nn.ReLU(), nn.Linear(200, 96), nn.ReLU(), nn.Linear(96, 7))


def blocked_cnn():
    """On 1x12x12: both convs are past layout.SAMPLE_BLOCK_MIN_MACS (8 samples a fragment in their forward,
    the second's grad_input), and the second's weight gradient (16 input channels) is row-blocked."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(800, 10))


# name -> (factory, per-sample input shape); every op of the dense pipeline appears here
OP_CASES = {
    "linear_relu_linear": (mlp_45_31_7, (45,)),
    "leaky_relu": (lambda: nn.Sequential(nn.Linear(45, 31), nn.LeakyReLU(0.2), nn.Linear(31, 7)), (45,)),
    "sigmoid": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Sigmoid(), nn.Linear(31, 7)), (45,)),
    "tanh": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Tanh(), nn.Linear(31, 7)), (45,)),
    "no_bias": (lambda: nn.Sequential(nn.Linear(45, 31, bias=False), nn.ReLU(), nn.Linear(31, 7, bias=False)), (45,)),
    # activations that cannot be fused: on the input, and a second one in a row
    "unfused_activations": (lambda: nn.Sequential(nn.Tanh(), nn.Linear(45, 31), nn.ReLU(), nn.Sigmoid(),
                                                  nn.Linear(31, 7), nn.LeakyReLU(0.1)), (45,)),
    "flatten_3d_input": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(45, 13), nn.Tanh(), nn.Linear(13, 7)), (3, 5, 3)),
    "view_flatten": (ViewFlatten, (3, 15)),
    "matmul_add": (MatMulAdd, (45,)),
    "dropout_identity": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Dropout(0.5), nn.ReLU(), nn.Identity(),
                                               nn.Linear(31, 7)), (45,)),
    "sigmoid_output": (lambda: nn.Sequential(nn.Linear(45, 9), nn.Sigmoid()), (45,)),
    # 200x96 weights: past layout.SAMPLE_BLOCK_MIN_MACS, that layer's forward and grad_input compute 8 samples
    # a fragment
    "sample_blocked": (lambda: sample_blocked_mlp(), (45,)),
}

# The cases with sample-blocked layers: those run their blocked passes at batches of 8 or more
# (layout.BLOCK_MIN_BATCH) and their one-sample twins below, so the op tests run them at a batch of
# both kinds (BLOCKED_BATCH: a block of 8 samples and 2 more).
BLOCKED_CASES = ("sample_blocked", "conv_sample_blocked")
BLOCKED_BATCH = 10


# ---- convolutional networks ----------------------------------------------------------------------

class Residual(nn.Module):
    """conv -> relu -> conv, plus the block's input: a tensor with two consumers."""

    def __init__(self, c=5):
        super().__init__()
        self.c1 = nn.Conv2d(3, c, 3, padding=1)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.c3 = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = y + self.c2(torch.relu(y))
        return torch.tanh(self.c3(z)) + z


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 3, 3, padding=1)
        self.b = nn.Conv2d(3, 5, 1)
        self.c = nn.Conv2d(8, 4, 3, stride=2)

    def forward(self, x):
        return self.c(torch.cat([torch.relu(self.a(x)), self.b(x)], 1))


class MeanHead(nn.Module):
    """x.mean(dim=(2, 3)) exports ReduceMean over H, W with keepdims=0."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class SmallCNN(nn.Module):
    """conv -> relu -> pool -> conv -> relu -> pool -> flatten -> linear."""

    def __init__(self, c_in=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 9, 3)
        self.fc = nn.Linear(9 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class ResidualCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.block = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = torch.relu(y + self.block(y))
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(5)
        self.conv2 = nn.Conv2d(5, 6, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 7)
        self.bn3 = nn.BatchNorm1d(7)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1)))


def _seq(*layers):
    """A factory of fresh copies of `layers`, initialised from the RNG as it is when called (so a
    test that seeds first gets the same weights whatever ran before in the process)."""
    def make():
        seq = nn.Sequential(*copy.deepcopy(layers))
        for m in seq.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        return seq
    return make


IMG = (3, 13, 11)
# name -> (factory, per-sample input shape, loss); output 4-D -> mse on the raw output
CNN_CASES = {
    "conv3x3": (_seq(nn.Conv2d(3, 5, 3)), IMG, "mse"),
    "conv_stride2_pad1": (_seq(nn.Conv2d(3, 5, 3, stride=2, padding=1)), IMG, "mse"),
    "conv_pad_0_2": (_seq(nn.Conv2d(3, 5, 3, padding=(0, 2))), IMG, "mse"),
    "conv_dilation2": (_seq(nn.Conv2d(3, 5, 3, dilation=2, padding=1)), IMG, "mse"),
    "conv_kernel_2x3_stride_2x1": (_seq(nn.Conv2d(5, 3, (2, 3), stride=(2, 1))), (5, 13, 11), "mse"),
    "conv_1x1_no_bias": (_seq(nn.Conv2d(5, 9, 1, bias=False)), (5, 13, 11), "mse"),
    "conv_groups2": (_seq(nn.Conv2d(6, 4, 3, groups=2, padding=1)), (6, 13, 11), "mse"),
    "conv_depthwise": (_seq(nn.Conv2d(5, 5, 3, groups=5, padding=1)), (5, 13, 11), "mse"),
    "conv_depthwise_multiplier": (_seq(nn.Conv2d(3, 6, 3, groups=3, stride=2)), IMG, "mse"),
    "conv_asymmetric_pad": (_seq(nn.ZeroPad2d((1, 0, 2, 1)), nn.Conv2d(3, 5, 3)), IMG, "mse"),
    "conv_relu_fused": (_seq(nn.Conv2d(3, 5, 3), nn.ReLU()), IMG, "mse"),
    # past layout.SAMPLE_BLOCK_MIN_MACS: both forwards (3 and 8 input channels) and the second conv's
    # grad_input compute 8 samples a fragment
    "conv_sample_blocked": (_seq(nn.Conv2d(3, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3)), IMG, "mse"),
    "conv_tanh_sigmoid_leaky": (_seq(nn.Conv2d(3, 5, 3), nn.Tanh(), nn.Conv2d(5, 4, 3, padding=1), nn.Sigmoid(),
                                     nn.Conv2d(4, 3, 1), nn.LeakyReLU(0.1)), IMG, "mse"),
    "activation_on_input_and_after_pool": (_seq(nn.ReLU(), nn.Conv2d(3, 5, 3), nn.MaxPool2d(2), nn.Tanh(),
                                                nn.Conv2d(5, 4, 3)), IMG, "mse"),
    "maxpool2": (_seq(nn.Conv2d(3, 5, 3), nn.MaxPool2d(2)), IMG, "mse"),
    "maxpool3_s2_ceil": (_seq(nn.Conv2d(3, 5, 3), nn.MaxPool2d(3, stride=2, ceil_mode=True)), IMG, "mse"),
    "maxpool3_s2_floor": (_seq(nn.Conv2d(3, 5, 3), nn.MaxPool2d(3, stride=2, ceil_mode=False)), IMG, "mse"),
    "maxpool_padding1": (_seq(nn.Conv2d(3, 5, 3), nn.MaxPool2d(3, stride=2, padding=1)), IMG, "mse"),
    "avgpool_pad_include": (_seq(nn.Conv2d(3, 5, 3), nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=True)),
                            IMG, "mse"),
    "avgpool_pad_exclude_ceil": (_seq(nn.Conv2d(3, 5, 3), nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                                                        count_include_pad=False)), IMG, "mse"),
    "avgpool_ceil_include": (_seq(nn.Conv2d(3, 5, 3), nn.AvgPool2d(2, ceil_mode=True)), IMG, "mse"),
    "global_avgpool_flatten_linear": (_seq(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                           nn.Linear(5, 7)), IMG, "cross_entropy"),
    "reduce_mean_linear": (MeanHead, IMG, "cross_entropy"),
    "flatten_nchw_linear": (_seq(nn.Conv2d(3, 5, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 6 * 5, 7)),
                            IMG, "cross_entropy"),
    "residual_add": (Residual, IMG, "mse"),
    "concat": (Concat, IMG, "mse"),
    "small_cnn": (lambda: SmallCNN(3, 7), (3, 13, 13), "cross_entropy"),
}


# ---- pruning --------------------------------------------------------------------------------------

class PrunableNet(nn.Module):
    """Every channel coupling the pruner follows, on a (3, 12, 10) input: a folded batch-norm, a
    residual add, a depthwise conv, a concat of two branches, a depthwise conv with a channel
    multiplier, a flatten into a hidden dense layer. Activations are relu/tanh (f(0) = 0)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 10, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(10)
        self.block = nn.Conv2d(10, 10, 3, padding=1)
        self.dw = nn.Conv2d(10, 10, 3, padding=1, groups=10)
        self.side = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.mix = nn.Conv2d(16, 11, 1)
        self.dw2 = nn.Conv2d(11, 22, (1, 2), groups=11, padding=(0, 1))
        self.fc1 = nn.Linear(22 * 3 * 3, 21)
        self.fc2 = nn.Linear(21, 7)
        with torch.no_grad():  # batch-norm statistics that are not the identity
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        a = torch.relu(self.bn(self.stem(x)))                     # (10, 12, 10)
        a = torch.relu(a + self.block(a))                         # add: stem and block pruned together
        a = F.max_pool2d(torch.tanh(self.dw(a)), 2)               # (10, 6, 5)
        b = torch.relu(self.side(x))                              # (6, 6, 5)
        c = torch.relu(self.mix(torch.cat([a, b], 1)))           # (11, 6, 5)
        c = F.avg_pool2d(torch.tanh(self.dw2(c)), 2)              # (22, 6, 6) -> (22, 3, 3)
        return self.fc2(torch.relu(self.fc1(torch.flatten(c, 1))))


PRUNABLE_SHAPE = (3, 12, 10)


class DigitsCNNWidth(nn.Module):
    """texelfit.examples.DigitsCNN with its widths as arguments: the reference for a pruned one."""

    def __init__(self, c1=16, c2=32, c3=32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        self.fc = nn.Linear(c3 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(x, 1))


def trunk_two_layer_head():
    """On 1x12x12: a conv trunk (conv, relu, pool, conv, relu, flatten: 72 features) under a two-layer head
    (6: 72->16, relu, 8: 16->10): the transfer-learning tests' model."""
    return nn.Sequential(nn.Conv2d(1, 6, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(72, 16), nn.ReLU(), nn.Linear(16, 10))
