#!/usr/bin/env python3
"""Fixture for issue 23 (CREDIT fidelity): a CREDIT 2026.2 nextgen_wxformer with spectral norm,
column attention through nn.MultiheadAttention (encoder `col_attn` and decoder `dec_col_attn`,
col_attn_stride 2), frames 2, exported by the TorchScript exporter (opset 17), so that the
spectral norm is traced into the graph and the MultiheadAttention projections are anonymous
pre-transposed MatMul weights. Tiny: 16x32 grid, 2 channels x 2 levels + 1 surface + 1 forcing,
dim (4, 8, 16, 32) with dim_head 2 (2, 4, 8, 16 heads: every stage splits over tp 2).

Writes tests/data/credit_nextgen/:
  model.onnx        the export of weights A (seed 0, two train-mode forwards, then eval)
  model_dynamo.onnx the same through the dynamo exporter (opset 18; per-node metadata but the
                    module path dropped): MultiheadAttention's in_proj an anonymous MatMul
                    constant, out_proj a named Gemm weight
  checkpoint.pt     weights B (seed 1) as CREDIT's trainer saves them ({"epoch", "model_state_dict"})
  x.npy, y.npy      an input and model B's eval output (y: what wxe must give with --weights checkpoint.pt)
  data/x_000N.npy, data/y_000N.npy   3 training samples (a fine-tune data directory)
  reference.json    PyTorch's numbers: the parameter count, a LinearWarmupCosineScheduler's
                    state_dict and lrs after 5 steps, and the EMATracker case below
  ema.safetensors   CREDIT's EMATracker (decay 0.5) over 12 updates of a small module with one
                    spectral-norm Linear: "param.K.NAME" (the parameters after update K, K = 0
                    the start) and "shadow.K.NAME" (the tracker's shadow after update K)

    $WXE_PYTHON models/make_credit_nextgen_fixture.py
Checked by `models/check_credit_export.py nextgen` (by hand: it needs torch and CREDIT).
"""
import json
import os
import warnings

import numpy as np
import torch
from safetensors.torch import save_file

