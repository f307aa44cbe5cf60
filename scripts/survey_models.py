"""torchvision's convolutional architectures for scripts/survey.py, written out small (torchvision cannot be
installed here: it would pull another torch; its ViT and Swin are in survey.py with the other attention models).
Each keeps its original's structure (blocks, activations, skips, pools, heads, the way its forward combines
them), not its size. TORCHVISION lists (name, factory, image size, build options). Segmentation models return
[N, K, H, W] and build with loss="mse" (cross-entropy needs a vector of class logits).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

C = 10  # classes
MSE = {"loss": "mse"}


def cbr(i, o, k=3, s=1, g=1, act=nn.ReLU, d=1):
    """torchvision's Conv2dNormActivation: a conv without bias, a batch-norm, an activation (None: none)."""
    layers = [nn.Conv2d(i, o, k, s, (k - 1) // 2 * d, dilation=d, groups=g, bias=False), nn.BatchNorm2d(o)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class Res(nn.Module):
    """post(body(x) + shortcut(x)): ResNet's blocks, inverted residuals, RegNet's and ConvNeXt's blocks."""

    def __init__(self, body, shortcut=None, post=None):
        super().__init__()
        self.body, self.shortcut, self.post = body, shortcut or nn.Identity(), post or nn.Identity()

    def forward(self, x):
        return self.post(self.body(x) + self.shortcut(x))


class SE(nn.Module):
    """Squeeze-and-excitation: global average pool, 1x1 reduce, activation, 1x1 expand, gate times the input."""

    def __init__(self, c, r, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.fc1, self.act, self.fc2, self.gate = nn.Conv2d(c, r, 1), act(), nn.Conv2d(r, c, 1), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth (mode 'row'): drops whole samples' branches in training, the identity in eval."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return x * torch.empty([x.shape[0]] + [1] * (x.dim() - 1)).bernoulli_(1 - self.p) / (1 - self.p)


def head(c, hidden=None, act=nn.ReLU, p=0.2):
    """Global average pool, flatten, [Linear, act,] dropout, Linear to the classes."""
    mid = [nn.Linear(c, hidden), act(), nn.Dropout(p)] if hidden else [nn.Dropout(p)]
    return [nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), *mid, nn.Linear(hidden or c, C)]


# ---------------------------------------------------------------- classification
def alexnet():
    return nn.Sequential(nn.Conv2d(3, 16, 11, 4, 2), nn.ReLU(True), nn.MaxPool2d(3, 2), nn.Conv2d(16, 32, 5, padding=2),
                         nn.ReLU(True), nn.MaxPool2d(3, 2), nn.Conv2d(32, 48, 3, padding=1), nn.ReLU(True),
                         nn.Conv2d(48, 32, 3, padding=1), nn.ReLU(True), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(True),
                         nn.MaxPool2d(3, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(), nn.Linear(32, 64),
                         nn.ReLU(True), nn.Dropout(), nn.Linear(64, 64), nn.ReLU(True), nn.Linear(64, C))


def vgg11_bn():
    layers, c = [], 3
    for v in (8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(True)]
            c = v
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(64, 64), nn.ReLU(True),
                         nn.Dropout(), nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, C))


def resnet_trunk(bottleneck, layers, planes, groups=1, width=64, dilate_last=False):
    """torchvision.models.ResNet's stem (7x7/2 conv, 3x3/2 max pool) and stages: BasicBlock (3x3, 3x3) or Bottleneck
    (1x1, grouped 3x3 of width int(p * width / 64) * groups, 1x1 to 4p), a 1x1 projection where the shape changes,
    ReLU after the add. `dilate_last`: the last stage at stride 1 and dilation 2 (replace_stride_with_dilation)."""
    e, mods, c = (4 if bottleneck else 1), [cbr(3, 8, 7, 2), nn.MaxPool2d(3, 2, 1)], 8
    for k, (p, n) in enumerate(zip(planes, layers)):
        last = dilate_last and k == len(planes) - 1
        for j in range(n):
            s, d = (2 if k and not j and not last else 1), (2 if last else 1)
            w = int(p * width / 64) * groups
            body = nn.Sequential(cbr(c, w, 1), cbr(w, w, 3, s, g=groups, d=d), cbr(w, p * e, 1, act=None)) \
                if bottleneck else nn.Sequential(cbr(c, p, 3, s, d=d), cbr(p, p, 3, d=d, act=None))
            down = cbr(c, p * e, 1, s, act=None) if s != 1 or c != p * e else None
            mods.append(Res(body, down, nn.ReLU(True)))
            c = p * e
    return mods, c


def resnet(bottleneck, layers, planes, **kw):
    mods, c = resnet_trunk(bottleneck, layers, planes, **kw)
    return nn.Sequential(*mods, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(c, C))


def inverted(i, o, s, t, k=3, act=nn.ReLU6, se=None):
    """MobileNetV2's inverted residual (ReLU6), MNASNet's (ReLU, 3x3 or 5x5), MobileNetV3's and EfficientNet's (with
    SE): 1x1 expand, depthwise kxk, [SE,] 1x1 project without activation; a skip where the shape stays."""
    h = i * t
    body = nn.Sequential(*([cbr(i, h, 1, act=act)] if t != 1 else []), cbr(h, h, k, s, g=h, act=act),
                         *([se(h)] if se else []), cbr(h, o, 1, act=None))
    return Res(body) if s == 1 and i == o else body


def mobile(blocks, stem, cin, last, act, classifier):
    return nn.Sequential(cbr(3, stem, 3, 2, act=act), *blocks, cbr(cin, last, 1, act=act), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), *classifier)


