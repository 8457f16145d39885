#!/usr/bin/env python3
"""CREDIT's noise-injection CrossFormer (model type crossformer-ensemble:
credit.models.wxformer.crossformer_ensemble.CrossFormerWithNoise) exported to ONNX, for wxe's
ensemble training tests: tests/data/crossformer_noise_tiny.onnx (+ _x.npy, _y_quiet.npy, _ops.json).

The model: the tiny CrossFormer of models/audit_zoo.py (32 x 64 grid, 7 input and 6 output
channels) with smaller widths (dim 8, 16, 32, 64), noise_latent_dim 8, freeze False (CREDIT's
default True sets requires_grad False on every CrossFormer weight, which ONNX does not record),
torch.manual_seed(0) before construction, three train-mode forwards to warm the spectral
norm (as models/export_credit.py does), then eval. Its noise: three encoder and three decoder
StochasticDecompositionLayers, each drawing a latent noise torch.randn(batch, noise_latent_dim)
and a pixel noise torch.randn(batch, channels, height, width) on every forward.

Export: torch.onnx.export(dynamo=False, opset 17, constant folding, input x (1, 7, 1, 32, 64)
with a dynamic batch dimension, so an ensemble's repeated input (members x batch rows) fits).
The TorchScript exporter writes torch.randn of a size computed from x.size(0) as
RandomNormalLike of a tensor of that size (Shape/Gather/Concat/ConstantOfShape before it), and
torch.randn of constant sizes as RandomNormal; _ops.json records which and how many, and the
random nodes' attributes (mean, scale, seed, dtype).

Check: onnxruntime runs the file, and its output equals PyTorch's in everything but the noise:
with every noise_factor set to 0 both are the deterministic CrossFormer (max abs difference over
max abs value below 1e-5); _y_quiet.npy is PyTorch's output so, for wxe to match with its
noise_factor initializers zeroed. The kept file has the model's own weights.

Usage (any python with torch, onnx, onnxruntime and miles-credit 2026.2):
  /root/credit-venv/bin/python models/make_noise_model_fixture.py
"""
import collections
import json
import os
import sys
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data"))
sys.path.insert(0, HERE)

from audit_zoo import CROSSFORMER_KW  # noqa: E402

KW = dict(CROSSFORMER_KW, dim=(8, 16, 32, 64), noise_latent_dim=8, freeze=False)
SHAPE = (1, 7, 1, 32, 64)
NAME = "crossformer_noise_tiny"


def build():
    from credit.models.wxformer.crossformer_ensemble import CrossFormerWithNoise

    torch.manual_seed(0)
    model = CrossFormerWithNoise(**KW)
    model.train()  # warm the spectral norm's power iteration, as models/export_credit.py does
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*SHAPE))
    model.eval()
    return model


def export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                          training=torch.onnx.TrainingMode.EVAL, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def ort_run(path, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def random_nodes(path):
    import onnx
    from onnx import helper

    m = onnx.load(path)
    counts = collections.Counter(n.op_type for n in m.graph.node)
    nodes = []
    for n in m.graph.node:
        if n.op_type.startswith("Random"):
            nodes.append({"name": n.name, "op": n.op_type,
                          "attrs": {a.name: helper.get_attribute_value(a) for a in n.attribute}})
    return dict(sorted(counts.items())), nodes


def silenced():
    """The same model (seed 0) with its noise switched off: every noise_factor 0."""
    m = build()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("noise_factor"):
                p.zero_()
    return m


def main():
    torch.manual_seed(0)
    x = torch.randn(*SHAPE)
    model = build()
    path = os.path.join(OUT, NAME + ".onnx")
    export(model, x, path)
    np.save(os.path.join(OUT, NAME + "_x.npy"), x.numpy())
    counts, nodes = random_nodes(path)
    # the noise-free model: ONNX Runtime equals PyTorch
    quiet = silenced()
    qpath = os.path.join(OUT, NAME + "_quiet_check.onnx")
    export(quiet, x, qpath)
    with torch.no_grad():
        want = quiet(x).numpy()
    got = ort_run(qpath, x.numpy())
    os.remove(qpath)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-5, err
    np.save(os.path.join(OUT, NAME + "_y_quiet.npy"), want)
    # two members of the kept model differ (the noise), and ORT runs it with a batch of 2
    y2 = ort_run(path, np.repeat(x.numpy(), 2, axis=0))
    spread = float(np.abs(y2[0] - y2[1]).max())
    assert spread > 0, spread
    params = {n: list(p.shape) for n, p in model.named_parameters()}
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    doc = {"config": {k: v for k, v in KW.items()}, "input": list(SHAPE), "op_counts": counts,
           "random_nodes": nodes, "ort_vs_torch_noise_free": err, "ort_member_spread": spread,
           "parameters": len(params), "requires_grad_false": frozen,
           "torch": torch.__version__}
    with open(os.path.join(OUT, NAME + "_ops.json"), "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
        fh.write("\n")
    print(f"wrote {path}: {sum(counts.values())} nodes; random: "
          f"{collections.Counter(n['op'] for n in nodes)}; noise-free ORT vs torch {err:.2e}; "
          f"frozen {frozen}")


if __name__ == "__main__":
    main()
