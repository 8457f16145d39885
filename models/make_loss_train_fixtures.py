#!/usr/bin/env python3
"""PyTorch/CREDIT reference: 5-step crossformer_tiny runs, one per CREDIT training loss.

What it makes (tests/data/train/losses/, ~2 KB of .npy + a ~20 KB JSON):

    <loss>_losses.npy     float64 (5,)  loss logged per optimizer step
                                        = (float64(loss_0) + float64(loss_1)) / 2
    <loss>_gradnorm.npy   float64 (5,)  total grad norm returned by clip_grad_norm_
                                        (before clipping), float32 widened
    runs.json             the settings, and per loss: the registry class, the micro-batch
                          losses, CREDIT's dynamic max_norm and the clip factor applied

for <loss> in mse, mae, msle, huber, logcosh, xtanh, xsigmoid (CREDIT's registry names), and
the whole-tensor runs (TENSOR_RUNS): mse_terms (VariableTotalLoss2D with use_spectral_loss and
use_power_loss, spectral_lambda_reg 0.1, spectral_wavenum_init 5), spectral (wavenum_init 5),
power (loss.type power: CREDIT cannot build it by training_loss), covmse (off_diagonal_scale
0.5), the last three unweighted (the plain criterion load_loss builds without weights);
mse_terms and power in float64 (FLOAT64_RUNS says why).

Everything except the loss and the clipping is models/make_train_fixtures.py's 20-step
run (imported, not copied: load_model, loss_weights, lr_at, the optimizer settings,
threads = 1), cut to 5 optimizer steps:

    model  crossformer_tiny from tests/data/crossformer_tiny_checkpoint.pt, train mode
    data   tests/data/train/series (x_0000..3, y_0000..3, channel_weights.npy), batch 1,
           micro-batch i = (2*s + j) % 4, no shuffling
    opt    AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, foreach=False)
    lr     linear-warmup-cosine of the 20-step run (warmup 5, total 20, min 1e-5):
           steps 0..4 are all warmup, lr = 0, 2e-4, 4e-4, 6e-4, 8e-4
    accum  2: (loss_j / 2).backward() for j = 0, 1, then clip, step, zero_grad

Loss: the criterion is CREDIT's own load_loss(conf) (credit/losses/__init__.py) with
use_latitude_weights and use_variable_weights, i.e. a real VariableTotalLoss2D whose
loss_fn = _instantiate_loss(conf, reduction="none") from the registry. The latitude
file is a temporary netCDF holding latitude = linspace(90, -90, 32), longitude 64; the
variable weights are channel_weights.npy (one variable per channel). It is called as
credit/trainers/trainer_gen2.py (~line 448) calls it:

    loss = criterion(y.float().to(y_pred.dtype), y_pred).mean()     # (target, pred)

VariableTotalLoss2D.forward(target, pred): L = loss_fn(target, pred) elementwise;
per channel c: mean over (B, T, H, W) of L[:, c] * wlat[h] * wvar[c]; loss = mean over c
of those means (equal to the all-element weighted mean up to float32 rounding).
Argument order matters for bits only: mse/mae/huber/msle are symmetric; logcosh, xtanh,
xsigmoid use e = target - pred (+ 1e-12, which in float32 changes e only where
|e| < ~1.5e-5: 2 of the 24576 elements of step 0 here); xsigmoid's
2e/(1+exp(-e)) - e is not bit-symmetric in e (swapping the arguments moves elements by
up to 1e-6).

Clipping: trainer.grad_max_norm = "dynamic" as trainer_gen2.py (~line 476) does it:

    global_norm = stack([g.norm(2) for g in grads]).square().sum().sqrt()
    clip_grad_norm_(model.parameters(), max_norm=global_norm)

clip_grad_norm_ computes its own total_norm (vector_norm of the per-tensor norms, which
it returns), takes float(max_norm) and multiplies every grad by
clamp(global_norm / (total_norm + 1e-6), max=1) in float32: a factor just below 1,
1 - 1e-6/norm to float32 rounding (runs.json "clip_factor"; the script asserts the
grads after clipping are bit-exactly grads_before * that factor). Never a real clip.

Made with torch 2.15.0+cu132 (run on CPU), miles-credit 2026.2.0, numpy 2.4.6,
xarray 2026.9.0 (netCDF4 1.7.5.1 for the temporary latitude file), torch threads 1.
Two runs write byte-identical files (--check reruns into a temp dir and compares).

Run from anywhere, with a Python that has torch + miles-credit (~1 min on one core):

    python models/make_loss_train_fixtures.py            # writes tests/data/train/losses
    python models/make_loss_train_fixtures.py --check    # + second run, compare bytes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import make_train_fixtures as mtf  # noqa: E402  (load_model, loss_weights, lr_at, settings)

MODEL = "crossformer_tiny"
STEPS = 5
LOSSES = ("mse", "mae", "msle", "huber", "logcosh", "xtanh", "xsigmoid")
# the whole-tensor losses and VariableTotalLoss2D's terms: name -> the loss section's changes
# (weighted: VariableTotalLoss2D as above; else the plain criterion load_loss builds without weights)
TENSOR_RUNS = {
    "mse_terms": ({"training_loss": "mse", "use_spectral_loss": True, "use_power_loss": True,
                   "spectral_lambda_reg": 0.1, "spectral_wavenum_init": 5}, True),
    "spectral": ({"training_loss": "spectral", "training_loss_parameters": {"wavenum_init": 5}}, False),
    "power": ({"type": "power", "args": {"wavenum_init": 5}}, False),
    "covmse": ({"training_loss": "covmse", "training_loss_parameters": {"off_diagonal_scale": 0.5}}, False),
}
# Runs with the model in float64 (the criterion as CREDIT runs it, float32): the power loss's
# gradient, through the model's float32 backward, moves CREDIT's own gradient norm by 1.2e-4 of
# the float64 model's at the first step (93.93526 vs 93.92413), and Adam carries that on; wxe's
# float32 backward gives 93.92409.
FLOAT64_RUNS = ("mse_terms", "power")
SERIES = os.path.join(REPO, "tests", "data", "train", "series")
OUT = os.path.join(REPO, "tests", "data", "train", "losses")


# --------------------------------------------------------------------------- data


def read_series(series):
    """xs, ys (float32 tensors) and the channel weights (float32 numpy) of the 20-step run."""
    import torch

    xs = [torch.from_numpy(np.load(os.path.join(series, f"x_{i:04d}.npy"))) for i in range(mtf.N_SAMPLES)]
    ys = [torch.from_numpy(np.load(os.path.join(series, f"y_{i:04d}.npy"))) for i in range(mtf.N_SAMPLES)]
    wvar = np.load(os.path.join(series, "channel_weights.npy"))
    return xs, ys, wvar


# --------------------------------------------------------------------------- CREDIT criterion


def write_lat_file(path, h, w):
    """netCDF with the regular grid CREDIT's latitude_weights(conf) reads."""
    import xarray as xr

    ds = xr.Dataset(coords={"latitude": np.linspace(90.0, -90.0, h),
                            "longitude": np.linspace(0.0, 360.0, w, endpoint=False)})
    ds.to_netcdf(path)


