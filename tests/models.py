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


def mlp_45_31_100():
    """100 classes: cross_entropy's softmax statistics get a pass of their own (layout.CE_STATS_MIN_C4)."""
    return nn.Sequential(nn.Linear(45, 31), nn.ReLU(), nn.Linear(31, 100))


def mlp_48_31_7():
    """An input whose texels hold its 48 floats as they are (model.js: isPlainPacking)."""
    return nn.Sequential(nn.Linear(48, 31), nn.ReLU(), nn.Linear(31, 7))


def sample_blocked_mlp():
    """45-200-96-7: the 200->96 layer is past blocking.SAMPLE_BLOCK_MIN_MACS, so its forward, grad_input and
    weight gradient compute 8 samples (rows) a fragment from batch 8 on, and its optimizer reads the weight gradient
    through the interleave."""
    return nn.Sequential(nn.Linear(45, 200), nn.ReLU(), nn.Linear(200, 96), nn.ReLU(), nn.Linear(96, 7))


def blocked_cnn():
    """On 1x12x12: both convs are past blocking.SAMPLE_BLOCK_MIN_MACS (8 samples a fragment in their forward,
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
    # 200x96 weights: past blocking.SAMPLE_BLOCK_MIN_MACS, that layer's forward and grad_input compute 8 samples
    # a fragment
    "sample_blocked": (lambda: sample_blocked_mlp(), (45,)),
}

# The cases with sample-blocked layers: those run their blocked passes at batches of 8 or more
# (blocking.BLOCK_MIN_BATCH) and their one-sample twins below, so the op tests run them at a batch of
# both kinds (BLOCKED_BATCH: a block of 8 samples and 2 more).
BLOCKED_CASES = ("sample_blocked", "conv_sample_blocked", "conv_column_blocked")
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


class ColumnChain(nn.Module):
    """Convs past blocking.COLUMN_BLOCK_MIN_MACS reading one another, as in an inverted-residual trunk: a padded
    3x3 stem, a 1x1, a padded 5x5 depthwise, a strided one, a 1x1 read by a 1x1 and an add, on 23 columns (a
    partial last block of 4) then 12. Frozen (`fc.*` trains), the outputs of the first four convs are kept as
    column parts alone (blocking.column_only); the last two feed the add and keep their interleaves. 34 and 90
    channels: 9 and 23 texels, halves of 5 and 12 (the last texel of half 1 past the channels), the last
    texel partly empty (the 1x1 reading 34 as parts reads 2 channels of it)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 34, 3, padding=1)
        self.expand = nn.Conv2d(34, 90, 1)
        self.dw = nn.Conv2d(90, 90, 5, padding=2, groups=90)
        self.down = nn.Conv2d(90, 90, 5, stride=2, padding=2, groups=90)
        self.project = nn.Conv2d(90, 48, 1)
        self.mix = nn.Conv2d(48, 48, 1)
        self.fc = nn.Linear(48, 5)

    def forward(self, x):
        x = F.relu6(self.stem(x))
        x = torch.tanh(self.dw(self.expand(x)))
        y = self.project(F.relu(self.down(x)))
        y = y + self.mix(y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


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


# ---- shape ops on activations (prep/shape.py: gather) ----------------------------------------------

def channel_shuffle(x, groups):
    """ShuffleNet's: view as (groups, C / groups), transpose, view back."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit as torchvision writes it: stride 1 splits the channels in two halves (chunk),
    runs the second through 1x1 -> depthwise 3x3 -> 1x1, concatenates and shuffles; stride 2 runs both
    branches on the whole input."""

    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.stride = stride
        half = c_out // 2
        if stride > 1:
            self.branch1 = nn.Sequential(nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in), nn.Conv2d(c_in, half, 1),
                                         nn.ReLU())
        c2 = c_in if stride > 1 else half
        self.branch2 = nn.Sequential(nn.Conv2d(c2, half, 1), nn.ReLU(), nn.Conv2d(half, half, 3, stride, 1, groups=half),
                                     nn.Conv2d(half, half, 1), nn.ReLU())

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetTiny(nn.Module):
    """A stem, a stride-2 unit and a stride-1 unit of ShuffleNetV2 (10 channels: padded lanes), a head."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.down = ShuffleUnit(6, 10, 2)
        self.unit = ShuffleUnit(10, 10, 1)
        self.fc = nn.Linear(10, classes)

    def forward(self, x):
        x = self.unit(self.down(torch.relu(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


class PermuteFlatten(nn.Module):
    """Flattening in other orders: channels last (permute, then flatten), and (H*W, C) tokens
    (flatten(2), then transpose) flattened again."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, stride=2)
        self.fc = nn.Linear(2 * 5 * 6 * 5, 7)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        a = y.permute(0, 2, 3, 1).flatten(1)
        b = y.flatten(2).transpose(1, 2).reshape(y.shape[0], -1)
        return self.fc(torch.cat([a, b], 1))