from credit.models.wxformer.wxformer_next import NextGenWXFormer
from credit.scheduler import LinearWarmupCosineScheduler
from credit.trainers.base_trainer import EMATracker

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "credit_nextgen")
KW = dict(image_height=16, image_width=32, frames=2, channels=2, levels=2, surface_channels=1,
          input_only_channels=1, output_only_channels=0, dim=(4, 8, 16, 32), depth=(1, 1, 1, 1), dim_head=2,
          global_window_size=(2, 2, 1, 1), local_window_size=(2, 2, 2, 1),
          cross_embed_kernel_sizes=((2, 4), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
          col_attn_heads=2, col_attn_stride=2, decoder_col_attn=True, num_spectral_nodes=4,
          use_spectral_norm=True)
X = (1, 6, 2, 16, 32)
Y = (1, 5, 1, 16, 32)
# the schedule the scheduler reference uses (tests/credit_fidelity_test.cpp runs the same)
SCHED = dict(lr=1e-3, warmup_steps=2, total_steps=8, min_lr=1e-5, steps=5)


def build(seed):
    torch.manual_seed(seed)
    m = NextGenWXFormer(**KW)
    m.train()  # spectral norm: a few power iterations, as training leaves u and v
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(*X))
        for name, p in m.named_parameters():  # zero-initialised biases/embeddings would hide a misplacement
            if p.dim() <= 1 or "level_embedding" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def model_fixture(ref):
    os.makedirs(os.path.join(OUT, "data"), exist_ok=True)
    a, b = build(0), build(1)
    torch.manual_seed(2)
    x = torch.randn(*X)
    with torch.no_grad():
        yb = b(x)
    assert tuple(yb.shape) == Y, yb.shape
    path = os.path.join(OUT, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(a, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                          input_names=["x"], output_names=["y"])
        dyn = os.path.join(OUT, "model_dynamo.onnx")
        torch.onnx.export(a, (x,), dynamo=True, opset_version=18, input_names=["x"], output_names=["y"],
                          optimize=True, external_data=False).save(dyn, external_data=False)
    import onnx

    m = onnx.load(dyn)
    for n in m.graph.node:  # keep the module path (what wxe reads), not the stack traces
        keep = [(p.key, p.value) for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        del n.metadata_props[:]
        for k, v in keep:
            n.metadata_props.add(key=k, value=v)
    onnx.save(m, dyn)
    torch.save({"epoch": 0, "model_state_dict": b.state_dict()}, os.path.join(OUT, "checkpoint.pt"))
    np.save(os.path.join(OUT, "x.npy"), x.numpy())
    np.save(os.path.join(OUT, "y.npy"), yb.numpy())
    for k in range(3):
        np.save(os.path.join(OUT, "data", f"x_{k:04d}.npy"), torch.randn(*X).numpy())
        np.save(os.path.join(OUT, "data", f"y_{k:04d}.npy"), torch.randn(*Y).numpy())
    ref["parameters"] = sum(p.numel() for p in b.parameters())
    ref["parameter_tensors"] = len(list(b.parameters()))
    ref["col_attn"] = {k: list(v.shape) for k, v in b.state_dict().items() if "col_attn.attn" in k}
    print("params", ref["parameters"], "onnx bytes", os.path.getsize(path), os.path.getsize(dyn), "col_attn",
          ref["col_attn"])


def scheduler_reference(ref):
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=SCHED["lr"], betas=(0.9, 0.95))
    s = LinearWarmupCosineScheduler(opt, warmup_steps=SCHED["warmup_steps"], total_steps=SCHED["total_steps"],
                                    min_lr=SCHED["min_lr"])
    lrs = []
    for _ in range(SCHED["steps"]):
        lrs.append(opt.param_groups[0]["lr"])  # the lr this optimizer step uses
        p.grad = torch.ones_like(p)
        opt.step()
        s.step()
    ref["scheduler"] = dict(SCHED, lrs=lrs, state_dict=s.state_dict(),
                            param_group_lr=opt.param_groups[0]["lr"],
                            initial_lr=opt.param_groups[0]["initial_lr"])


def ema_reference(ref):
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.utils.spectral_norm(torch.nn.Linear(3, 2)), torch.nn.Linear(2, 2, bias=False))
    m.train()
    m(torch.randn(1, 3))  # u, v as training leaves them
    ema = EMATracker(m, decay=0.5)
    assert not any(k.endswith(("weight_u", "weight_v")) for k in ema.shadow)
    out = {}
    names = [n for n, _ in m.named_parameters()]
    sd = dict(m.named_parameters())
    for n in names:
        out[f"param.0.{n}"] = sd[n].detach().clone()
        out[f"shadow.0.{n}"] = ema.shadow[n].clone()
    for k in range(1, 13):
        with torch.no_grad():
            for n in names:
                sd[n].add_(torch.randn_like(sd[n]))
            m(torch.randn(1, 3))  # moves u and v too: the tracker must ignore them
        ema.update(m)
        for n in names:
            out[f"param.{k}.{n}"] = sd[n].detach().clone()
            out[f"shadow.{k}.{n}"] = ema.shadow[n].clone()
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "ema.safetensors"),
              metadata={"decay": "0.5", "updates": "12", "names": ",".join(names)})
    ref["ema"] = {"decay": 0.5, "updates": 12, "names": names, "shadow_keys": list(ema.shadow)}


if __name__ == "__main__":
    ref = {"credit": __import__("credit").__version__ if hasattr(__import__("credit"), "__version__") else "",
           "torch": torch.__version__}
    model_fixture(ref)
    scheduler_reference(ref)
    ema_reference(ref)
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref["scheduler"]))
