#!/usr/bin/env python3
"""Export CREDIT's production-grid CrossFormer (640 x 1280, 124 M parameters) for benchmarks
(or, --model wxformer_v2026, the 1-degree benchmark WXFormer with random weights).

The model of the CREDIT paper's 6-hour runs (arXiv 2024): credit.models.crossformer.CrossFormer
on the 0.28-degree 640 x 1280 grid, dims 128, 256, 512, 1024, depth 2, 2, 8, 2, one input
frame, 4 upper-air variables on 16 levels, 7 surface and 3 input-only variables (74 input and
71 output channels), windows and strides as CREDIT's defaults (local 10, global 5, 5, 2, 1,
strides 4, 2, 2, 2). Spectral norm is left out (the weights wxe trains are the plain ones, as
for wxformer_v2026 in bench/compare_train.py); random weights, torch.manual_seed(0).

The files are about 1 GB: they are generated, never committed. Run (the venv of
models/export_credit.py; about 3 minutes and 8 GB on 2 cores):

    $WXE_PYTHON models/make_production_model.py [--out DIR]

Outputs in --out (default $WXE_PRODUCTION, else build/wxe_production, where
bench/compare_train.py looks for them):

    crossformer_640.onnx   torch.onnx.export (TorchScript exporter, opset 17), weights inside
    crossformer_640_x.npy  float32 input (1, 74, 1, 640, 1280), torch.manual_seed(1) randn

Then, e.g. (checkpointing on is CREDIT's default):

    build/wxe bench build/wxe_production/crossformer_640.onnx --input build/wxe_production/crossformer_640_x.npy \\
        --train --runs 1 --threads 2
    $WXE_PYTHON bench/compare_train.py \\
        --models crossformer_640 --threads 2 --runs 1 --checkpoint
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

from compare_peers import TORCH_MODELS  # noqa: E402  (the one definition of the configs)

# --model: what compare_train.py reads (file name stems there)
STEMS = {"crossformer_640": "crossformer_640", "wxformer_v2026": "wxformer_v2026_snbaked_opset17"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("WXE_PRODUCTION", os.path.join(os.path.dirname(HERE), "build",
                                                                                  "wxe_production")))
    p.add_argument("--model", choices=sorted(STEMS), default="crossformer_640",
                   help="wxformer_v2026: the 1-degree WXFormer with random weights (for a machine "
                   "without shared/fixtures; compare_train.py reads it with WXE_FIXTURES=OUT)")
    a = p.parse_args(argv)

    import importlib

    import numpy as np
    import torch

    modname, cfg = TORCH_MODELS[a.model]
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = importlib.import_module(modname).CrossFormer(**cfg, use_spectral_norm=False).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.model}: {n:,} parameters", flush=True)
    c_in = cfg["channels"] * cfg["levels"] + cfg["surface_channels"] + cfg["input_only_channels"]
    torch.manual_seed(1)
    x = torch.randn(1, c_in, cfg["frames"], cfg["image_height"], cfg["image_width"])
    np.save(os.path.join(a.out, a.model + "_x.npy"), x.numpy())
    path = os.path.join(a.out, STEMS[a.model] + ".onnx")
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=17,
                          do_constant_folding=True, dynamo=False)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
