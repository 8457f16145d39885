#!/usr/bin/env python3
"""Golden references for wxe's bridgescaler quantile scaler (data/quantile_scaler.h):
tests/data/quantile/.

CREDIT fits it in `credit preprocess` (credit/applications/preprocess.py): a
`bridgescaler_transform` preblock with `scaler_type: "quantile"` (a DQuantileScalerTensor
template, built from `scaler_params`) calls fit_scaler_batch on each batch, the per-batch
fits are merged with `+` (t-digest merge, combine_scaler_dicts) and written with
bridgescaler's save_scaler_dict as {data_type: {source: {var_key: "<scaler JSON text>"}}}.
This script does exactly that, through CREDIT's own classes, on two small synthetic batches,
then runs CREDIT's blocks over probe values: the preblock (method "transform", and
"inverse_transform" for the input side) and the postblock (inverse_transform of the target
side). Nothing is re-derived here.

Variables (tensors (B, C, T, H, W) = (2, C, 1, 8, 16) float32 per batch, as CREDIT's gen2
dataset gives them; channels_last: False, so C, the level, is the scaler's channel):
  input:  era5/prognostic/3d/T (2 levels), era5/prognostic/2d/SP, era5/static/2d/LSM (0/1)
  target: era5/prognostic/3d/T, era5/prognostic/2d/SP, era5/diagnostic/2d/tp (precipitation:
          60 % zeros, the rest exponential; many centroids share the mean 0)

Files (one fitted scaler file per case, the others are per case and side):
  scaler_quantile.json           distribution uniform (CREDIT's default), compression 100
  scaler_quantile_normal.json    target only, distribution normal, compression 40
  scaler_quantile_logistic.json  target only, distribution logistic, compression 40
  scaler_quantile_fast.json      target only, normal, fast_transform (PCHIP knots), n_knots 64
  scaler_quantile_fast_saved.json  the same scaler written again after a transform: it holds
                                 the knots (knots_x_, knots_z_, knots_m_, knots_minv_)
  <case>_<side>_x.npy    (channels, M) float32 probes: data, centroid means, midpoints, the
                         fitted min/max, values outside them, +-inf, nan
  <case>_<side>_fwd.npy  CREDIT's transform of x
  <case>_<side>_z.npy    (channels, M) float32 probes for the inverse (and the fwd values)
  <case>_<side>_q.npy    torch's distribution CDF of z (ndtr / sigmoid / z itself), the
                         intermediate bridgescaler hands to the digest's quantile function
  <case>_<side>_inv.npy  CREDIT's inverse_transform of z
  uniform_target_{x,fwd,z,inv}64.npy  the same through bridgescaler on float64 tensors
  fast_knots_{x,z,m,minv}.npy  the knots bridgescaler built (float64)
  manifest.json          cases: file, sides, variables in channel order with channel counts

Usage (any python with torch, bridgescaler 0.8.6 and miles-credit 2026.2; writes next to
itself): python models/make_quantile_fixture.py
"""
import json
import os
import tempfile
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "quantile"))

warnings.filterwarnings("ignore")
M = 48  # probes per channel

INPUT_VARS = [("era5/prognostic/3d/T", 2), ("era5/prognostic/2d/SP", 1), ("era5/static/2d/LSM", 1)]
TARGET_VARS = [("era5/prognostic/3d/T", 2), ("era5/prognostic/2d/SP", 1), ("era5/diagnostic/2d/tp", 1)]


def synth(rng, key, c):
    shape = (2, c, 1, 8, 16)
    name = key.rsplit("/", 1)[1]
    if name == "T":
        lev = np.array([250.0, 285.0])[:c].reshape(1, c, 1, 1, 1)
        return (lev + rng.normal(0, 8, shape) + rng.gamma(2.0, 3.0, shape)).astype(np.float32)
    if name == "SP":
        return rng.normal(98000, 1500, shape).astype(np.float32)
    if name == "LSM":
        return (rng.uniform(size=shape) < 0.3).astype(np.float32)
    if name == "tp":
        wet = rng.uniform(size=shape) >= 0.6
        return np.where(wet, rng.exponential(2e-3, shape), 0.0).astype(np.float32)
    raise ValueError(key)


def batch_of(rng, sides):
    b = {}
    for side, vars_ in sides.items():
        b[side] = {"era5": {k: torch.from_numpy(synth(rng, k, c)) for k, c in vars_}}
    return b


