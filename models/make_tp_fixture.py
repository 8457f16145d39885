#!/usr/bin/env python3
"""Fixture for tensor-parallel tests: the tiny CrossFormer with dim_head 4, so every stage
has a head count divisible by 4 (4, 8, 16, 32 heads), batch 2. Spectral norm is warmed by
three train-mode forwards (as the shared fixtures) and then removed, which keeps the
activations at the scale of a trained model.

Writes tests/data/crossformer_tp_snbaked.onnx (TorchScript exporter, opset 17, dynamic batch),
tests/data/crossformer_tp_x.npy (2, 7, 1, 32, 64) and tests/data/crossformer_tp_y.npy
(PyTorch eval output). Run with the venv of models/export_credit.py:
    $WXE_PYTHON models/make_tp_fixture.py
"""
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_credit import TINY_KW, model_class  # noqa: E402
from make_convert_reference import remove_all_spectral_norm  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")

torch.manual_seed(0)
model = model_class("crossformer_tiny")(**dict(TINY_KW, dim_head=4))
model.train()
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(1, 7, 1, 32, 64))
model.eval()
remove_all_spectral_norm(model)
x = torch.randn(2, 7, 1, 32, 64)
with torch.no_grad():
    y = model(x)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, (x,), os.path.join(OUT, "crossformer_tp_snbaked.onnx"), dynamo=False,
                      opset_version=17, do_constant_folding=True, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
np.save(os.path.join(OUT, "crossformer_tp_x.npy"), x.numpy())
np.save(os.path.join(OUT, "crossformer_tp_y.npy"), y.numpy())
print("wrote", OUT)
