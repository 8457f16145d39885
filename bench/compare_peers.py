#!/usr/bin/env python3
"""Time wxe against its peers (ONNX Runtime, PyTorch eager) on one ONNX model.

Usage (the Python peers need the venv described in models/export_credit.py):

    $WXE_PYTHON bench/compare_peers.py MODEL.onnx INPUT.npy \\
        [--threads N] [--runs R] [--wxe build/wxe] \\
        [--torch-model {crossformer_tiny,wxformer_tiny,wxformer_v2026}] \\
        [--torch-weights FILE] [--expected Y.npy] [--peers wxe,ort,torch] [--json OUT] [--device cpu|cuda]
        [--wxe-arg=--precision --wxe-arg=bf16 --torch-bf16]   (bf16 on both sides)

    e.g. at 1 and 2 threads on the benchmark model:
    F=${WXE_FIXTURES:-../shared/fixtures/credit}
    for t in 1 2; do
      $WXE_PYTHON bench/compare_peers.py $F/wxformer_v2026_snbaked_opset17.onnx \\
          $F/wxformer_v2026_x.npy --threads $t --torch-model wxformer_v2026 \\
          --expected $F/wxformer_v2026_y.npy
    done

Peers, each in its own process so that peak RSS is per peer (ru_maxrss of that
one child, from os.wait4; wxe reports its own peak_rss_mb, which is used when present):

  wxe    `WXE bench MODEL --input X --threads N --runs R --json`; the last stdout
         line is parsed as JSON (median_ms, min_ms, max_ms, peak_rss_mb). A missing
         or failing binary is reported and skipped.
  ort    onnxruntime, ORT_ENABLE_ALL, intra_op_num_threads=N, inter_op_num_threads=1,
         ORT_SEQUENTIAL, CPU provider.
  torch  PyTorch eager (only with --torch-model): the CREDIT model built from the
         miles-credit package with the config of shared/fixtures/README.md, weights
         from --torch-weights (default: MODEL itself): an ONNX file (initializers
         matched to state-dict names; spectral-norm weight_orig/_u/_v if present,
         else plain weights; parameters the TorchScript exporter de-duplicated are
         accepted when an initializer with the same values exists), a CREDIT
         checkpoint / state dict (.pt), or a TorchScript module. torch.set_num_threads(N).
         A dynamo-exported ONNX file is no weight source (its exporter folded most
         spectral-norm weights into unnamed constants): pass --torch-weights CHECKPOINT.

Each Python peer does one warm-up run and R timed runs of the forward pass only
(session creation / model build is timed separately as load_s). The table gives
median / min / max ms, peak RSS MB and the median relative to ONNX Runtime; with
--expected, the max abs error of each peer's output is also shown (wxe's from a
separate, untimed `wxe infer --compare` run, which also prints its relative L2 error).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# --------------------------------------------------------------------------- model configs

TINY = dict(
    image_height=32, image_width=64, frames=1, output_frames=1, channels=2, levels=2,
    surface_channels=2, input_only_channels=1, output_only_channels=0,
    dim=(16, 32, 64, 128), depth=(1, 1, 2, 1), dim_head=8, global_window_size=(4, 2, 2, 1),
    local_window_size=2, cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
    cross_embed_strides=(2, 2, 2, 2), attn_dropout=0.0, ff_dropout=0.0, interp=True,
    padding_conf={"activate": True, "mode": "earth", "pad_lat": [16, 16], "pad_lon": [16, 16]},
)
# shared/fixtures/README.md says lat padding (30, 30); the fixture graph pads 37 rows on
# top and 38 at the bottom (181 -> 256, so every stage divides by the windows), and only
# (37, 38) reproduces wxformer_v2026_y.npy.
V2026 = dict(
    image_height=181, image_width=360, frames=1, output_frames=1, channels=4, levels=18,
    surface_channels=4, input_only_channels=4, output_only_channels=8,
    dim=(32, 64, 128, 256), depth=(2, 2, 8, 2), dim_head=32, global_window_size=(8, 4, 2, 1),
    local_window_size=4, cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
    cross_embed_strides=(2, 2, 2, 2), attn_dropout=0.0, ff_dropout=0.0, interp=True,
    padding_conf={"activate": True, "mode": "earth", "pad_lat": [37, 38], "pad_lon": [12, 12]},
)
# CREDIT's production grid (the paper's 6-hour CrossFormer, 124 M parameters; exported by
# models/make_production_model.py, never committed): CREDIT's CrossFormer defaults with the
# paper's dims, one frame and 16 levels, no boundary padding.
PRODUCTION = dict(
    image_height=640, image_width=1280, frames=1, output_frames=1, channels=4, levels=16,
    surface_channels=7, input_only_channels=3, output_only_channels=0,
    dim=(128, 256, 512, 1024), depth=(2, 2, 8, 2), dim_head=32, global_window_size=(5, 5, 2, 1),
    local_window_size=10, cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
    cross_embed_strides=(4, 2, 2, 2), attn_dropout=0.0, ff_dropout=0.0, interp=True,
    padding_conf={"activate": False},
)
TORCH_MODELS = {
    "crossformer_tiny": ("credit.models.crossformer", TINY),
    "wxformer_tiny": ("credit.models.wxformer.crossformer", TINY),
    "wxformer_v2026": ("credit.models.wxformer.crossformer", V2026),
    "crossformer_640": ("credit.models.crossformer", PRODUCTION),
}


def _peak_rss_self_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _time_runs(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def _summary(times):
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


# --------------------------------------------------------------------------- child: ORT


def child_ort(a):
    import numpy as np
    import onnxruntime as ort

    base = _peak_rss_self_mb()
    x = np.load(a.input)
    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if a.device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise SystemExit(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                             f"(providers: {ort.get_available_providers()}); install onnxruntime-gpu")
        providers = ["CUDAExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(a.model, so, providers=providers)
    name = sess.get_inputs()[0].name
    load_s = time.perf_counter() - t0
    times, out = _time_runs(lambda: sess.run(None, {name: x})[0], a.runs)
    res = _summary(times)
    res.update(load_s=load_s, base_rss_mb=base, version=ort.__version__)
    if a.expected:
        res["max_abs_err"] = float(np.abs(out - np.load(a.expected)).max())
    res["peak_rss_mb_self"] = _peak_rss_self_mb()
    return res


# --------------------------------------------------------------------------- child: torch


def _onnx_state_dict(path, model, log):
    """Map ONNX initializers onto model's state dict by name."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    om = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in om.graph.initializer}
    by_numel = {}
    for v in inits.values():
        by_numel.setdefault(v.size, []).append(v.reshape(-1))
    sd = model.state_dict()
    new, dedup, default = {}, 0, []
    for k, v in sd.items():
        if k in inits and tuple(inits[k].shape) == tuple(v.shape):
            new[k] = torch.from_numpy(inits[k].copy())
            continue
        flat = v.detach().cpu().numpy().reshape(-1)
        if any(np.array_equal(c, flat) for c in by_numel.get(flat.size, [])):
            dedup += 1  # the exporter kept one copy of identical tensors under another name
        else:
            default.append(k)
        new[k] = v
    # cube_embedding is not used by forward() when patch_height == patch_width == 1.
    default = [k for k in default if not k.startswith("cube_embedding.")]
    if dedup:
        log(f"{dedup} tensors not named in the ONNX file have an equal-valued initializer "
            "(exporter de-duplication); kept")
    if default:
        log(f"WARNING: {len(default)} tensors not found in the ONNX file, left at their "
            f"initial values: {default[:6]}{' ...' if len(default) > 6 else ''}")
    return new


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
    log = notes.append
    x = torch.from_numpy(np.load(a.input))
    t0 = time.perf_counter()
    wpath = a.torch_weights or a.model
    if wpath.endswith((".pt", ".pth", ".ts", ".jit")) and _is_torchscript(wpath):
        model = torch.jit.load(wpath, map_location="cpu").eval()
        log("TorchScript module")
    else:
        modname, cfg = TORCH_MODELS[a.torch_model]
        cls = importlib.import_module(modname).CrossFormer
        if wpath.endswith(".onnx"):
            import onnx

            names = {i.name for i in onnx.load(wpath, load_external_data=False).graph.initializer}
            sn = any(n.endswith("weight_orig") for n in names)
            model = cls(**cfg, use_spectral_norm=sn)
            sd = _onnx_state_dict(wpath, model, log)
        else:
            ck = torch.load(wpath, map_location="cpu", weights_only=False)
            sd = ck.get("model_state_dict", ck) if isinstance(ck, dict) else ck
            sn = any(k.endswith("weight_orig") for k in sd)
            model = cls(**cfg, use_spectral_norm=sn)
        model.load_state_dict(sd)
        if sn:
            n = _refresh_sn_u(model)
            log(f"spectral-norm u recomputed as normalize(W v) for {n} layers")
        model.eval()
        log(f"{a.torch_model}, spectral norm {'in eval form' if sn else 'baked'}, "
            f"{sum(p.numel() for p in model.parameters()):,} params")
    load_s = time.perf_counter() - t0
    if a.device == "cuda":  # fp32; cuDNN's default TF32 convolutions off, so both sides are fp32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        model, x = model.cuda(), x.cuda()
        log(f"on {torch.cuda.get_device_name()}, TF32 off")
    if a.torch_compile:  # compiled on the warm-up run, which is not timed
        model = torch.compile(model)
        log("torch.compile (default mode)")

    def run():
        # --torch-bf16: autocast, PyTorch's bf16 inference (matmuls and convs in bf16)
        cast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.torch_bf16)
        with torch.inference_mode(), cast:
            y = model(x).float()
            if a.device == "cuda":
                torch.cuda.synchronize()
                y = y.cpu()
            return y

    times, out = _time_runs(run, a.runs)
    res = _summary(times)
    res.update(load_s=load_s, base_rss_mb=base, version=torch.__version__, notes=notes)
    if a.expected:
        res["max_abs_err"] = float(np.abs(out.numpy() - np.load(a.expected)).max())
    res["peak_rss_mb_self"] = _peak_rss_self_mb()
    return res


