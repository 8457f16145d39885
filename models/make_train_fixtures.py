#!/usr/bin/env python3
"""PyTorch ground truth for wxe fine-tuning (issue 8): golden gradients and a 20-step run.

wxe's training code implements exactly the semantics written below; this script is the
oracle. It uses NCAR's CREDIT model code (PyPI `miles-credit`, the venv of
models/export_credit.py) and writes small fixtures into tests/data/train/.

Run (from the repository root; ~1.5 min on one core, ~3.5 min with --check):

    $WXE_PYTHON models/make_train_fixtures.py            # writes tests/data/train
    $WXE_PYTHON models/make_train_fixtures.py --check    # + rerun into a temp dir,
                                                         #   compare bytes
    $WXE_PYTHON models/make_train_fixtures.py --traj-models crossformer_tiny,wxformer_tiny

Made with torch 2.15.0 (CPU), miles-credit 2026.2.0, safetensors 0.8.0, numpy 2.4.6
(torch-harmonics 0.9.3: the 0.9.1 wheel does not load under torch 2.15). The script runs
with torch.set_num_threads(1) (--threads) so that every reduction has one fixed order:
two runs write byte-identical files (checked with --check; the safetensors metadata is
one sorted-JSON key because safetensors orders several keys differently per process).
safetensors metadata: {"info": JSON}; the *_grads files list the parameters without a
gradient under "no_grad" and the loss under "loss".

Models
------
The tiny CREDIT models of shared/fixtures/README.md (config TINY_KW in
models/export_credit.py; input (1,7,1,32,64), output (1,6,1,32,64)):

    crossformer_tiny  credit.models.crossformer.CrossFormer
    wxformer_tiny     credit.models.wxformer.crossformer.CrossFormer

weights = tests/data/<model>_checkpoint.pt["model_state_dict"] loaded with strict=True
(legacy layout: spectral norm as weight_orig / weight_u / weight_v). All dropout rates are
0 (asserted), so train mode differs from eval mode only by spectral norm.

Spectral norm (torch.nn.utils.spectral_norm, n_power_iterations=1, eps=1e-12; 100 layers
in crossformer_tiny of which the 4 ConvTranspose2d use dim=1, 104 layers in wxformer_tiny,
all dim=0). Every forward in train mode does, per SN layer, with
W = weight_orig permuted so that `dim` comes first and reshaped to (rows, -1):

    v <- normalize(W^T u);  u <- normalize(W v)       (in place, no gradient;
                                                       normalize(a) = a / max(||a||_2, eps))
    sigma = u . (W v)                                 (with the NEW u, v as constants)
    weight = weight_orig / sigma                      (gradient flows into weight_orig
                                                       through both W and sigma)

Parameters without a gradient: cube_embedding.{proj,norm}.{weight,bias} are not used by
forward() (patch size 1). Their .grad stays None, so clip_grad_norm_ ignores them and
AdamW skips them entirely (no weight decay either): they keep their checkpoint values.
They are absent from the *_grads.safetensors files.

Loss (CREDIT's latitude-weighted MSE with variable weights)
------------------------------------------------------------
    loss = mean over all B*C*T*H*W elements of (pred - target)^2 * wlat[h] * wvar[c]

h = latitude row (dim -2), c = channel (dim 1). wlat is computed in float32 as CREDIT's
latitude_weights() does: lat = float32(numpy.linspace(90, -90, H)),
wlat = cos(deg2rad(lat)), wlat = wlat / mean(wlat) (so cos(+-90 deg) is ~-4.4e-8, not 0).
wvar = channel_weights.npy = [0.5, 0.75, 1.0, 1.25, 1.5, 1.0] (float32). wxe reads the
regular lat grid above when a data directory has no lat.npy (none is written).
The script checks that this equals CREDIT's own VariableTotalLoss2D.forward (mean over
channels of per-channel means) to float rounding.

Part 1: golden gradients (per model, prefix <m>)
------------------------------------------------
    model.train(); torch.manual_seed(0); x = randn(1,7,1,32,64)
    torch.manual_seed(1); target = randn(1,6,1,32,64)
    loss = weighted_mse(model(x), target); loss.backward()     (one forward, one SN step)

    <m>_grad_x.npy, <m>_grad_target.npy   float32 x and target (x is byte-identical
                                          to tests/data/crossformer_tiny_x.npy)
    <m>_grad_loss.npy                     float64 (1,) loss
    <m>_grads.safetensors                 float32 .grad of every parameter with a gradient,
                                          by state-dict name (SN layers: '...weight_orig')
    <m>_grad_state.safetensors            the state entries that forward changed: every
                                          weight_u / weight_v AFTER the forward (one power
                                          iteration from the checkpoint's u, v). All other
                                          state entries (parameters) equal the checkpoint
                                          exactly (asserted); --full-grad-state writes the
                                          whole state dict instead (+9 MB for both models).

    loss: crossformer_tiny 1.2171283960342407, wxformer_tiny 1.1507478952407837
    (float64 PyTorch: 1.217128296729287 and 1.1507479396490632)

Gradients that are zero in exact arithmetic. Some tensors get only float32 rounding noise
(|g| ~1e-10..1e-8 against a total norm ~1.2), so a per-tensor relative L2 against these
files is meaningless for them; compare them with an absolute tolerance:
  - every '*.dpb.layers.9.bias' (the dynamic-position-bias MLP's output bias adds the same
    constant to every attention logit; softmax cancels it), 10 per model;
  - the whole DPB MLP of the window-1 global attention 'layers.3.1.layers.0.2.dpb.*'
    (softmax over one key; exactly 0 in float32 too);
  - 'up_block3.b.0.bias', 'up_block3.b.3.bias' (conv bias followed by GroupNorm(16, 16):
    one channel per group, so the normalisation removes the bias).
Every other tensor: float32 PyTorch vs float64 PyTorch relative L2 <= 2.5e-5 (median
2e-6); float32 at 1 vs 2 threads <= 1.5e-5 (worst: the small DPB MLP weights).

Part 2: 20-step trajectory (crossformer_tiny; wxformer_tiny with --traj-models)
-------------------------------------------------------------------------------
Data: series/x_0000.npy..x_0003.npy (1,7,1,32,64), series/y_0000.npy..y_0003.npy
(1,6,1,32,64), float32, torch.manual_seed(100 + i) / (200 + i); randn; and
series/channel_weights.npy. The model starts from the checkpoint, model.train().

    opt = AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                weight_decay=0.01, foreach=False)
    for s in 0..19:                                   (optimizer steps; accumulation 2)
        for j in 0, 1:
            i = (2*s + j) % 4                          (batch 1, no shuffling)
            loss_j = weighted_mse(model(x_i), y_i)    (one SN power iteration per forward)
            (loss_j / 2).backward()                   (gradients accumulate)
        logged loss[s] = (float64(loss_0) + float64(loss_1)) / 2
        gradnorm[s] = clip_grad_norm_(model.parameters(), 1.0)   (norm BEFORE clipping)
              total = || (||g_p||_2 for every p with a grad) ||_2   (float32)
              every grad *= min(1, 1.0 / (total + 1e-6))
        lr[s] = 1e-3 * s / 5                                   if s < 5  (0 at s = 0)
              = 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + cos(pi * p)),  p = min(1, (s-5) / max(1, 20-5))
        param_group['lr'] = lr[s]; opt.step(); opt.zero_grad()  (grads back to None)

AdamW (torch, single-tensor path), per parameter with a grad, t = number of opt.step()
calls so far including this one (t = 1 at s = 0, even though lr is 0 there: the first
step still updates m, v and t):
    p *= 1 - lr * wd
    m = m + (g - m) * (1 - beta1)            (lerp)
    v = v * beta2 + (1 - beta2) * g * g
    p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
(scalars in double, tensor arithmetic in float32).

    <m>_train20_losses.npy      float64 (20,)  logged loss per optimizer step
    <m>_train20_microloss.npy   float64 (20,2) loss_0, loss_1 per step
    <m>_train20_lr.npy          float64 (20,)  lr used by step s
    <m>_train20_gradnorm.npy    float64 (20,)  total grad norm before clipping
    <m>_train20_final.safetensors   state dict after the 20 steps (parameters and the SN
                                    buffers u, v as left by the 40th forward), float32

    crossformer_tiny losses, steps 0..19:
      1.216833949 1.205637336 1.171570897 1.133975327 1.089289010 1.056799531 1.013927639
      0.993389934 0.961362273 0.951365620 0.926614136 0.922356248 0.902168095 0.901922017
      0.885778874 0.888411701 0.875738829 0.880773783 0.870856375 0.877761960
    grad norms 0.889 (step 0) falling to 0.244 (step 19): clipping at 1.0 never triggers.

Precision of this reference: the float64 run of the same 20 steps gives losses within
7e-8 relative; final parameters, float32 vs float64 (or 1 vs 2 threads), relative L2 over
all parameters together 3.6e-5 (4.5e-5), but per tensor up to 1.5e-2: Adam normalises the
rounding-noise gradients of the zero-gradient tensors above (and of the small DPB
'layers.7.bias') into real steps, so those tensors drift by ~lr per step in a direction
set by rounding. Without up_block3.b.{0,3}.bias and the '.dpb.' tensors the global
relative L2 is 1e-7 (1 vs 2 threads) to 4e-7 (vs float64). Compare final parameters
globally, or better leave those tensors out.

Part 2b: the same crossformer_tiny run with clip_grad_norm_(..., 0.3), which scales the
gradients of steps 0..9 (norms 0.89..0.31 > 0.3): only
    crossformer_tiny_train20_clip0.3_{losses,microloss,lr,gradnorm}.npy  (no final state)

Also copied: shared/fixtures/credit/wxformer_tiny_opset17.onnx -> tests/data/ (the
spectral-norm-traced export; crossformer_tiny_opset17.onnx is already there).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from export_credit import INPUT_SHAPE, TINY_KW, model_class  # noqa: E402

MODELS = ("crossformer_tiny", "wxformer_tiny")
OUTPUT_SHAPE = (1, 6, 1, 32, 64)
CHANNEL_WEIGHTS = np.array([0.5, 0.75, 1.0, 1.25, 1.5, 1.0], dtype=np.float32)

# Trajectory settings (Part 2).
N_SAMPLES = 4
STEPS = 20
ACCUM = 2
LR, WARMUP, MIN_LR = 1e-3, 5, 1e-5
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.01
GRAD_MAX_NORM = 1.0
# Extra run whose clipping is active (see Part 2b in the docstring).
TRAJ_CLIP_MODEL, TRAJ_CLIP_NORM, TRAJ_CLIP_TAG = "crossformer_tiny", 0.3, "_clip0.3"

# the exported tiny WXFormer (the same file as the shared fixtures' wxformer_tiny_opset17.onnx)
ONNX_SRC = os.path.join(REPO, "tests", "data", "wxformer_tiny_opset17.onnx")


# --------------------------------------------------------------------------- pieces


def load_model(name):
    """CREDIT model with the checkpoint's weights (strict), in train mode."""
    import torch

    model = model_class(name)(**TINY_KW)
    ck = torch.load(os.path.join(REPO, "tests", "data", f"{name}_checkpoint.pt"),
                    map_location="cpu", weights_only=False)
    model.load_state_dict(ck["model_state_dict"], strict=True)
    for mod_name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Dropout):
            assert mod.p == 0.0, f"{name}: dropout {mod_name} has p={mod.p}"
    model.train()
    return model