def credit_conf(loss, lat_file, wvar):
    """A legacy flat loss section that load_loss turns into VariableTotalLoss2D."""
    names = [f"c{i}" for i in range(len(wvar))]
    return {
        "data": {"variables": names, "surface_variables": [], "diagnostic_variables": []},
        "model": {"levels": 1},
        "loss": {
            "training_loss": loss,
            "use_latitude_weights": True,
            "latitude_weights": lat_file,
            "use_variable_weights": True,
            "variable_weights": {n: float(v) for n, v in zip(names, wvar)},
            "use_spectral_loss": False,
            "use_power_loss": False,
        },
    }


def load_criterion(loss, lat_file, wvar):
    from credit.losses import load_loss
    from credit.losses.gen_1.weighted_loss import VariableTotalLoss2D

    conf = credit_conf(loss, lat_file, wvar)
    weighted = True
    if loss in TENSOR_RUNS:
        changes, weighted = TENSOR_RUNS[loss]
        if not weighted:
            conf["loss"] = {"use_latitude_weights": False, "use_variable_weights": False}
        conf["loss"].update(changes)
    crit = load_loss(conf)  # as credit/applications/train_gen2.py
    assert isinstance(crit, VariableTotalLoss2D) == weighted, type(crit)
    return crit


def reference_loss(loss, target, pred, wlat, wvar):
    """Independent float64 formula of the weighted loss (cross-check of the semantics)."""
    t, q = target.double().numpy(), pred.double().numpy()
    e = t - q
    if loss == "mse":
        f = e * e
    elif loss == "mae":
        f = np.abs(e)
    elif loss == "msle":
        f = (np.log1p(np.abs(q)) - np.log1p(np.abs(t))) ** 2
    elif loss == "huber":
        f = np.where(np.abs(e) < 1.0, 0.5 * e * e, np.abs(e) - 0.5)
    elif loss == "logcosh":
        f = np.log(np.cosh(e))
    elif loss == "xtanh":
        f = e * np.tanh(e)
    elif loss == "xsigmoid":
        f = 2 * e / (1 + np.exp(-e)) - e
    else:
        raise ValueError(loss)
    f = np.asarray(f)
    c, h = f.shape[1], f.shape[-2]
    return float((f * wlat.double().numpy().reshape(1, 1, 1, h, 1)
                  * wvar.astype(np.float64).reshape(1, c, 1, 1, 1)).mean())