def _refresh_sn_u(model):
    """Set each spectral-norm u to normalize(W_mat v).

    That is exactly the last step of PyTorch's power iteration, so it reproduces the
    stored u; it repairs u vectors the TorchScript exporter de-duplicated away (a
    1-element u is +1 or -1 and cannot be told apart by value alone).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.utils.spectral_norm import SpectralNorm

    n = 0
    with torch.no_grad():
        for mod in model.modules():
            for hook in mod._forward_pre_hooks.values():
                if isinstance(hook, SpectralNorm):
                    w = hook.reshape_weight_to_matrix(getattr(mod, hook.name + "_orig"))
                    v = getattr(mod, hook.name + "_v")
                    getattr(mod, hook.name + "_u").copy_(F.normalize(w @ v, dim=0, eps=hook.eps))
                    n += 1
    return n


def _is_torchscript(path):
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist())
    except zipfile.BadZipFile:
        return False


# --------------------------------------------------------------------------- parent


def _loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def run_child(cmd, env=None):
    """Run cmd; return (returncode, stdout, stderr, ru_maxrss MB of that child alone)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        except OSError as exc:
            return None, "", str(exc), None
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), ru.ru_maxrss / 1024.0


def peer_wxe(a):
    exe = a.wxe
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        return {"error": f"wxe binary not found: {exe}"}
    dev = ["--device", a.device] if a.device != "cpu" else []
    cmd = [exe, "bench", a.model, "--input", a.input, "--threads", str(a.threads),
           "--runs", str(a.runs), "--json"] + dev + a.wxe_arg
    rc, out, err, rss = run_child(cmd)
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
    if a.expected:  # accuracy from a separate `wxe infer --compare` (not timed)
        cmd = [exe, "infer", a.model, "--input", a.input, "--threads", str(a.threads),
               "--compare", a.expected] + dev + a.wxe_arg
        rc, out, err, _ = run_child(cmd)
        for ln in out.splitlines():
            if "max abs diff" in ln:
                res["max_abs_err"] = float(ln.split("max abs diff")[1].split(",")[0])
                res["rel_l2_err"] = float(ln.split("relative L2")[1])
    return res