def fit_and_save(path, sides, scaler_params, seed):
    """credit preprocess: one fit per batch (fit_scaler_batch), merged with `+`, saved."""
    from bridgescaler import save_scaler_dict
    from credit.preblock.scaler import BridgeScalerTransform, combine_scaler_dicts

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        block = BridgeScalerTransform(
            scaler_path=os.path.join(tmp, "scaler.json"),
            variables=[],
            method="transform",
            scaler_type="quantile",
            scaler_params=dict(scaler_params),
        )
        for _ in range(2):
            block.fit_scaler_batch(batch_of(rng, sides))
        combined = combine_scaler_dicts([block.scaler])
    save_scaler_dict(combined, path)
    return combined


def x_probes(rng, sc, ch, data):
    """M float32 values for one channel: the fitted range, centroids, between and outside."""
    means = sc.centroids_[ch][:, 0]
    lo, hi = float(sc.min_[ch]), float(sc.max_[ch])
    span = max(hi - lo, 1.0)
    v = [lo, hi, lo - 0.1 * span, hi + 0.1 * span, -np.inf, np.inf, np.nan]
    v += list(means[:3]) + list(means[-3:]) + [means[len(means) // 2]]
    mid = 0.5 * (means[1:] + means[:-1])
    v += list(mid[:2]) + list(mid[-2:]) + [mid[len(mid) // 3]]
    v += [np.nextafter(np.float32(means[0]), np.float32(np.inf)), np.nextafter(np.float32(hi), np.float32(-np.inf))]
    v += [0.0, 1e-9, -1e-6]
    v += list(rng.choice(data.ravel(), 10))
    v += list(rng.uniform(lo, hi, M - len(v)))
    return np.array(v[:M], dtype=np.float32)


def z_probes(rng, dist, fwd_row):
    if dist == "uniform":
        v = [0.0, 1.0, -0.1, 1.1, 1e-7, 0.9999999, 0.5, 1e-9, np.nan, np.inf, -np.inf]
        v += list(rng.uniform(0, 1, 13))
    elif dist == "normal":
        v = [0.0, -5.2, 5.2, -7.0, 7.0, -4.0, 4.0, -2.5, 2.5, np.nan, np.inf, -np.inf]
        v += list(rng.normal(0, 1.5, 12))
    else:
        v = [0.0, -17.0, 17.0, -25.0, 25.0, -8.0, 8.0, np.nan, np.inf, -np.inf]
        v += list(rng.logistic(0, 2.5, 14))
    fin = fwd_row[np.isfinite(fwd_row)]
    v += list(fin[: M - len(v)])
    v += list(rng.uniform(-1, 1, M - len(v)))
    return np.array(v[:M], dtype=np.float32)


def dist_cdf(dist, z):
    t = torch.from_numpy(z)
    if dist == "normal":
        return torch.special.ndtr(t).numpy()
    if dist == "logistic":
        return torch.sigmoid(t).numpy()
    return z.copy()


def stack(d, vars_):
    """{key: (1, C, 1, 1, M)} -> (sum C, M)"""
    return np.concatenate([d[k].numpy().reshape(c, M) for k, c in vars_], axis=0)


def unstack(a, vars_):
    out, o = {}, 0
    for k, c in vars_:
        out[k] = torch.from_numpy(np.ascontiguousarray(a[o : o + c]).reshape(1, c, 1, 1, M))
        o += c
    return out


def save_npy(name, a):
    np.save(os.path.join(OUT, name), np.ascontiguousarray(a))


def run_case(case, fname, sides, scaler_params, seed, manifest):
    from credit.postblock.scaler import BridgeScalerTransform as Post
    from credit.preblock.scaler import BridgeScalerTransform as Pre

    path = os.path.join(OUT, fname)
    combined = fit_and_save(path, sides, scaler_params, seed)
    dist = scaler_params.get("distribution", "uniform")
    rng = np.random.default_rng(seed + 100)
    data_rng = np.random.default_rng(seed)
    data = batch_of(data_rng, sides)  # the first fitted batch again, to draw probes from
    entry = {"file": fname, "distribution": dist, "fast_transform": bool(scaler_params.get("fast_transform", False)),
             "sides": {}}
    pre = Pre(scaler_path=path, variables=[], method="transform")
    pre_inv = Pre(scaler_path=path, variables=[], method="inverse_transform")
    post = Post(scaler_path=path, variables=[])
    xs = {}
    for side, vars_ in sides.items():
        rows = []
        for k, c in vars_:
            sc = combined[side]["era5"][k]
            for ch in range(c):
                rows.append(x_probes(rng, sc, ch, data[side]["era5"][k][:, ch].numpy()))
        xs[side] = np.stack(rows)
    batch = {side: {"era5": unstack(xs[side], vars_)} for side, vars_ in sides.items()}
    with torch.no_grad():
        fwd_b = pre(batch)
    for side, vars_ in sides.items():
        fwd = stack(fwd_b[side]["era5"], vars_)
        z = np.stack([z_probes(rng, dist, fwd[i]) for i in range(fwd.shape[0])])
        with torch.no_grad():
            if side == "target":
                inv = stack(post({"y_processed": {"era5": unstack(z, vars_)}})["y_processed"]["era5"], vars_)
            else:
                inv = stack(pre_inv({"input": {"era5": unstack(z, vars_)}})["input"]["era5"], vars_)
        p = f"{case}_{side}"
        save_npy(p + "_x.npy", xs[side])
        save_npy(p + "_fwd.npy", fwd)
        save_npy(p + "_z.npy", z)
        save_npy(p + "_q.npy", dist_cdf(dist, z))
        save_npy(p + "_inv.npy", inv)
        entry["sides"][side] = [{"key": k, "channels": c} for k, c in vars_]
    manifest[case] = entry
    return pre, post


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {}
    base = {"channels_last": False}
    run_case("uniform", "scaler_quantile.json", {"input": INPUT_VARS, "target": TARGET_VARS},
             dict(base, compression=100), 11, manifest)
    tgt = {"target": TARGET_VARS}
    run_case("normal", "scaler_quantile_normal.json", tgt, dict(base, compression=40, distribution="normal"), 12,
             manifest)
    run_case("logistic", "scaler_quantile_logistic.json", tgt,
             dict(base, compression=40, distribution="logistic"), 13, manifest)
    pre, post = run_case("fast", "scaler_quantile_fast.json", tgt,
                         dict(base, compression=40, distribution="normal", fast_transform=True, n_knots=64), 14,
                         manifest)

    # float64 tensors straight through bridgescaler (CREDIT's blocks only ever see float32)
    from bridgescaler import load_scaler_dict, save_scaler_dict

    sd = load_scaler_dict(os.path.join(OUT, "scaler_quantile.json"))["target"]["era5"]
    x = np.load(os.path.join(OUT, "uniform_target_x.npy")).astype(np.float64)
    z = np.load(os.path.join(OUT, "uniform_target_z.npy")).astype(np.float64)
    x[:, -1] += 1e-9  # values float32 cannot hold
    z[:, -1] = np.linspace(0.01, 0.99, z.shape[0])
    fwd, inv, o = [], [], 0
    for k, c in TARGET_VARS:
        with torch.no_grad():
            fwd.append(sd[k].transform(torch.from_numpy(x[o : o + c].reshape(1, c, M))).numpy().reshape(c, M))
            inv.append(sd[k].inverse_transform(torch.from_numpy(z[o : o + c].reshape(1, c, M))).numpy().reshape(c, M))
        o += c
    save_npy("uniform_target_x64.npy", x)
    save_npy("uniform_target_z64.npy", z)
    save_npy("uniform_target_fwd64.npy", np.concatenate(fwd))
    save_npy("uniform_target_inv64.npy", np.concatenate(inv))

    # the fast scaler's knots (built lazily by the transforms above), and the file written again
    scalers = post.scaler["era5"]
    knots = {"x": [], "m": [], "minv": []}
    for k, _ in TARGET_VARS:
        s = scalers[k]
        s.ensure_pchip_knots()
        knots["x"].append(s.knots_x_.numpy())
        knots["m"].append(s.knots_m_.numpy())
        knots["minv"].append(s.knots_minv_.numpy())
    for n in ("x", "m", "minv"):
        save_npy(f"fast_knots_{n}.npy", np.concatenate(knots[n]))
    save_npy("fast_knots_z.npy", scalers[TARGET_VARS[0][0]].knots_z_.numpy())
    save_scaler_dict({"target": post.scaler}, os.path.join(OUT, "scaler_quantile_fast_saved.json"))
    manifest["M"] = M
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