class SqueezeUnsqueeze(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.conv2 = nn.Conv2d(5, 4, 3, stride=2)
        self.fc = nn.Linear(5, 6)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        pooled = F.adaptive_avg_pool2d(y, 1).squeeze(3).squeeze(2)  # (5,): a view, no pass
        z = self.conv2(y).unsqueeze(2).flatten(1, 2)  # (4, 1, H, W) -> (4, H, W): the same texels again
        return torch.cat([self.fc(pooled).unsqueeze(1), z.flatten(1).unsqueeze(1)[:, :, :6]], 1)


class SliceSteps(nn.Module):
    """Slices with steps on channels (across texel lanes), rows and columns."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 9, 3)
        self.conv2 = nn.Conv2d(4, 5, 2)

    def forward(self, x):
        y = self.conv(x)  # (9, 11, 9)
        return self.conv2(torch.tanh(y[:, 1:8:2, ::2, 1:]))  # (4, 6, 8)


class ConcatConstant(nn.Module):
    """Concat with constant operands (a buffer repeated over the batch, zeros) on the channel axis,
    and of activations on the H and W axes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.side = nn.Conv2d(3, 5, 3)
        self.register_buffer("coords", torch.randn(1, 2, 11, 9))
        self.mix = nn.Conv2d(8, 4, 3)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (5, 11, 9)
        n = y.shape[0]
        y = torch.cat([y, self.coords.expand(n, -1, -1, -1), torch.zeros(n, 1, 11, 9)], 1)  # (8, 11, 9)
        z = torch.tanh(self.side(x))  # (5, 11, 9)
        m = self.mix(y)  # (4, 9, 7)
        w = torch.cat([m, m[:, :, :, :2]], 3)  # (4, 9, 9)
        return torch.cat([w, z[:, :4, :3, :], w[:, :, :1]], 2)  # (4, 13, 9)


class SplitUneven(nn.Module):
    """torch.split with uneven sizes on the channel axis, and in equal halves on the W axis."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 9, 3, padding=1)
        self.a = nn.Conv2d(6, 4, 3)
        self.b = nn.Conv2d(3, 4, 3)
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        p, q, r = torch.split(self.conv(x), [2, 3, 4], dim=1)
        left, right = torch.split(torch.relu(q), [5, 6], dim=3)
        return self.a(torch.cat([r, p], 1))[:, :, :, :3] + self.b(left) + self.c(right)[:, :, :, 1:]  # (4, 11, 3)


class PadAlone(nn.Module):
    """Pad on its own (not folded into a conv): zeros around H and W, zeros on the channel axis, and a crop
    (negative pads), each before an op onnxsim does not fold it into."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.conv2 = nn.Conv2d(8, 4, 3)

    def forward(self, x):
        y = torch.tanh(F.pad(self.conv(x), (1, 2, 0, 1)))            # (5, 12, 12)
        y = torch.relu(F.pad(y, (0, 0, 0, 0, 1, 2)))                  # (8, 12, 12)
        return self.conv2(torch.sigmoid(F.pad(y, (-1, 0, 0, -2))))    # (8, 10, 11) -> (4, 8, 9)


class KeywordSpotter(nn.Module):
    """A keyword-spotting Conv1d net on (13 MFCCs, 25 frames): conv, folded batch-norm, ReLU, MaxPool1d, a
    depthwise strided conv, AvgPool1d, the mean over time, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(13, 16, 5, padding=2, bias=False)
        self.bn = nn.BatchNorm1d(16)
        self.dw = nn.Conv1d(16, 16, 3, stride=2, groups=16)
        self.pw = nn.Conv1d(16, 12, 1)
        self.fc = nn.Linear(12, 6)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.3, 0.3)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = F.max_pool1d(torch.relu(self.bn(self.conv(x))), 2)          # (16, 12)
        y = F.avg_pool1d(torch.relu(self.dw(y)), 2, ceil_mode=True)      # (16, 5) -> (16, 3)
        return self.fc(torch.tanh(self.pw(y)).mean(2))


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
    # past blocking.SAMPLE_BLOCK_MIN_MACS: both forwards (3 and 8 input channels) and the second conv's
    # grad_input compute 8 samples a fragment
    "conv_sample_blocked": (_seq(nn.Conv2d(3, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3)), IMG, "mse"),
    # past blocking.COLUMN_BLOCK_MIN_MACS: every forward computes 4 positions a fragment (19 = 4*4 + 3 columns: a
    # partial last block), at any batch; a 3-channel conv with padding, a 1x1, a padded 5x5 depthwise, a strided
    # one; the groups-1 convs past 8 input channels are sample-blocked too (their grad_input and weight gradient)
    "conv_column_blocked": (_seq(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU6(), nn.Conv2d(32, 48, 1),
                                 nn.Conv2d(48, 48, 5, padding=2, groups=48), nn.Tanh(),
                                 nn.Conv2d(48, 21, 3, stride=2, padding=1)), (3, 19, 19), "mse"),
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
    "pad_on_its_own": (PadAlone, IMG, "mse"),
    # Conv1d ending in its (C, T) output; the keyword spotter's batch-norm folds into its conv
    "conv1d_output": (_seq(nn.Conv1d(4, 6, 3, padding=1), nn.ReLU(), nn.Conv1d(6, 5, 3, dilation=2)), (4, 17), "mse"),
    "small_cnn": (lambda: SmallCNN(3, 7), (3, 13, 13), "cross_entropy"),
    # shape ops (prep/shape.py)
    "shufflenet_v2_units": (ShuffleNetTiny, IMG, "cross_entropy"),
    "permute_flatten": (PermuteFlatten, IMG, "cross_entropy"),
    "squeeze_unsqueeze": (SqueezeUnsqueeze, IMG, "mse"),
    "slice_steps": (SliceSteps, IMG, "mse"),
    "concat_constant_and_axes": (ConcatConstant, IMG, "mse"),
    "split_uneven": (SplitUneven, IMG, "mse"),
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


# ---- elementwise ops and the blocks of mobile CNNs (no torchvision: the blocks written here) ------------

class Unary(nn.Module):
    """`fn` on the model input (a pass of its own), and after a conv (fused into it where its derivative
    reads only its output), then a linear head."""

    def __init__(self, fn, c_in=3):
        super().__init__()
        self.fn = fn
        self.conv = nn.Conv2d(c_in, 5, 3)
        self.fc = nn.Linear(5 * 9 * 7, 4)

    def forward(self, x):
        return self.fc(torch.flatten(self.fn(self.conv(self.fn(x))), 1))


def _pos(t):
    return t.abs() + 0.5  # Abs, then Add of a constant: a positive domain for log, sqrt, ...


UNARY_FNS = {
    "relu6": nn.ReLU6(),
    "clamp": lambda t: t.clamp(-0.5, 0.8),
    "hardsigmoid": nn.Hardsigmoid(),
    "hardswish": nn.Hardswish(),
    "elu": nn.ELU(0.7),
    "selu": nn.SELU(),
    "softplus": nn.Softplus(),
    "exp": lambda t: torch.exp(t * 0.5),
    "log": lambda t: torch.log(_pos(t)),
    "sqrt": lambda t: torch.sqrt(_pos(t)),
    "neg": torch.neg,
    "abs": torch.abs,
    "sign": lambda t: t * torch.sign(t - 0.1) + torch.sign(t),  # (its zero gradient beside one that flows)
    "reciprocal": lambda t: torch.reciprocal(_pos(t)),
    "pow2": lambda t: t ** 2,
    "pow3": lambda t: (t * 0.5) ** 3,  # scaled: x ** 9 (the op twice) would leave float32 torch no digits to compare
    "pow_1_5": lambda t: _pos(t) ** 1.5,
    "erf": torch.erf,
    "silu": nn.SiLU(),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "sigmoid_tanh": lambda t: torch.tanh(torch.sigmoid(t) * 3),
}
UNARY_SHAPE = (3, 11, 9)


def unary_case(name):
    return lambda: Unary(UNARY_FNS[name])


class PReLUNet(nn.Module):
    """A PReLU per channel after a conv, and one with a single slope after a linear: trainable slopes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2)
        self.act = nn.PReLU(6, init=0.2)
        self.fc = nn.Linear(6 * 5 * 4, 9)
        self.act2 = nn.PReLU(init=-0.1)
        self.head = nn.Linear(9, 4)
        with torch.no_grad():
            self.act.weight.uniform_(-0.3, 0.5)

    def forward(self, x):
        return self.head(self.act2(self.fc(torch.flatten(self.act(self.conv(x)), 1))))


