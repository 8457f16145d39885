#!/usr/bin/env python3
"""Fixture for a whole CREDIT nextgen_wxformer (credit/models/wxformer/wxformer_next.py:
NextGenWXFormer) with column attention on a pooled grid (col_attn_stride 2: AveragePool, then
bilinear Resize back), level embedding and the spectral GNN bottleneck, exported by both
exporters. Tiny: 16x32 grid, channels 4 x levels 2, dim (4, 8, 16, 32), dim_head 4, no
spectral norm (the fixture tests the ops and the plan, not the norm), seed 0, eval.

Writes tests/data/nextgen_model_ts.onnx, nextgen_model_dynamo.onnx, nextgen_model_x.npy,
nextgen_model_y.npy.
    $WXE_PYTHON models/make_nextgen_model_fixture.py [--no-dynamo]
"""
import collections
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

from credit.models.wxformer.wxformer_next import NextGenWXFormer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
KW = dict(image_height=16, image_width=32, frames=1, channels=4, levels=2, surface_channels=2,
          input_only_channels=1, output_only_channels=0, dim=(4, 8, 16, 32), depth=(1, 1, 1, 1), dim_head=4,
          global_window_size=(2, 2, 1, 1), local_window_size=(2, 2, 2, 1),
          cross_embed_kernel_sizes=((2, 4), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
          col_attn_heads=2, col_attn_stride=2, num_spectral_nodes=4, use_spectral_norm=False)
C_IN = 4 * 2 + 2 + 1

torch.manual_seed(0)
model = NextGenWXFormer(**KW).eval()
# the zero-initialised level embedding would hide a wrong broadcast: give it values
with torch.no_grad():
    model.level_embedding.bias.copy_(torch.randn_like(model.level_embedding.bias))
x = torch.randn(1, C_IN, 1, 16, 32)
with torch.no_grad():
    y = model(x)
print("params", sum(p.numel() for p in model.parameters()), "y", tuple(y.shape))
for exp in ("ts", "dynamo"):
    if exp == "dynamo" and "--no-dynamo" in sys.argv:
        continue
    path = os.path.join(OUT, f"nextgen_model_{exp}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exp == "ts":
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                              input_names=["x"], output_names=["y"])
        else:
            prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=18, input_names=["x"],
                                     output_names=["y"], optimize=True, external_data=False)
            prog.save(path, external_data=False)
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    assert ops["AveragePool"] == 1, ops
    out = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    print(exp, "bytes", os.path.getsize(path), "ORT vs PyTorch", float(np.abs(out - y.numpy()).max()))
np.save(os.path.join(OUT, "nextgen_model_x.npy"), x.numpy())
np.save(os.path.join(OUT, "nextgen_model_y.npy"), y.numpy())