def loss_weights(h):
    """(wlat (H,), wvar (C,)) float32, as CREDIT's latitude_weights() computes wlat."""
    import torch

    lat = torch.tensor(np.linspace(90.0, -90.0, h), dtype=torch.float32)
    wlat = torch.cos(torch.deg2rad(lat))
    wlat = wlat / wlat.mean()
    return wlat, torch.from_numpy(CHANNEL_WEIGHTS.copy())


def weighted_mse(pred, target, wlat, wvar):
    """mean((pred - target)^2 * wlat[h] * wvar[c]) over all elements."""
    c, h = pred.shape[1], pred.shape[-2]
    se = (pred - target) ** 2
    return (se * wlat.view(1, 1, 1, h, 1) * wvar.view(1, c, 1, 1, 1)).mean()


def credit_loss(pred, target, wlat, wvar):
    """The same loss through CREDIT's VariableTotalLoss2D.forward (cross-check)."""
    import torch
    from credit.losses.gen_1.weighted_loss import VariableTotalLoss2D

    crit = VariableTotalLoss2D.__new__(VariableTotalLoss2D)
    torch.nn.Module.__init__(crit)
    crit.loss_fn = torch.nn.MSELoss(reduction="none")
    crit.lat_weights = wlat.view(1, -1, 1)  # latitude_weights(conf)[:, 10].unsqueeze(0).unsqueeze(-1)
    crit.var_weights = torch.from_numpy(wvar.numpy().astype(np.float64))  # CREDIT keeps numpy float64
    crit.vars = [f"c{i}" for i in range(pred.shape[1])]
    crit.use_power_loss = False
    crit.use_spectral_loss = False
    crit.validation = False
    return crit(target, pred)