class Normalize(nn.Module):
    """(x - mean) / std inside forward (buffers [1, 3, 1, 1]), and scalar arithmetic: Sub and Div of
    constants, x * 0.5 + 1 and 2 - x."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 9 * 7, 5)

    def forward(self, x):
        y = self.conv((x - self.mean) / self.std)
        return self.fc(torch.flatten(2.0 - (y * 0.5 + 1.0) / 3.0, 1))


class TwoActivations(nn.Module):
    """Products and quotients of two activations of one shape, and a layer scale (an nn.Parameter
    [C, 1, 1] that trains)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 5, 3)
        self.b = nn.Conv2d(3, 5, 3)
        self.gamma = nn.Parameter(torch.rand(5, 1, 1) + 0.5)
        self.fc = nn.Linear(5 * 9 * 7, 4)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        y = a * b - a / (b.abs() + 1.0)
        return self.fc(torch.flatten(y * self.gamma, 1))


class SqueezeExcite(nn.Module):
    """x * gate(x): the gate from the global average through two 1x1 convs ([N, C, 1, 1] broadcast)."""

    def __init__(self, c, squeeze, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.reduce = nn.Conv2d(c, squeeze, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeeze, c, 1)
        self.gate = gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, BN, ReLU6, depthwise 3x3, BN, ReLU6, 1x1 project, BN, + input."""

    def __init__(self, c=8, expand=3):
        super().__init__()
        h = c * expand
        self.block = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.block(x)


class MobileNetV3Block(nn.Module):
    """MobileNetV3's block: 1x1 expand, HardSwish, depthwise 3x3 stride 2, SE with a HardSigmoid gate,
    1x1 project."""

    def __init__(self, c=8, h=16, out=12):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(h, h, 3, stride=2, padding=1, groups=h, bias=False), nn.BatchNorm2d(h),
                                nn.Hardswish())
        self.se = SqueezeExcite(h, 8, nn.ReLU, nn.Hardsigmoid)
        self.project = nn.Sequential(nn.Conv2d(h, out, 1, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        return self.project(self.se(self.dw(self.expand(x))))


class MBConv(nn.Module):
    """EfficientNet-B0's block: 1x1 expand, SiLU, depthwise 3x3, SiLU, SE (SiLU, sigmoid), 1x1 project,
    + input."""

    def __init__(self, c=8, expand=4):
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.SiLU())
        self.se = SqueezeExcite(h, 2, nn.SiLU, nn.Sigmoid)
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.project(self.se(self.dw(self.expand(x))))


class RegNetYBlock(nn.Module):
    """RegNetY's block: 1x1, BN, ReLU, grouped 3x3 (groups of 4), BN, ReLU, SE, 1x1, BN, + input, ReLU."""

    def __init__(self, c=8):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=2, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.se = SqueezeExcite(c, 2)
        self.c = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.c(self.se(self.b(self.a(x)))))


