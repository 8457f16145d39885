#!/usr/bin/env python3
"""Fixture for domain parallelism: a small CREDIT WXFormer (credit/models/wxformer/crossformer.py:
PixelShuffle decoder, ZeroPad2d cross-embeddings) with "mirror" boundary padding (reflect in
latitude, circular in longitude), on a 64x64 grid so that bands of 2 and 4 hold whole windows
at most stages; exported by the TorchScript exporter (wxe's output is checked against y by the tests), with spectral norm on (baked by the export
in eval mode after three train-mode forwards, as a trained checkpoint has it).

Small: dim (8, 16, 32, 64), dim_head 4, depth (1, 1, 1, 1), 64x64 grid, padding 16/16 (96x96 padded).
Writes tests/data/wxformer_mirror.onnx, wxformer_mirror_x.npy, _y.npy.
    $WXE_PYTHON models/make_domain_fixture.py
"""
import os
import warnings

import numpy as np
import onnx
import torch

from credit.models.wxformer.crossformer import CrossFormer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
KW = dict(image_height=64, image_width=64, frames=1, output_frames=1, channels=2, levels=2, surface_channels=2,
          input_only_channels=1, output_only_channels=0, dim=(8, 16, 32, 64), depth=(1, 1, 1, 1), dim_head=4,
          global_window_size=(4, 2, 2, 1), local_window_size=2,
          cross_embed_kernel_sizes=((4, 8), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
          attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=True, interp=False,
          padding_conf={"activate": True, "mode": "mirror", "pad_lat": [16, 16], "pad_lon": [16, 16]})

torch.manual_seed(0)
model = CrossFormer(**KW)
x = torch.randn(1, 7, 1, 64, 64)
with torch.no_grad():
    for _ in range(3):
        model.train()(x)
model.eval()
with torch.no_grad():
    y = model(x)
path = os.path.join(OUT, "wxformer_mirror.onnx")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                      input_names=["x"], output_names=["y"])
onnx.checker.check_model(onnx.load(path))
print("params", sum(p.numel() for p in model.parameters()), "bytes", os.path.getsize(path), "output", tuple(y.shape))
np.save(os.path.join(OUT, "wxformer_mirror_x.npy"), x.numpy())
np.save(os.path.join(OUT, "wxformer_mirror_y.npy"), y.numpy())