def peer_py(kind, a, compiled=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", kind, a.model, a.input,
           "--threads", str(a.threads), "--runs", str(a.runs), "--device", a.device]
    if a.expected:
        cmd += ["--expected", a.expected]
    if kind == "torch":
        cmd += ["--torch-model", a.torch_model]
        if a.torch_weights:
            cmd += ["--torch-weights", a.torch_weights]
        if a.torch_bf16:
            cmd += ["--torch-bf16"]
        if compiled:
            cmd += ["--torch-compile"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(a.threads))
    rc, out, err, rss = run_child(cmd, env=env)
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if rc != 0 or not lines:
        tail = "\n".join((err.strip().splitlines() or ["(no stderr)"])[-3:])
        return {"error": f"{kind} child exited {rc}: {tail}"}
    res = json.loads(lines[-1])
    res["peak_rss_mb"] = rss
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description="Time wxe, ONNX Runtime and PyTorch on one model.")
    p.add_argument("model")
    p.add_argument("input")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=5, help="timed runs after one warm-up (default 5)")
    p.add_argument("--wxe", default=os.path.join("build", "wxe"), help="wxe binary (default build/wxe)")
    p.add_argument("--wxe-arg", action="append", default=[],
                   help="extra argument for wxe bench/infer (repeat), e.g. --wxe-arg=--precision --wxe-arg=bf16")
    p.add_argument("--torch-model", choices=sorted(TORCH_MODELS))
    p.add_argument("--torch-weights", help="ONNX / checkpoint / TorchScript file (default: MODEL)")
    p.add_argument("--expected", help="expected output .npy: report each peer's max abs error (wxe: from a "
                   "separate untimed `wxe infer --compare` run)")
    p.add_argument("--peers", default="wxe,ort,torch",
                   help="comma-separated: wxe, ort, torch (PyTorch eager), torch_compile (torch.compile, "
                        "compiled in the untimed warm-up run)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: wxe --device cuda, ONNX Runtime's CUDA provider, PyTorch on the GPU (fp32, TF32 off)")
    p.add_argument("--torch-bf16", action="store_true",
                   help="PyTorch under torch.autocast(bfloat16), to compare with --wxe-arg=--precision --wxe-arg=bf16")
    p.add_argument("--torch-compile", action="store_true", help=argparse.SUPPRESS)  # the torch_compile peer's child
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--_child", choices=["ort", "torch"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a._child:
        res = child_ort(a) if a._child == "ort" else child_torch(a)
        print(json.dumps(res))
        return 0

    peers = [s for s in a.peers.split(",") if s]
    results = {}
    load_before = _loadavg()
    for peer in peers:
        if peer == "wxe":
            results["wxe"] = peer_wxe(a)
        elif peer == "ort":
            results["onnxruntime"] = peer_py("ort", a)
        elif peer == "torch":
            if not a.torch_model:
                continue
            results["pytorch"] = peer_py("torch", a)
        elif peer == "torch_compile":
            if not a.torch_model:
                continue
            results["torch.compile"] = peer_py("torch", a, compiled=True)
        else:
            p.error(f"unknown peer {peer}")
        name = list(results)[-1]
        if "error" in results[name]:
            print(f"{name}: {results[name]['error']}", file=sys.stderr)

    load_after = _loadavg()
    ref = results.get("onnxruntime", {}).get("median_ms")
    print(f"model {os.path.basename(a.model)}, input {os.path.basename(a.input)}, "
          f"threads {a.threads}, runs {a.runs} (+1 warm-up), {os.cpu_count()} CPUs, "
          f"1-min load average {load_before} before / {load_after} after")
    hdr = f"{'peer':<12} {'median ms':>10} {'min ms':>10} {'max ms':>10} {'peak RSS MB':>12} {'vs ORT':>7}"
    show_err = any("max_abs_err" in r for r in results.values())
    if show_err:
        hdr += f" {'max abs err':>12}"
    print(hdr)
    print("-" * len(hdr))
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<12} {'-':>10} {'-':>10} {'-':>10} {'-':>12} {'-':>7}  ({r['error']})")
            continue
        ratio = f"{r['median_ms'] / ref:.2f}x" if ref else "-"
        line = (f"{name:<12} {r['median_ms']:>10.2f} {r['min_ms']:>10.2f} {r['max_ms']:>10.2f} "
                f"{r['peak_rss_mb']:>12.1f} {ratio:>7}")
        if show_err:
            e = r.get("max_abs_err")
            line += f" {e:>12.3g}" if e is not None else f" {'-':>12}"
        print(line)
    for name, r in results.items():
        if "error" in r:
            continue
        extra = []
        if "rel_l2_err" in r:
            extra.append(f"relative L2 error {r['rel_l2_err']:.3g}")
        if "load_s" in r:
            extra.append(f"load {r['load_s']:.2f} s")
        if "base_rss_mb" in r:
            extra.append(f"RSS before model {r['base_rss_mb']:.0f} MB")
        if "version" in r:
            extra.append(f"version {r['version']}")
        extra += r.get("notes", [])
        if extra:
            print(f"  {name}: " + "; ".join(extra))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "runs": a.runs, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