def mobilenet_v2():
    blocks, c = [], 8
    for t, o, n, s in [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (6, 24, 1, 1)]:
        for j in range(n):
            blocks.append(inverted(c, o, s if j == 0 else 1, t))
            c = o
    return mobile(blocks, 8, c, 64, nn.ReLU6, [nn.Dropout(0.2), nn.Linear(64, C)])


def mobilenet_v3_small():
    def se(c):
        return SE(c, max(8, c // 4), gate=nn.Hardsigmoid)
    blocks = [inverted(8, 8, 2, 1, 3, nn.ReLU, se), inverted(8, 12, 2, 4, 3, nn.ReLU),
              inverted(12, 16, 2, 4, 5, nn.Hardswish, se), inverted(16, 16, 1, 3, 5, nn.Hardswish, se)]
    return mobile(blocks, 8, 16, 48, nn.Hardswish, [nn.Linear(48, 64), nn.Hardswish(True), nn.Dropout(0.2),
                                                    nn.Linear(64, C)])


def efficientnet_b0():
    """MBConv: SiLU, SE reducing to a quarter of the block's input, stochastic depth growing with the block index."""
    blocks, c, k = [], 8, 0
    for t, ks, s, o, n in [(1, 3, 1, 8, 1), (6, 3, 2, 12, 2), (6, 5, 2, 16, 1), (6, 3, 2, 24, 1)]:
        for j in range(n):
            block = inverted(c, o, s if j == 0 else 1, t, ks, nn.SiLU, lambda h, r=max(1, c // 4): SE(h, r, nn.SiLU))
            if isinstance(block, Res):
                block.body = nn.Sequential(block.body, StochasticDepth(0.2 * k / 6))
            blocks.append(block)
            c, k = o, k + 1
    return mobile(blocks, 8, c, 64, nn.SiLU, [nn.Dropout(0.2), nn.Linear(64, C)])


class Fire(nn.Module):
    def __init__(self, i, sq, e1, e3):
        super().__init__()
        self.squeeze, self.e1, self.e3 = nn.Conv2d(i, sq, 1), nn.Conv2d(sq, e1, 1), nn.Conv2d(sq, e3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


def squeezenet():
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2), nn.ReLU(True), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(16, 4, 8, 8),
                         Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(16, 8, 16, 16),
                         Fire(32, 8, 16, 16), nn.Dropout(0.5), nn.Conv2d(32, C, 1), nn.ReLU(True),
                         nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten())


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's: stride 1 chunks the channels, one half transformed; stride 2, two branches; channel shuffle."""

    def __init__(self, i, o, s):
        super().__init__()
        b, self.s = o // 2, s
        self.branch1 = nn.Sequential(cbr(i, i, 3, s, g=i, act=None), cbr(i, b, 1)) if s > 1 else nn.Identity()
        self.branch2 = nn.Sequential(cbr(i if s > 1 else b, b, 1), cbr(b, b, 3, s, g=b, act=None), cbr(b, b, 1))

    def forward(self, x):
        if self.s == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        n, c, h, w = out.size()
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class ShuffleNetV2(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.maxpool = cbr(3, 8, 3, 2), nn.MaxPool2d(3, 2, 1)
        self.stages = nn.Sequential(ShuffleUnit(8, 16, 2), ShuffleUnit(16, 16, 1), ShuffleUnit(16, 32, 2),
                                    ShuffleUnit(32, 32, 1))
        self.conv5, self.fc = cbr(32, 64, 1), nn.Linear(64, C)

    def forward(self, x):
        return self.fc(self.conv5(self.stages(self.maxpool(self.conv1(x)))).mean([2, 3]))


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv-BN-ReLU-3x3 conv over the concatenation of every earlier output (a list, as torchvision's)."""

    def __init__(self, i, growth, bn_size=2):
        super().__init__()
        self.f1 = nn.Sequential(nn.BatchNorm2d(i), nn.ReLU(True), nn.Conv2d(i, bn_size * growth, 1, bias=False))
        self.f2 = nn.Sequential(nn.BatchNorm2d(bn_size * growth), nn.ReLU(True),
                                nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False))

    def forward(self, features):
        return self.f2(self.f1(torch.cat(features, 1)))


class DenseBlock(nn.ModuleList):
    def forward(self, x):
        features = [x]
        for layer in self:
            features.append(layer(features))
        return torch.cat(features, 1)


def densenet(growth=8, blocks=(3, 3), c=16):
    layers = [nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(True), nn.MaxPool2d(3, 2, 1)]
    for k, n in enumerate(blocks):
        layers.append(DenseBlock(DenseLayer(c + j * growth, growth) for j in range(n)))
        c += n * growth
        if k != len(blocks) - 1:  # transition: BN-ReLU-1x1 conv halving the channels, 2x2 average pool
            layers += [nn.BatchNorm2d(c), nn.ReLU(True), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
            c //= 2
    return nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                         nn.Linear(c, C))


class Inception(nn.Module):
    """Four branches concatenated: 1x1; 1x1-3x3; 1x1-3x3 (torchvision's, for 5x5); 3x3 max pool (ceil mode)-1x1."""

    def __init__(self, i, c1, r3, c3, r5, c5, pp):
        super().__init__()
        self.b1, self.b2 = cbr(i, c1, 1), nn.Sequential(cbr(i, r3, 1), cbr(r3, c3, 3))
        self.b3 = nn.Sequential(cbr(i, r5, 1), cbr(r5, c5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), cbr(i, pp, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


def googlenet():
    return nn.Sequential(cbr(3, 16, 7, 2), nn.MaxPool2d(3, 2, ceil_mode=True), cbr(16, 16, 1), cbr(16, 32, 3),
                         nn.MaxPool2d(3, 2, ceil_mode=True), Inception(32, 8, 8, 16, 4, 4, 4),
                         Inception(32, 16, 8, 16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
                         Inception(48, 16, 8, 16, 4, 8, 8), *head(48))


def mnasnet():
    layers, c = [cbr(3, 16, 3, 2), cbr(16, 16, 3, g=16), cbr(16, 8, 1, act=None)], 8  # stem, separable conv
    for t, k, s, o, n in [(3, 3, 2, 12, 2), (3, 5, 2, 16, 2), (6, 5, 2, 24, 1)]:
        for j in range(n):
            layers.append(inverted(c, o, s if j == 0 else 1, t, k, nn.ReLU))
            c = o
    return nn.Sequential(*layers, cbr(c, 64, 1), *head(64))


def regnet_y(widths=(16, 32, 32, 64), strides=(2, 2, 1, 2), gw=8):
    """ResBottleneckBlock: 1x1, grouped 3x3 (group width 8), SE reducing to a quarter of the block's input width,
    1x1 without activation, a projection where the shape changes, ReLU after the add."""
    layers, c = [cbr(3, 16, 3, 2)], 16
    for o, s in zip(widths, strides):
        body = nn.Sequential(cbr(c, o, 1), cbr(o, o, 3, s, g=o // gw), SE(o, max(1, c // 4)), cbr(o, o, 1, act=None))
        layers.append(Res(body, cbr(c, o, 1, s, act=None) if c != o or s != 1 else None, nn.ReLU(True)))
        c = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(c, C))


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    """ConvNeXt's: depthwise 7x7, channels-last LayerNorm, Linear 4x, GELU, Linear, back, layer scale [C, 1, 1]."""

    def __init__(self, d, p=0.0, scale=1e-6):
        super().__init__()
        self.dw, self.norm = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.layer_scale, self.drop = nn.Parameter(torch.ones(d, 1, 1) * scale), StochasticDepth(p)

    def forward(self, x):
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + self.drop(self.layer_scale * y)


def convnext():
    return nn.Sequential(nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6), CNBlock(16), LayerNorm2d(16, eps=1e-6),
                         nn.Conv2d(16, 32, 2, 2), CNBlock(32, 0.1), nn.AdaptiveAvgPool2d(1), LayerNorm2d(32, eps=1e-6),
                         nn.Flatten(1), nn.Linear(32, C))


# ---------------------------------------------------------------- segmentation (outputs [N, K, H, W])
def upsample(x, like):
    return F.interpolate(x, size=like.shape[-2:], mode="bilinear", align_corners=False)


class Segmenter(nn.Module):
    """torchvision's _SimpleSegmentationModel: backbone, classifier, bilinear upsample to the input's size."""

    def __init__(self, backbone, classifier):
        super().__init__()
        self.backbone, self.classifier = backbone, classifier

    def forward(self, x):
        return upsample(self.classifier(self.backbone(x)), x)


class ASPP(nn.Module):
    """DeepLabV3's: 1x1, three dilated 3x3, a global pool upsampled back; concatenated, 1x1 projection, dropout."""

    def __init__(self, i, o, rates=(2, 4, 6)):
        super().__init__()
        self.convs = nn.ModuleList([cbr(i, o, 1)] + [cbr(i, o, 3, d=r) for r in rates])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(i, o, 1, bias=False), nn.ReLU())
        self.project = nn.Sequential(cbr(5 * o, o, 1), nn.Dropout(0.5))

    def forward(self, x):
        return self.project(torch.cat([c(x) for c in self.convs] + [upsample(self.pool(x), x)], 1))


def fcn():
    return Segmenter(nn.Sequential(*resnet_trunk(False, [1, 1, 1], (8, 16, 32))[0]),
                     nn.Sequential(cbr(32, 8, 3), nn.Dropout(0.1), nn.Conv2d(8, 4, 1)))


def deeplabv3():
    trunk = nn.Sequential(*resnet_trunk(False, [1, 1, 1], (8, 16, 32), dilate_last=True)[0])
    return Segmenter(trunk, nn.Sequential(ASPP(32, 16), cbr(16, 16, 3), nn.Conv2d(16, 4, 1)))


class LRASPP(nn.Module):
    """LRASPP over a MobileNetV3 trunk: the high features through 1x1 conv-BN-ReLU times a pooled sigmoid gate,
    upsampled to the low features, both classified and added, upsampled to the input."""

    def __init__(self, k=4):
        super().__init__()
        self.low = nn.Sequential(cbr(3, 8, 3, 2, act=nn.Hardswish), inverted(8, 12, 2, 4, 3, nn.ReLU),
                                 inverted(12, 16, 2, 4, 3, nn.ReLU))
        self.high = nn.Sequential(inverted(16, 24, 2, 4, 5, nn.Hardswish), inverted(24, 24, 1, 4, 5, nn.Hardswish))
        self.cbr = cbr(24, 16, 1)
        self.scale = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 16, 1, bias=False), nn.Sigmoid())
        self.low_classifier, self.high_classifier = nn.Conv2d(16, k, 1), nn.Conv2d(16, k, 1)

    def forward(self, x):
        low = self.low(x)
        high = self.high(low)
        y = self.low_classifier(low) + self.high_classifier(upsample(self.cbr(high) * self.scale(high), low))
        return upsample(y, x)


class UNet(nn.Module):
    """Two poolings down, two 2x2 transpose convs up, each concatenated with the encoder's skip, double convs."""

    def __init__(self, c=8, k=2):
        super().__init__()
        def double(i, o):
            return nn.Sequential(cbr(i, o, 3), cbr(o, o, 3))
        self.inc, self.down1, self.down2 = double(3, c), double(c, 2 * c), double(2 * c, 4 * c)
        self.up1, self.conv1 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2), double(4 * c, 2 * c)
        self.up2, self.conv2 = nn.ConvTranspose2d(2 * c, c, 2, 2), double(2 * c, c)
        self.outc = nn.Conv2d(c, k, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(F.max_pool2d(x1, 2))
        y = self.conv1(torch.cat([x2, self.up1(self.down2(F.max_pool2d(x2, 2)))], 1))
        return self.outc(self.conv2(torch.cat([x1, self.up2(y)], 1)))


TORCHVISION = [  # (name, factory, image size, build options)
    ("AlexNet", alexnet, 64, {}),
    ("VGG-11 (BN)", vgg11_bn, 32, {}),
    ("ResNet-18 (BasicBlock)", lambda: resnet(False, [2, 2, 2, 2], (8, 16, 32, 64)), 64, {}),
    ("ResNet-50 style (Bottleneck)", lambda: resnet(True, [2, 1, 1, 1], (4, 8, 16, 16)), 64, {}),
    ("ResNeXt (grouped 3x3, 4 groups)", lambda: resnet(True, [1, 1, 1, 1], (4, 8, 16, 16), groups=4, width=16), 64, {}),
    ("Wide-ResNet (2x bottleneck width)", lambda: resnet(True, [1, 1, 1, 1], (4, 8, 16, 16), width=128), 64, {}),
    ("MobileNetV2 (inverted residual, ReLU6)", mobilenet_v2, 32, {}),
    ("MobileNetV3-small (hardswish, SE)", mobilenet_v3_small, 64, {}),
    ("EfficientNet-B0 (MBConv, SiLU, SE)", efficientnet_b0, 32, {}),
    ("SqueezeNet 1.1 (fire modules)", squeezenet, 64, {}),
    ("ShuffleNetV2 (chunk, channel shuffle)", ShuffleNetV2, 64, {}),
    ("DenseNet (dense blocks, concat)", densenet, 64, {}),
    ("GoogLeNet (Inception blocks)", googlenet, 64, {}),
    ("MNASNet", mnasnet, 64, {}),
    ("RegNetY (SE, group width)", regnet_y, 64, {}),
    ("ConvNeXt (dw 7x7, LN channels-last, layer scale)", convnext, 32, {}),
    ("FCN (bilinear upsample to input)", fcn, 64, MSE),
    ("DeepLabV3 (ASPP, dilated, pooled branch)", deeplabv3, 64, MSE),
    ("LRASPP (MobileNetV3 trunk)", LRASPP, 64, MSE),
    ("U-Net (transpose conv, skip concat)", UNet, 32, MSE),
]