def _with_bn_stats(module):
    """Non-trivial batch-norm statistics, as a trained network has, then each batch-norm folded into the
    conv before it as texelfit folds it (prep/fold.py): the folded module is the reference whose
    parameters train (test_cnn_ops.py tests the folding itself)."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.6, 1.4)
                m.bias.uniform_(-0.2, 0.2)
    module.eval()
    for seq in [m for m in module.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], (nn.Conv2d, nn.ConvTranspose2d)) and isinstance(seq[i + 1], nn.BatchNorm2d):
                seq[i], seq[i + 1] = fuse_conv_bn_eval(seq[i], seq[i + 1], transpose=isinstance(
                    seq[i], nn.ConvTranspose2d)), nn.Identity()
    for p in module.parameters():  # the bias a conv without one gains is made not to train
        p.requires_grad_(True)
    return module


class Mobile(nn.Module):
    """stem conv 3 -> 8, the block, global average, linear to 5 classes."""

    def __init__(self, block, out=8):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = block
        self.fc = nn.Linear(out, 5)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.block(torch.relu(self.stem(x))), 1).flatten(1))


class Reductions(nn.Module):
    """ReduceSum, ReduceMax and ReduceMean over other axes than (H, W): the channels (keepdims), W, the
    channels and H, and a global max after a shifted relu (ties at 0 share the gradient, as torch.amax)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(9 * 7 + 6 * 9 + 7 + 6, 5)

    def forward(self, x):
        y = self.conv(x)  # (6, 9, 7)
        a = y.sum(1, keepdim=True)
        b = y.amax(3)
        c = y.mean((1, 2))
        d = torch.relu(y - 1.0).amax((2, 3))
        return self.fc(torch.cat([a.flatten(1), b.flatten(1), c, d], 1))