# --------------------------------------------------------------------------- run


def run(loss, xs, ys, wvar, lat_file, log):
    import torch

    crit = load_criterion(loss, lat_file, wvar)
    wlat, _ = mtf.loss_weights(ys[0].shape[-2])
    if getattr(crit, "lat_weights", None) is not None:
        assert torch.equal(crit.lat_weights.view(-1), wlat), "CREDIT latitude weights differ"

    model = mtf.load_model(MODEL)
    if loss in FLOAT64_RUNS:
        model = model.double()
        xs = [x.double() for x in xs]
    opt = torch.optim.AdamW(model.parameters(), lr=mtf.LR, betas=mtf.BETAS, eps=mtf.EPS,
                            weight_decay=mtf.WEIGHT_DECAY, foreach=False)
    r = {"losses": [], "microloss": [], "lr": [], "gradnorm": [], "global_norm": [], "clip_factor": []}
    for s in range(STEPS):
        ml = []
        for j in range(mtf.ACCUM):
            i = (mtf.ACCUM * s + j) % mtf.N_SAMPLES
            y_pred = model(xs[i])
            y = ys[i]
            if loss in FLOAT64_RUNS:  # the criterion in float32 as CREDIT runs it (its FFTs are float32 anyway)
                y_pred = y_pred.float()
            loss_t = crit(y.float().to(y_pred.dtype), y_pred).mean()  # trainer_gen2.py ~l. 448
            if s == 0 and j == 0 and loss in LOSSES:
                ref = reference_loss(loss, y, y_pred.detach(), wlat, wvar)
                assert abs(loss_t.item() - ref) <= 2e-6 * abs(ref), (loss, loss_t.item(), ref)
            (loss_t / mtf.ACCUM).backward()
            ml.append(float(loss_t.item()))

        # grad_max_norm: dynamic (trainer_gen2.py ~l. 476, single process, plain grads)
        grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        before = [g.clone() for g in grads]
        global_norm = torch.stack([g.norm(2) for g in grads]).square().sum().sqrt()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=global_norm)
        factor = torch.clamp(float(global_norm) / (total + 1e-6), max=1.0)  # what clip applied
        assert all(torch.equal(g, b * factor) for g, b in zip(grads, before)), "clip factor"

        lr = mtf.lr_at(s)  # the 20-step run's schedule
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad()

        r["microloss"].append(ml)
        r["losses"].append(sum(ml) / mtf.ACCUM)
        r["lr"].append(lr)
        r["gradnorm"].append(float(total.item()))
        r["global_norm"].append(float(global_norm.item()))
        r["clip_factor"].append(float(factor.item()))
        log(f"  {loss:8s} step {s}: loss {r['losses'][-1]:.9f}  lr {lr:.1e}  grad norm "
            f"{r['gradnorm'][-1]:.9f}  dynamic max_norm {r['global_norm'][-1]:.9f}  "
            f"factor 1 - {1.0 - r['clip_factor'][-1]:.4g}")
    return r


def settings(versions):
    return {
        "generator": "models/make_loss_train_fixtures.py",
        "versions": versions,
        "model": MODEL,
        "checkpoint": f"tests/data/{MODEL}_checkpoint.pt (model_state_dict, strict), train mode",
        "data": "tests/data/train/series",
        "samples": mtf.N_SAMPLES,
        "batch_size": 1,
        "sample_order": "micro-batch j of step s uses sample (accum*s + j) % samples",
        "steps": STEPS,
        "accum": mtf.ACCUM,
        "logged_loss": "(float64(loss_0) + float64(loss_1)) / accum; each loss_j / accum is backpropagated",
        "optimizer": {"name": "AdamW", "lr": mtf.LR, "betas": list(mtf.BETAS), "eps": mtf.EPS,
                      "weight_decay": mtf.WEIGHT_DECAY, "foreach": False},
        "lr_schedule": {"kind": "linear-warmup-cosine", "lr": mtf.LR, "min_lr": mtf.MIN_LR,
                        "warmup_steps": mtf.WARMUP, "total_steps": mtf.STEPS,
                        "note": "the 20-step run's schedule; steps 0..4 are all warmup",
                        "lr_per_step": [mtf.lr_at(s) for s in range(STEPS)]},
        "clipping": {"grad_max_norm": "dynamic",
                     "global_norm": "sqrt(sum_p ||g_p||_2^2) over params with a grad (float32)",
                     "applied": "g *= min(1, global_norm / (total_norm + 1e-6)), total_norm = "
                                "clip_grad_norm_'s own norm (returned; = <loss>_gradnorm.npy)"},
        "criterion": {
            "built_by": "credit.losses.load_loss(conf) -> VariableTotalLoss2D, loss_fn = "
                        "_instantiate_loss(conf, reduction='none')",
            "call": "criterion(target, pred).mean()  (trainer_gen2 argument order)",
            "reduction": "mean over channels c of mean over (B,T,H,W) of loss_fn(target, pred)[:, c] "
                         "* wlat[h] * wvar[c]",
            "wlat": "float32 cos(deg2rad(float32(linspace(90, -90, 32)))), divided by its mean",
            "wvar": "tests/data/train/series/channel_weights.npy",
        },
    }


