#!/usr/bin/env python3
"""Writes a small CREDIT WXFormer with two input frames (history_len 2) for the ERA5 tests.

credit.models.wxformer.crossformer.CrossFormer with frames=2: input (1, 7, 2, 32, 64), the
two time steps of the window stacked on dim 2 (oldest first), output (1, 6, 1, 32, 64). The
channels fit tests/data/era5_tiny/config.yml (T, U at 2 levels, SP, LSM, tsi -> T, U, SP,
tp). Small dims keep the file small; spectral norm off. Exported with the TorchScript
exporter (opset 17); onnxruntime checks the export against PyTorch.

Outputs in tests/data/era5_tiny/: model_history2.onnx, model_history2_x.npy (torch.randn,
seed 0), model_history2_y.npy (PyTorch eval output).

Usage (venv of models/export_credit.py): $WXE_PYTHON models/make_history_model.py
"""
import os
import sys
import warnings

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from export_credit import TINY_KW  # noqa: E402

from credit.models.wxformer.crossformer import CrossFormer  # noqa: E402


def main():
    out = os.path.join(here, "..", "tests", "data", "era5_tiny")
    kw = dict(TINY_KW, frames=2, dim=(8, 16, 32, 64), use_spectral_norm=False)
    torch.manual_seed(0)
    model = CrossFormer(**kw).eval()
    torch.manual_seed(0)
    x = torch.randn(1, 7, 2, 32, 64)
    with torch.no_grad():
        y = model(x)
    path = os.path.join(out, "model_history2.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                          training=torch.onnx.TrainingMode.EVAL, input_names=["x"], output_names=["y"])
    import onnxruntime as ort
    got = ort.InferenceSession(path).run(None, {"x": x.numpy()})[0]
    err = float(np.abs(got - y.numpy()).max())
    assert err < 1e-4, f"onnxruntime differs from PyTorch by {err}"
    np.save(os.path.join(out, "model_history2_x.npy"), x.numpy())
    np.save(os.path.join(out, "model_history2_y.npy"), y.numpy())
    print(f"{path}: {os.path.getsize(path)} bytes, {sum(p.numel() for p in model.parameters())} params, "
          f"output {tuple(y.shape)}, onnxruntime max abs diff {err:.2e}")


if __name__ == "__main__":
    main()