class L2Normalize(nn.Module):
    """F.normalize (ReduceL2, Clip, Expand, Div): over the channels at each position of a conv's output,
    and over the features of a Linear's (the sentence encoders' last step), scaled into a head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(6 * 9 * 7, 8)
        self.out = nn.Linear(8, 5)

    def forward(self, x):
        y = F.normalize(self.conv(x), p=2, dim=1)
        return self.out(4.0 * F.normalize(self.fc(y.flatten(1)), p=2, dim=1))


class TransposedConvs(nn.Module):
    """ConvTranspose2d: stride 2 with padding, output_padding and a fused ReLU; grouped and dilated without a
    bias; depthwise; an uneven stride and kernel (non-overlapping windows) before a tanh."""

    def __init__(self):
        super().__init__()
        self.up1 = nn.ConvTranspose2d(3, 6, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.ConvTranspose2d(6, 4, 3, padding=2, dilation=2, groups=2, bias=False)
        self.dw = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, groups=4)
        self.up3 = nn.ConvTranspose2d(4, 5, (2, 3), stride=(3, 2), padding=(0, 1))
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        y = self.up2(torch.relu(self.up1(x)))
        y = torch.tanh(self.up3(self.dw(y)))
        return self.fc(y.mean((2, 3)))


class UNetDecoder(nn.Module):
    """A small UNet: down by a strided conv and a max-pool; up by a ConvTranspose2d (with a batch-norm and a
    ReLU), bilinear and nearest Upsample, each joined with its skip connection by concatenation."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(3, 6, 3, padding=1)  # (6, 12, 8)
        self.enc2 = nn.Conv2d(6, 8, 3, stride=2, padding=1)  # (8, 6, 4)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)  # (8, 3, 2), after a max-pool
        self.up1 = nn.Sequential(nn.ConvTranspose2d(8, 8, 2, stride=2), nn.BatchNorm2d(8), nn.ReLU())  # (8, 6, 4)
        self.dec1 = nn.Conv2d(16, 6, 3, padding=1)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)  # (6, 12, 8)
        self.dec2 = nn.Conv2d(12, 4, 3, padding=1)
        self.up3 = nn.Upsample(scale_factor=2, mode="nearest")  # (4, 24, 16)
        self.head = nn.Conv2d(4, 2, 3, stride=2)  # (2, 11, 7)
        self.fc = nn.Linear(2 * 11 * 7, 5)

    def forward(self, x):
        e1 = torch.relu(self.enc1(x))
        e2 = torch.relu(self.enc2(e1))
        m = torch.relu(self.mid(F.max_pool2d(e2, 2)))
        d1 = torch.relu(self.dec1(torch.cat([self.up1(m), e2], 1)))
        d2 = torch.relu(self.dec2(torch.cat([self.up2(d1), e1], 1)))
        return self.fc(torch.relu(self.head(self.up3(d2))).flatten(1))


