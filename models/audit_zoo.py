#!/usr/bin/env python3
"""Op audit of CREDIT's model zoo: build every model type `credit.models.load_model` knows with
a tiny config, export it with both torch.onnx exporters (TorchScript: dynamo=False, opset 17;
dynamo=True, opset 18), list the op types of each export and compare them with the ONNX ops
wxe reads (the arity table in importers/onnx/onnx_import.cpp).

    $WXE_PYTHON models/audit_zoo.py [--types crossformer,nextgen_wxformer] \
        [--out /tmp/zoo] [--json /tmp/zoo/audit.json] [--from-json /tmp/zoo/audit.json]

Prints one Markdown table (model type x exporter -> op types, those wxe lacks in bold) that
models/EXPORTS.md keeps. Exports go to --out (not kept: the tests carry their own fixtures).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
import traceback
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CROSSFORMER_KW = dict(
    image_height=32, image_width=64, frames=1, output_frames=1, channels=2, levels=2,
    surface_channels=2, input_only_channels=1, output_only_channels=0, dim=(16, 32, 64, 128),
    depth=(1, 1, 2, 1), dim_head=8, global_window_size=(4, 2, 2, 1), local_window_size=2,
    cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
    attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=True, interp=True,
    padding_conf={"activate": True, "mode": "earth", "pad_lat": [16, 16], "pad_lon": [16, 16]},
)
NEXTGEN_KW = dict(
    image_height=32, image_width=64, frames=1, channels=4, levels=3, surface_channels=2,
    input_only_channels=1, output_only_channels=0, dim=(16, 32, 64, 128), depth=(1, 1, 1, 1),
    dim_head=8, global_window_size=(4, 2, 2, 1), local_window_size=2,
    cross_embed_kernel_sizes=((2, 4), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
    col_attn_heads=2, col_attn_stride=2, num_spectral_nodes=8, use_spectral_norm=True,
)
# model type -> (constructor kwargs, input shape) or a string: why it is not exported.
CONFIGS = {
    "crossformer": (CROSSFORMER_KW, (1, 7, 1, 32, 64)),
    "wxformer": (CROSSFORMER_KW, (1, 7, 1, 32, 64)),
    "wxformer_base": "same class as wxformer (credit.models.wxformer.crossformer.CrossFormer)",
    "crossformer-ensemble": (dict(CROSSFORMER_KW, noise_latent_dim=8, freeze=False), (1, 7, 1, 32, 64)),
    "crossformer-style": "same class as crossformer-ensemble (CrossFormerWithNoise)",
    "nextgen_wxformer": (NEXTGEN_KW, (1, 15, 1, 32, 64)),
    "camulator": (dict(CROSSFORMER_KW, frames=1), (1, 7, 1, 32, 64)),
    "crossformer_downscaling": "needs a downscaling config (two grids, coarse and fine variable lists)",
    "fuxi": (dict(image_height=32, patch_height=4, image_width=64, patch_width=4, levels=2, frames=2,
                  frame_patch_size=2, dim=32, num_groups=8, channels=2, surface_channels=2,
                  input_only_channels=1, num_heads=4, depth=2, window_size=2, use_spectral_norm=True),
             (1, 7, 2, 32, 64)),
    "swin": (dict(img_size=(32, 64), patch_size=4, window_size=4, channels=2, levels=2, surface_channels=2,
                  input_only_channels=1, frames=1, embed_dim=32, depths=(2,), num_heads=(4,)),
             (1, 7, 1, 32, 64)),
    "unet": (dict(image_height=32, image_width=64, frames=1, channels=2, surface_channels=2,
                  input_only_channels=1, levels=2,
                  architecture={"name": "unet", "encoder_name": "resnet18", "encoder_weights": None}),
             (1, 7, 1, 32, 64)),
    "debugger": (dict(image_height=32, image_width=64, frames=1, channels=2, surface_channels=2,
                      input_only_channels=1, levels=2), (1, 7, 1, 32, 64)),
    "graph": "needs a grid edge file (edge_path netCDF) and a graph input, not a lat/lon tensor",
    "crossformer-diffusion": "a DDPM: forward takes (x, noise level t, condition), sampled in a loop",
    "unet-diffusion": "a DDPM: forward takes (x, noise level t, condition), sampled in a loop",
    "wrf": "WRF limited-area model: forward takes (x, boundary x) of two grids",
    "dscale": "WRF downscaling: forward takes (x, coarse x) of two grids",
    "unet_downscaling": "needs a downscaling config (two grids)",
}


def wxe_ops():
    src = open(os.path.join(REPO, "importers/onnx/onnx_import.cpp")).read()
    start = src.index("onnx_arities()")
    block = src[start:src.index("return t;", start)]
    return set(re.findall(r'\{"([A-Za-z0-9]+)", \{', block))


def build(model_type, kw, shape):
    import torch
    from credit.models import _load_model_entry

    cls, _ = _load_model_entry(model_type)
    torch.manual_seed(0)
    model = cls(**kw)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(*shape))
    model.eval()
    torch.manual_seed(0)
    x = torch.randn(*shape)
    with torch.no_grad():
        y = model(x)
    return model, x, y


def export(model, x, path, exporter):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "ts":
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                              training=torch.onnx.TrainingMode.EVAL, input_names=["x"], output_names=["y"])
        else:
            prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=18, input_names=["x"],
                                     output_names=["y"], optimize=True, external_data=False)
            prog.save(path, external_data=False)


def op_counts(path):
    import onnx

    m = onnx.load(path)
    counts = collections.Counter()

    def walk(g):
        for n in g.node:
            counts[n.op_type if n.domain in ("", "ai.onnx") else n.domain + "." + n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(m.graph)
    return dict(sorted(counts.items()))


def ort_err(path, x, y):
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    return float(np.abs(out - y.numpy()).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(CONFIGS))
    ap.add_argument("--out", default="/tmp/zoo")
    ap.add_argument("--json", default=None)
    ap.add_argument("--from-json", default=None, help="re-render the table of an earlier run against today's op list")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    known = wxe_ops()
    results = json.load(open(args.from_json)) if args.from_json else []
    for r in results:
        if "ops" in r:
            r["missing"] = sorted(o for o in r["ops"] if o not in known)
    for t in [] if args.from_json else args.types.split(","):
        cfg = CONFIGS[t]
        if isinstance(cfg, str):
            results.append({"type": t, "exporter": "-", "status": "not exported: " + cfg})
            continue
        try:
            model, x, y = build(t, *cfg)
        except Exception as e:  # noqa: BLE001
            results.append({"type": t, "exporter": "-", "status": "build failed: " + str(e).splitlines()[0][:200]})
            print(t, "build failed", file=sys.stderr)
            traceback.print_exc()
            continue
        for exp in ("ts", "dynamo"):
            path = os.path.join(args.out, f"{t}_{exp}.onnx")
            r = {"type": t, "exporter": exp}
            t0 = time.time()
            try:
                export(model, x, path, exp)
                r["ops"] = op_counts(path)
                r["missing"] = sorted(o for o in r["ops"] if o not in known)
                try:
                    r["ort_err"] = ort_err(path, x, y)
                except Exception as e:  # noqa: BLE001
                    r["ort_err"] = "ORT failed: " + str(e).splitlines()[0][:150]
                r["status"] = "ok"
            except Exception as e:  # noqa: BLE001
                r["status"] = "export failed: " + str(e).splitlines()[0][:200]
            r["seconds"] = round(time.time() - t0, 1)
            print(json.dumps(r), file=sys.stderr)
            results.append(r)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    print("| model type | exporter | result | op types (missing in wxe in bold) |")
    print("| --- | --- | --- | --- |")
    for r in results:
        ops = r.get("ops", {})
        cell = ", ".join(("**%s**" % o if o in r.get("missing", []) else o) + " %d" % c for o, c in ops.items())
        res = r["status"]
        if "ort_err" in r:
            res += " (ORT vs PyTorch %s)" % (("%.1e" % r["ort_err"]) if isinstance(r["ort_err"], float) else r["ort_err"])
        print(f"| {r['type']} | {r['exporter']} | {res} | {cell} |")


if __name__ == "__main__":
    main()
