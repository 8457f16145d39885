#!/usr/bin/env python3
"""Fixture for models that already have Linear q/k/v: one CREDIT nextgen_wxformer Transformer
stage (credit/models/wxformer/wxformer_next.py: short attention, feed-forward, long
attention, feed-forward, all projections nn.Linear, channels-last), exported alone with the
TorchScript exporter. dim 32, dim_head 8 (4 heads), windows 2, batch 2, 8x8 grid.

Writes tests/data/nextgen_block.onnx, nextgen_block_x.npy, nextgen_block_y.npy and
nextgen_block.safetensors (its state dict: names as CREDIT writes them).
    $WXE_PYTHON models/make_nextgen_fixture.py
"""
import os
import warnings

import numpy as np
import torch
from safetensors.torch import save_file

from credit.models.wxformer.wxformer_next import Transformer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")

torch.manual_seed(0)
block = Transformer(32, local_window_size=2, global_window_size=2, depth=1, dim_head=8).eval()
x = torch.randn(2, 32, 8, 8)
with torch.no_grad():
    y = block(x)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(block, (x,), os.path.join(OUT, "nextgen_block.onnx"), dynamo=False, opset_version=17,
                      do_constant_folding=True, input_names=["x"], output_names=["y"])
np.save(os.path.join(OUT, "nextgen_block_x.npy"), x.numpy())
np.save(os.path.join(OUT, "nextgen_block_y.npy"), y.numpy())
save_file({k: v.contiguous() for k, v in block.state_dict().items()}, os.path.join(OUT, "nextgen_block.safetensors"))
print("wrote", OUT)