class ResizeAndPad(nn.Module):
    """Every resize PyTorch exports and the pads by copying, each read position by position (a Linear over
    all of them): nearest at a fractional scale, to a size and shrinking, bilinear with and without
    align_corners, at a scale, to a size and shrinking; reflect and replicate padding."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # (4, 5, 3)
        self.fc = nn.Linear(4 * (7 * 4 + 6 * 5 + 3 * 2 + 9 * 6 + 10 * 6 + 5 * 3 + 8 * 6 + 9 * 5), 5)

    def forward(self, x):
        y = self.conv(x)
        parts = [F.interpolate(y, scale_factor=1.5, mode="nearest"),  # (7, 4)
                 F.interpolate(y, size=(6, 5), mode="nearest"),
                 F.interpolate(y, size=(3, 2), mode="nearest"),  # shrinking
                 F.interpolate(y, size=(9, 6), mode="bilinear", align_corners=True),
                 F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False),  # (10, 6)
                 F.interpolate(F.interpolate(y, scale_factor=2, mode="bilinear"), scale_factor=0.5, mode="bilinear"),
                 F.pad(y, (1, 2, 2, 1), mode="reflect"),  # (8, 6)
                 F.pad(y, (2, 0, 1, 3), mode="replicate")]  # (9, 5)
        return self.fc(torch.cat([p.flatten(1) for p in parts], 1))


MOBILE_SHAPE = (3, 9, 7)
# name -> (factory, per-sample input shape): cross_entropy on 5 class logits
BLOCK_CASES = {
    "mobilenet_v2_inverted_residual": (lambda: _with_bn_stats(Mobile(InvertedResidual())), MOBILE_SHAPE),
    "mobilenet_v3_block": (lambda: _with_bn_stats(Mobile(MobileNetV3Block(), out=12)), MOBILE_SHAPE),
    "efficientnet_mbconv": (lambda: _with_bn_stats(Mobile(MBConv())), MOBILE_SHAPE),
    "regnet_y_block": (lambda: _with_bn_stats(Mobile(RegNetYBlock())), MOBILE_SHAPE),
    "normalize_in_forward": (Normalize, (3, 11, 9)),
    "two_activations_layer_scale": (TwoActivations, (3, 11, 9)),
    "prelu": (PReLUNet, (3, 11, 9)),
    "reductions": (Reductions, (3, 11, 9)),
    "l2_normalize": (L2Normalize, (3, 11, 9)),
    "keyword_spotting_conv1d": (lambda: _folded_spotter(), (13, 25)),
    "conv_transpose": (TransposedConvs, (3, 5, 4)),
    "unet_decoder": (lambda: _with_bn_stats(UNetDecoder()), (3, 12, 8)),
    "resize_and_pad": (ResizeAndPad, (3, 7, 5)),
}


def _folded_spotter():
    """The keyword spotter with its batch-norm folded into its conv, as texelfit folds it."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    m = KeywordSpotter().eval()
    m.conv, m.bn = fuse_conv_bn_eval(m.conv, m.bn), nn.Identity()
    for p in m.parameters():
        p.requires_grad_(True)
    return m


class SoftmaxHead(nn.Module):
    """A model that returns probabilities (or log-probabilities): predict returns them; cross_entropy trains
    on the logits entering them. A softmax inside too (over 6 hidden features)."""

    def __init__(self, log=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.fc = nn.Linear(4 * 5 * 4, 6)
        self.out = nn.Linear(6, 5)
        self.log = log

    def forward(self, x):
        h = torch.softmax(self.fc(torch.flatten(torch.relu(self.conv(x)), 1)), dim=1)
        z = self.out(h)
        return torch.log_softmax(z, dim=1) if self.log else torch.softmax(z, dim=-1)

    def logits(self, x):
        return self.out(torch.softmax(self.fc(torch.flatten(torch.relu(self.conv(x)), 1)), dim=1))


def trunk_two_layer_head():
    """On 1x12x12: a conv trunk (conv, relu, pool, conv, relu, flatten: 72 features) under a two-layer head
    (6: 72->16, relu, 8: 16->10): the transfer-learning tests' model."""
    return nn.Sequential(nn.Conv2d(1, 6, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(72, 16), nn.ReLU(), nn.Linear(16, 10))


def conv_224_bn():
    """A conv with batch-norm on 224x224 images: at --max-batch 64 its textures pass 1 GB (test_cli.py)."""
    return nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(24, 4))
