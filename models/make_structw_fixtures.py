#!/usr/bin/env python3
"""Fixtures for loading a legacy checkpoint into exports whose parameter names are lost
(issue 10 item 6; engine/passes/passes.h name_params_by_structure):

- `structw_crossformer_dynamo.onnx`: a small CREDIT CrossFormer (credit.models.crossformer,
  spectral norm ON, earth padding) exported with the dynamo exporter (opset 18). Its
  onnxscript optimizer folds the spectral norm of every small layer into anonymous constants
  (`div_12`), the position-bias MLP's first Linear (run on a constant grid) into `linear_4`,
  GroupNorm's affine parameters into `val_*`, and shares equal initializers between modules.
- `structw_nextgen_f2_ts.onnx`: a nextgen_wxformer with frames=2 (the level embedding and the
  column attention run once per frame) exported with the TorchScript exporter (opset 17):
  the second use of a parameter is renamed (`level_embedding_1.bias`), and the column
  attention's in/out projections are pre-transposed into `onnx::MatMul_*` constants.

Each export is made from weights A (seed 0); the checkpoint (`*_checkpoint.pt`, CREDIT's
trainer format: torch.save({"model_state_dict": state_dict})) holds other weights B (seed 1),
and `*_y.npy` is model B's output on `*_x.npy`: a test that loads the checkpoint and matches y
has put every tensor of B where it belongs (the export's own values would give another y).

    $WXE_PYTHON models/make_structw_fixtures.py [--extra DIR]

--extra DIR writes, instead, the same models through the other exporter (and a wxformer) to
DIR, for checking by hand: `wxe infer DIR/NAME.onnx -i DIR/NAME_x.npy -w DIR/NAME_checkpoint.pt
--compare DIR/NAME_y.npy`.
"""
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")

CF_KW = dict(image_height=16, image_width=32, frames=1, output_frames=1, channels=2, levels=2, surface_channels=1,
             input_only_channels=1, output_only_channels=0, dim=(4, 8, 16, 32), depth=(1, 1, 1, 1), dim_head=4,
             global_window_size=(2, 2, 1, 1), local_window_size=2,
             cross_embed_kernel_sizes=((2, 4), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
             attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=True, interp=True,
             padding_conf={"activate": True, "mode": "earth", "pad_lat": [8, 8], "pad_lon": [16, 16]})
CF_X = (1, 6, 1, 16, 32)

NG_KW = dict(image_height=16, image_width=32, frames=2, channels=2, levels=2, surface_channels=1,
             input_only_channels=1, output_only_channels=0, dim=(4, 8, 16, 32), depth=(1, 1, 1, 1), dim_head=4,
             global_window_size=(2, 2, 1, 1), local_window_size=(2, 2, 2, 1),
             cross_embed_kernel_sizes=((2, 4), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
             col_attn_heads=2, col_attn_stride=2, num_spectral_nodes=4, use_spectral_norm=True)
NG_X = (1, 6, 2, 16, 32)  # (2 channels x 2 levels + 1 surface + 1 forcing), 2 frames


def build(cls, kw, seed, xshape):
    torch.manual_seed(seed)
    m = cls(**kw)
    m.train()  # spectral norm: a few power iterations, as training leaves u and v
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(*xshape))
        for name, p in m.named_parameters():  # zero-initialised biases/embeddings would hide a misplacement
            if p.dim() <= 1 or "level_embedding" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def make(name, cls, kw, xshape, exporter, out=OUT):
    a = build(cls, kw, 0, xshape)
    b = build(cls, kw, 1, xshape)
    torch.manual_seed(2)
    x = torch.randn(*xshape)
    with torch.no_grad():
        ya, yb = a(x), b(x)
    path = os.path.join(out, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "ts":
            torch.onnx.export(a, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                              input_names=["x"], output_names=["y"])
        else:
            prog = torch.onnx.export(a, (x,), dynamo=True, opset_version=18, input_names=["x"], output_names=["y"],
                                     optimize=True, external_data=False)
            prog.save(path, external_data=False)
        # per-node metadata: keep the module path (what wxe reads); the stack traces, FX nodes and
        # class lists would make the file 4x larger
        m = onnx.load(path)
        for n in m.graph.node:
            keep = [(p.key, p.value) for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
            del n.metadata_props[:]
            for k, v in keep:
                n.metadata_props.add(key=k, value=v)
        onnx.save(m, path)
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    torch.save({"model_state_dict": b.state_dict()}, os.path.join(out, f"{name}_checkpoint.pt"))
    np.save(os.path.join(out, f"{name}_x.npy"), x.numpy())
    np.save(os.path.join(out, f"{name}_y.npy"), yb.numpy())
    print(name, "params", sum(p.numel() for p in a.parameters()), "bytes", os.path.getsize(path),
          "ORT vs PyTorch A", float(np.abs(got - ya.numpy()).max()), "|yA - yB|", float((ya - yb).abs().max()))


if __name__ == "__main__":
    from credit.models.crossformer import CrossFormer
    from credit.models.wxformer.wxformer_next import NextGenWXFormer

    if "--extra" in sys.argv:  # the other exporter of each, and the wxformer, to DIR (not kept)
        from credit.models.wxformer.crossformer import CrossFormer as WXFormer

        out = sys.argv[sys.argv.index("--extra") + 1]
        make("structw_crossformer_ts", CrossFormer, CF_KW, CF_X, "ts", out)
        make("structw_wxformer_dynamo", WXFormer, CF_KW, CF_X, "dynamo", out)
        make("structw_nextgen_f2_dynamo", NextGenWXFormer, NG_KW, NG_X, "dynamo", out)
        sys.exit(0)
    make("structw_crossformer_dynamo", CrossFormer, CF_KW, CF_X, "dynamo")
    make("structw_nextgen_f2_ts", NextGenWXFormer, NG_KW, NG_X, "ts")