def lr_at(s, total=STEPS):
    """linear-warmup-cosine (CREDIT's LinearWarmupCosineScheduler.get_lr at step s)."""
    if s < WARMUP:
        return LR * s / max(1, WARMUP)
    p = min(1.0, (s - WARMUP) / max(1, total - WARMUP))
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * p))


def randn(seed, shape):
    import torch

    torch.manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float32)


def save_st(tensors, path, metadata=None):
    """safetensors file; metadata as ONE key 'info' holding sorted JSON.

    safetensors keeps metadata in a Rust HashMap whose iteration order changes from
    process to process, so several metadata keys would make the header bytes vary.
    """
    import json

    from safetensors.torch import save_file

    meta = {"info": json.dumps(metadata, sort_keys=True)} if metadata else None
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, path, metadata=meta)


def sn_buffer_names(model):
    pnames = {n for n, _ in model.named_parameters()}
    return [k for k in model.state_dict() if k not in pnames]


# --------------------------------------------------------------------------- Part 1


def golden_gradients(name, out, full_state, log):
    import torch

    model = load_model(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = randn(0, INPUT_SHAPE)
    target = randn(1, OUTPUT_SHAPE)
    wlat, wvar = loss_weights(OUTPUT_SHAPE[-2])

    pred = model(x)
    loss = weighted_mse(pred, target, wlat, wvar)
    ref = credit_loss(pred.detach(), target, wlat, wvar)
    assert abs(ref.item() - loss.item()) <= 1e-6 * abs(loss.item()), (ref.item(), loss.item())
    loss.backward()

    grads, no_grad = {}, []
    for pname, p in model.named_parameters():
        if p.grad is None:
            no_grad.append(pname)
        else:
            grads[pname] = p.grad
    state = model.state_dict()
    bufs = sn_buffer_names(model)
    changed = [k for k in state if not torch.equal(state[k], before[k])]
    assert set(changed) <= set(bufs), f"forward changed non-buffer state: {set(changed) - set(bufs)}"
    keep = state if full_state else {k: state[k] for k in bufs}

    np.save(os.path.join(out, f"{name}_grad_x.npy"), x.numpy())
    np.save(os.path.join(out, f"{name}_grad_target.npy"), target.numpy())
    np.save(os.path.join(out, f"{name}_grad_loss.npy"), np.array([loss.item()], dtype=np.float64))
    meta = {"model": name, "loss": repr(loss.item()), "no_grad": ",".join(no_grad)}
    save_st(grads, os.path.join(out, f"{name}_grads.safetensors"), meta)
    save_st(keep, os.path.join(out, f"{name}_grad_state.safetensors"),
            {"model": name, "content": "full state dict" if full_state else "SN buffers u, v only"})
    gnorm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    log(f"{name}: loss {loss.item()!r} (CREDIT VariableTotalLoss2D {ref.item()!r}); "
        f"{len(grads)} grads, total norm {gnorm.item():.6g}; no grad: {no_grad}; "
        f"{len(changed)}/{len(bufs)} SN buffers changed by the forward")
    return loss.item()


# --------------------------------------------------------------------------- Part 2


def write_series(out):
    d = os.path.join(out, "series")
    os.makedirs(d, exist_ok=True)
    for i in range(N_SAMPLES):
        np.save(os.path.join(d, f"x_{i:04d}.npy"), randn(100 + i, INPUT_SHAPE).numpy())
        np.save(os.path.join(d, f"y_{i:04d}.npy"), randn(200 + i, OUTPUT_SHAPE).numpy())
    np.save(os.path.join(d, "channel_weights.npy"), CHANNEL_WEIGHTS)
    return d


def trajectory(name, out, series, log, max_norm=GRAD_MAX_NORM, tag="", save_final=True):
    import torch

    xs = [torch.from_numpy(np.load(os.path.join(series, f"x_{i:04d}.npy"))) for i in range(N_SAMPLES)]
    ys = [torch.from_numpy(np.load(os.path.join(series, f"y_{i:04d}.npy"))) for i in range(N_SAMPLES)]
    wvar = torch.from_numpy(np.load(os.path.join(series, "channel_weights.npy")))
    wlat, _ = loss_weights(OUTPUT_SHAPE[-2])

    model = load_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY, foreach=False)
    losses, micro, lrs, norms = [], [], [], []
    for s in range(STEPS):
        ml = []
        for j in range(ACCUM):
            i = (ACCUM * s + j) % N_SAMPLES
            loss = weighted_mse(model(xs[i]), ys[i], wlat, wvar)
            (loss / ACCUM).backward()
            ml.append(float(loss.item()))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad()
        micro.append(ml)
        losses.append(sum(ml) / ACCUM)
        lrs.append(lr)
        norms.append(float(norm.item()))
        log(f"  {name}{tag} step {s:2d}: loss {losses[-1]:.9f}  lr {lr:.6e}  grad norm {norms[-1]:.6f}"
            + ("  (clipped)" if norms[-1] > max_norm else ""))
    pre = os.path.join(out, f"{name}_train{STEPS}{tag}")
    np.save(pre + "_losses.npy", np.array(losses, dtype=np.float64))
    np.save(pre + "_microloss.npy", np.array(micro, dtype=np.float64))
    np.save(pre + "_lr.npy", np.array(lrs, dtype=np.float64))
    np.save(pre + "_gradnorm.npy", np.array(norms, dtype=np.float64))
    if save_final:
        save_st(model.state_dict(), pre + "_final.safetensors", {"model": name, "steps": str(STEPS)})
    return losses