CLASSES = {  # registry entry and the elementwise formula, e = target - pred
    "mse": ("torch.nn.MSELoss", "e^2"),
    "mae": ("torch.nn.L1Loss", "|e|"),
    "msle": ("credit.losses.msle.MSLELoss",
             "(log(|target| + 1) - log(|pred| + 1))^2 (forward(prediction, target) receives (target, pred))"),
    "huber": ("torch.nn.HuberLoss", "delta = 1: 0.5 e^2 if |e| < 1 else |e| - 0.5"),
    "logcosh": ("credit.losses.gen_1.logcosh.LogCoshLoss", "log(cosh(e + 1e-12))"),
    "xtanh": ("credit.losses.gen_1.xtanh.XTanhLoss", "d * tanh(d), d = e + 1e-12"),
    "xsigmoid": ("credit.losses.gen_1.xsigmoid.XSigmoidLoss", "2 d / (1 + exp(-d)) - d, d = e + 1e-12"),
}


def generate(out, threads, log):
    import importlib.metadata as md

    import torch

    torch.set_num_threads(threads)
    os.makedirs(out, exist_ok=True)
    xs, ys, wvar = read_series(SERIES)
    versions = {"torch": torch.__version__, "miles-credit": md.version("miles-credit"),
                "numpy": np.__version__, "threads": threads}
    meta = settings(versions)
    meta["runs"] = []
    with tempfile.TemporaryDirectory() as tmp:
        lat_file = os.path.join(tmp, "lat.nc")
        write_lat_file(lat_file, ys[0].shape[-2], ys[0].shape[-1])
        for loss in LOSSES + tuple(TENSOR_RUNS):
            r = run(loss, xs, ys, wvar, lat_file, log)
            np.save(os.path.join(out, f"{loss}_losses.npy"), np.array(r["losses"], dtype=np.float64))
            np.save(os.path.join(out, f"{loss}_gradnorm.npy"), np.array(r["gradnorm"], dtype=np.float64))
            cls, formula = CLASSES[loss] if loss in CLASSES else (None, None)
            meta["runs"].append({
                "loss": loss, "registry_class": cls, "constructor": {"reduction": "none"},
                "elementwise": formula, "loss_section": TENSOR_RUNS.get(loss, (None,))[0],
                "losses_file": f"{loss}_losses.npy", "gradnorm_file": f"{loss}_gradnorm.npy",
                "final_loss": r["losses"][-1], "microloss": r["microloss"],
                "global_norm": r["global_norm"], "clip_factor": r["clip_factor"],
            })
    with open(os.path.join(out, "runs.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    return meta


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: deterministic)")
    p.add_argument("--check", action="store_true", help="rerun into a temp dir; require identical bytes")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr)

    meta = generate(a.out, a.threads, log)

    # The mse run is the 20-step run's first 5 steps up to the loss reduction's rounding and
    # the dynamic clip's ~1e-6 scaling (step 0 has lr 0, so step 1 sees the same weights).
    ref = np.load(os.path.join(REPO, "tests", "data", "train", f"{MODEL}_train{mtf.STEPS}_losses.npy"))[:STEPS]
    mse = np.load(os.path.join(a.out, "mse_losses.npy"))
    rel = float(np.max(np.abs(mse - ref) / ref))
    print(f"mse vs {MODEL}_train{mtf.STEPS}_losses[:{STEPS}]: max relative difference {rel:.3g}")
    assert rel < 1e-6, rel

    digest = mtf.tree_digest(a.out)
    print(f"files in {os.path.relpath(a.out, REPO)}:")
    for f, (n, _) in digest.items():
        print(f"  {f:<24} {n:>7,} B")
    for r in meta["runs"]:
        print(f"  {r['loss']:<9} final loss {r['final_loss']!r}")

    if a.check:
        return mtf.check_deterministic(digest, lambda tmp: generate(tmp, a.threads, lambda m: None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
