#!/usr/bin/env python3
"""Time one training step of wxe against PyTorch eager, per model and thread count.

Usage (the PyTorch side needs the venv described in models/export_credit.py):

    $WXE_PYTHON bench/compare_train.py \\
        [--models crossformer_tiny,wxformer_tiny,wxformer_v2026] [--threads 1,2] \\
        [--runs R] [--wxe build/wxe] [--engines wxe,torch[,torch_compile]] [--busy N] [--json OUT]

    e.g. the tiny models at 1 and 2 threads, then the benchmark model with fewer runs:
    $WXE_PYTHON bench/compare_train.py --models crossformer_tiny,wxformer_tiny
    $WXE_PYTHON bench/compare_train.py --models wxformer_v2026 --runs 3

One training step = forward, loss, backward, global-norm clipping, AdamW step, zero_grad,
at batch 1. Each engine runs in its own fresh process (one per model and thread count);
peak RSS is that child's ru_maxrss (os.wait4, i.e. getrusage of the child alone; wxe's
own peak_rss_mb from its JSON is shown when it prints one). Time: one warm-up step (it
also allocates the optimizer state), then R timed steps; median / min / max ms.

Engines:

  torch  PyTorch eager: the CREDIT model built from miles-credit with the configs of
         bench/compare_peers.py, model.train(), torch.set_num_threads(N), interop 1.
         Loss: latitude-weighted MSE, mean((pred - target)^2 * wlat[h] * wvar[c]),
         wlat = cos(lat)/mean(cos(lat)), lat = linspace(90, -90, H), wvar = 1; the target
         is zeros (as `wxe bench --train`). torch.optim.AdamW(lr 1e-4, betas (0.9, 0.95),
         eps 1e-8, weight_decay 0.01; PyTorch's default implementation on CPU, i.e. what
         CREDIT's trainer builds), clip_grad_norm_(1.0), zero_grad(set_to_none=True).
  wxe    `WXE bench --train MODEL.onnx --input X.npy [--weights CKPT] --threads N
         --runs R --json`; the last stdout line is parsed as JSON (median_ms, min_ms,
         max_ms, peak_rss_mb). A missing or failing binary is reported and skipped.

Models (weights):

  crossformer_tiny  tests/data/crossformer_tiny_opset17.onnx (spectral norm traced) and
                    tests/data/crossformer_tiny_checkpoint.pt for both engines; PyTorch
                    trains with spectral norm (one power iteration per forward).
  wxformer_tiny     the same with tests/data/wxformer_tiny_opset17.onnx and its checkpoint.
  wxformer_v2026    shared/fixtures/credit/wxformer_v2026_snbaked_opset17.onnx (spectral
                    norm removed) with its own weights for wxe; PyTorch: the same
                    architecture without spectral norm (plain weights, the computation wxe
                    trains), random init, torch.manual_seed(0). --torch-sn adds spectral
                    norm to the PyTorch side (what a CREDIT config with it would train).
                    Input shared/fixtures/credit/wxformer_v2026_x.npy (1,80,1,181,360).

The table gives, per model and thread count, each engine's median / min / max ms and
peak RSS, and the ratio wxe / PyTorch for time and for memory (goal of issue 8: time
<= 0.7x, memory below 1x).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from compare_peers import (  # noqa: E402
    TORCH_MODELS,
    _loadavg,
    _peak_rss_self_mb,
    _summary,
    _time_runs,
    run_child,
)

FIXTURES = os.environ.get("WXE_FIXTURES", os.path.join(REPO, "..", "shared", "fixtures", "credit"))
TESTDATA = os.environ.get("WXE_TESTDATA", os.path.join(REPO, "tests", "data"))
PRODUCTION_DIR = os.environ.get("WXE_PRODUCTION", os.path.join(REPO, "build", "wxe_production"))

# name -> (onnx for wxe, input .npy, checkpoint or None, PyTorch uses spectral norm)
MODELS = {
    "crossformer_tiny": (os.path.join(TESTDATA, "crossformer_tiny_opset17.onnx"),
                         os.path.join(TESTDATA, "crossformer_tiny_x.npy"),
                         os.path.join(TESTDATA, "crossformer_tiny_checkpoint.pt"), True),
    "wxformer_tiny": (os.path.join(TESTDATA, "wxformer_tiny_opset17.onnx"),
                      os.path.join(TESTDATA, "crossformer_tiny_x.npy"),
                      os.path.join(TESTDATA, "wxformer_tiny_checkpoint.pt"), True),
    "wxformer_v2026": (os.path.join(FIXTURES, "wxformer_v2026_snbaked_opset17.onnx"),
                       os.path.join(FIXTURES, "wxformer_v2026_x.npy"), None, False),
    # models/make_production_model.py --out $WXE_PRODUCTION (never committed)
    "crossformer_640": (os.path.join(PRODUCTION_DIR, "crossformer_640.onnx"),
                        os.path.join(PRODUCTION_DIR, "crossformer_640_x.npy"), None, False),
}
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_MAX_NORM = 1e-4, (0.9, 0.95), 1e-8, 0.01, 1.0


# --------------------------------------------------------------------------- child: torch


def child_torch(a):
    import importlib

    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    base = _peak_rss_self_mb()
    notes = []
    _, xpath, ckpt, sn = MODELS[a.model]
    sn = sn or a.torch_sn
    modname, cfg = TORCH_MODELS[a.model]
    cls = importlib.import_module(modname).CrossFormer
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = cls(**cfg, use_spectral_norm=sn)
    if ckpt:
        ck = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(ck.get("model_state_dict", ck), strict=True)
        notes.append(f"weights {os.path.basename(ckpt)}")
    else:
        notes.append("random init (seed 0)")
    model.train()
    if a.checkpoint:  # as CREDIT's trainer.activation_checkpoint: torch.utils.checkpoint per block
        from torch.utils.checkpoint import checkpoint

        wrapped = 0
        for m in model.modules():
            if type(m).__name__ in ("Attention", "FeedForward"):
                m.forward = (lambda f: lambda *args, **kw: checkpoint(f, *args, use_reentrant=False, **kw))(m.forward)
                wrapped += 1
        notes.append(f"torch.utils.checkpoint around {wrapped} attention and feed-forward modules")
    x = torch.from_numpy(np.load(xpath))
    out_c = cfg["channels"] * cfg["levels"] + cfg["surface_channels"] + cfg["output_only_channels"]
    h, w = x.shape[-2], x.shape[-1]
    target = torch.zeros(x.shape[0], out_c, cfg["output_frames"], h, w)
    lat = torch.tensor(np.linspace(90.0, -90.0, h), dtype=torch.float32)
    wlat = torch.cos(torch.deg2rad(lat))
    wlat = (wlat / wlat.mean()).view(1, 1, 1, h, 1)
    wvar = torch.ones(1, out_c, 1, 1, 1)
    if a.device == "cuda":  # fp32 with TF32 off on both sides, as wxe computes
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        model, x, target, wlat, wvar = (t.cuda() for t in (model, x, target, wlat, wvar))
        notes.append(f"on {torch.cuda.get_device_name()}, TF32 off")
    if a.torch_compile:  # compiled in the warm-up step, which is not timed
        model = torch.compile(model)
        notes.append("torch.compile (default mode)")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    params = [p for p in model.parameters()]
    load_s = time.perf_counter() - t0
    losses = []

    def step():
        pred = model(x)
        loss = ((pred - target) ** 2 * wlat * wvar).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())

    times, _ = _time_runs(step, a.runs)
    res = _summary(times)
    if a.device == "cuda":  # every step's peak, warm-up included (its optimizer state persists)
        res["device_peak_mb"] = torch.cuda.max_memory_allocated() / 1e6
    notes.append(f"spectral norm {'on' if sn else 'off'}")
    notes.append(f"{sum(p.numel() for p in params):,} params")
    notes.append(f"loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    res.update(load_s=load_s, base_rss_mb=base, version=torch.__version__, notes=notes,
               times_ms=times, peak_rss_mb_self=_peak_rss_self_mb())
    return res


# --------------------------------------------------------------------------- parent


def engine_torch(a, model, threads, compiled=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", model, "--threads", str(threads),
           "--runs", str(a.runs), "--device", a.device]
    if compiled:
        cmd.append("--torch-compile")
    if a.torch_sn:
        cmd.append("--torch-sn")
    if a.checkpoint:
        cmd.append("--checkpoint")
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    rc, out, err, rss = run_child(cmd, env=env)
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if rc != 0 or not lines:
        tail = "\n".join((err.strip().splitlines() or ["(no stderr)"])[-3:])
        return {"error": f"torch child exited {rc}: {tail}"}
    res = json.loads(lines[-1])
    res["peak_rss_mb"] = rss
    return res


@contextlib.contextmanager
def busy(n):
    """n spinning processes for the duration (a competing load: issue 22's busy-machine case)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if procs:
            time.sleep(1.0)  # running before the engine starts (wxe samples the load at start-up)
        yield
    finally:
        for q in procs:
            q.kill()
            q.wait()


def engine_wxe(a, model, threads):
    exe = a.wxe
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        return {"error": f"wxe binary not found: {exe}"}
    onnx, xpath, ckpt, _ = MODELS[model]
    cmd = [exe, "bench", "--train", onnx, "--input", xpath, "--threads", str(threads),
           "--runs", str(a.runs), "--json", "--device", a.device]
    if ckpt:
        cmd += ["--weights", ckpt]
    if a.checkpoint:
        cmd += ["--activation-checkpoint", "blocks"]
    cmd += a.wxe_arg
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    rc, out, err, rss = run_child(cmd, env=env)
    if rc != 0:
        tail = (err.strip().splitlines() or ["(no stderr)"])[-1]
        return {"error": f"wxe exited {rc}: {tail}"}
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    try:
        res = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": "could not parse the last stdout line of wxe as JSON"}
    res["peak_rss_mb_wait4"] = rss
    res.setdefault("peak_rss_mb", rss)
    return res


def print_table(rows, a):
    hdr = (f"{'model':<16} {'thr':>3} {'engine':<8} {'median ms':>10} {'min ms':>10} {'max ms':>10} "
           f"{'peak RSS MB':>12} {'wxe/PT time':>11} {'wxe/PT RSS':>10}")
    print(hdr)
    print("-" * len(hdr))
    for (model, threads), res in rows:
        pt = res.get("pytorch", {})
        for eng, r in res.items():
            if "error" in r:
                print(f"{model:<16} {threads:>3} {eng:<8} {'-':>10} {'-':>10} {'-':>10} {'-':>12} "
                      f"{'-':>11} {'-':>10}  ({r['error']})")
                continue
            rt = rm = "-"
            if eng == "wxe" and "median_ms" in res.get("compiled", {}):
                extra_c = f" (vs torch.compile {r['median_ms'] / res['compiled']['median_ms']:.2f}x)"
            else:
                extra_c = ""
            if eng == "wxe" and "median_ms" in pt:
                rt = f"{r['median_ms'] / pt['median_ms']:.2f}x"
                rm = f"{r['peak_rss_mb'] / pt['peak_rss_mb']:.2f}x"
                if r.get("device_peak_mb") and pt.get("device_peak_mb"):
                    rm += f" (GPU memory {r['device_peak_mb']:.0f} / {pt['device_peak_mb']:.0f} MB = "
                    rm += f"{r['device_peak_mb'] / pt['device_peak_mb']:.2f}x)"
            print(f"{model:<16} {threads:>3} {eng:<8} {r['median_ms']:>10.1f} {r['min_ms']:>10.1f} "
                  f"{r['max_ms']:>10.1f} {r['peak_rss_mb']:>12.1f} {rt:>11} {rm:>10}{extra_c}")
    for (model, threads), res in rows:
        for eng, r in res.items():
            if "error" in r:
                continue
            extra = []
            if "load_s" in r:
                extra.append(f"build {r['load_s']:.2f} s")
            if "base_rss_mb" in r:
                extra.append(f"RSS before the model {r['base_rss_mb']:.0f} MB")
            if "version" in r:
                extra.append(f"torch {r['version']}")
            if "peak_rss_mb_wait4" in r:
                extra.append(f"wait4 peak RSS {r['peak_rss_mb_wait4']:.0f} MB")
            extra += r.get("notes", [])
            if extra:
                print(f"  {model} t{threads} {eng}: " + "; ".join(extra))


def main(argv=None):
    p = argparse.ArgumentParser(description="Time a training step: wxe vs PyTorch eager.")
    p.add_argument("--models", default="crossformer_tiny,wxformer_tiny,wxformer_v2026",
                   help="comma-separated subset of " + ",".join(MODELS))
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--runs", type=int, default=5, help="timed steps after one warm-up (default 5)")
    p.add_argument("--wxe", default=os.path.join(REPO, "build", "wxe"), help="wxe binary (default build/wxe)")
    p.add_argument("--wxe-arg", action="append", default=[],
                   help="extra argument for `wxe bench --train` (repeat)")
    p.add_argument("--engines", default="wxe,torch",
                   help="comma-separated: wxe, torch (PyTorch eager), torch_compile (torch.compile, compiled in "
                        "the untimed warm-up step); ratios are against eager")
    p.add_argument("--torch-compile", action="store_true", help=argparse.SUPPRESS)  # the compiled engine's child
    p.add_argument("--torch-sn", action="store_true",
                   help="PyTorch side of wxformer_v2026 with spectral norm (default off, like the baked graph)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: wxe bench --train --device cuda against PyTorch on the GPU (fp32, TF32 off); "
                        "the GPU memory at the peak: wxe's device_peak_mb, torch.cuda.max_memory_allocated()")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing on both sides: wxe --activation-checkpoint blocks, PyTorch "
                        "torch.utils.checkpoint around each attention and feed-forward module (as CREDIT)")
    p.add_argument("--busy", type=int, default=0,
                   help="competing busy processes (spinning loops) running beside every engine's run (default 0)")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--_child", choices=sorted(MODELS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a._child:
        a.model = a._child
        a.threads = int(a.threads)
        print(json.dumps(child_torch(a)))
        return 0

    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m}")
    threads = [int(t) for t in a.threads.split(",") if t]
    engines = [e for e in a.engines.split(",") if e]
    rows = []
    load_before = _loadavg()
    for model in models:
        for t in threads:
            res = {}
            for eng in engines:
                if eng not in ("wxe", "torch", "torch_compile"):
                    p.error(f"unknown engine {eng}")
                with busy(a.busy):
                    if eng == "wxe":
                        res["wxe"] = engine_wxe(a, model, t)
                    elif eng == "torch":
                        res["pytorch"] = engine_torch(a, model, t)
                    else:
                        res["compiled"] = engine_torch(a, model, t, compiled=True)
                name = list(res)[-1]
                r = res[name]
                msg = r["error"] if "error" in r else f"median {r['median_ms']:.1f} ms, peak RSS {r['peak_rss_mb']:.0f} MB"
                if r.get("device_peak_mb"):
                    msg += f", GPU memory at the peak {r['device_peak_mb']:.0f} MB"
                print(f"{model} threads {t} {name}: {msg}", file=sys.stderr)
            rows.append(((model, t), res))
    print(f"training step (forward + loss + backward + clip + AdamW), batch 1, runs {a.runs} (+1 warm-up), "
          f"{os.cpu_count()} CPUs, 1-min load average {load_before} before / {_loadavg()} after"
          + (f", {a.busy} busy process(es) beside each run" if a.busy else ""))
    print_table(rows, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"model": m, "threads": t, "results": r} for (m, t), r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