# --------------------------------------------------------------------------- main


def generate(out, traj_models, full_state, threads, log):
    import torch

    torch.set_num_threads(threads)
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "channel_weights.npy"), CHANNEL_WEIGHTS)
    res = {}
    for name in MODELS:
        res[f"{name} grad loss"] = golden_gradients(name, out, full_state, log)
    series = write_series(out)
    for name in traj_models:
        res[f"{name} train losses"] = trajectory(name, out, series, log)
    # Same run with clipping that bites (max norm 0.3 < the first 10 steps' norms);
    # losses, lr and norms only (the clipping at 1.0 above never triggers).
    res[f"{TRAJ_CLIP_MODEL}{TRAJ_CLIP_TAG} train losses"] = trajectory(
        TRAJ_CLIP_MODEL, out, series, log, max_norm=TRAJ_CLIP_NORM, tag=TRAJ_CLIP_TAG, save_final=False)
    return res


def tree_digest(root):
    out = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (os.path.getsize(p), hashlib.sha256(fh.read()).hexdigest())
    return out


def check_deterministic(digest, regenerate):
    """regenerate(dir) writes the files again into dir: 0 when they equal `digest` byte for byte."""
    with tempfile.TemporaryDirectory() as tmp:
        regenerate(tmp)
        other = tree_digest(tmp)
    diff = sorted(f for f in set(digest) | set(other) if digest.get(f) != other.get(f))
    if diff:
        print(f"NOT deterministic: {diff}")
        return 1
    print(f"deterministic: a second run wrote {len(other)} byte-identical files")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "tests", "data", "train"))
    p.add_argument("--traj-models", default="crossformer_tiny",
                   help="comma-separated models for the 20-step trajectory (default crossformer_tiny; "
                   "wxformer_tiny adds 5.6 MB)")
    p.add_argument("--full-grad-state", action="store_true",
                   help="write the whole state dict into *_grad_state.safetensors, not only u, v")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: deterministic)")
    p.add_argument("--check", action="store_true",
                   help="afterwards regenerate into a temp dir and require byte-identical files")
    p.add_argument("--onnx-src", default=ONNX_SRC,
                   help="wxformer_tiny SN-traced ONNX to copy into tests/data ('' to skip)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)

    import torch

    traj = [m for m in a.traj_models.split(",") if m]
    for m in traj:
        if m not in MODELS:
            p.error(f"unknown model {m}")

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr)

    log(f"torch {torch.__version__}, threads {a.threads}")
    res = generate(a.out, traj, a.full_grad_state, a.threads, log)

    if a.onnx_src and os.path.exists(a.onnx_src):
        dst = os.path.join(REPO, "tests", "data", os.path.basename(a.onnx_src))
        shutil.copyfile(a.onnx_src, dst)
        log(f"copied {a.onnx_src} -> {os.path.relpath(dst, REPO)}")

    print(f"\nfiles in {os.path.relpath(a.out, REPO)}:")
    digest = tree_digest(a.out)
    for f in sorted(digest):
        print(f"  {f:<48} {digest[f][0]:>10,} B")
    print(f"  total {sum(v[0] for v in digest.values()):,} B")
    for k, v in res.items():
        if isinstance(v, list):
            print(f"{k}: first {v[0]:.10g}, last {v[-1]:.10g}, min {min(v):.10g}")
        else:
            print(f"{k}: {v!r}")

    if a.check:
        return check_deterministic(digest, lambda tmp: generate(tmp, traj, a.full_grad_state, a.threads, lambda m: None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
