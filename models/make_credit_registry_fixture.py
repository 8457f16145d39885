#!/usr/bin/env python3
"""Golden references from CREDIT's own registries (miles-credit 2026.2) for wxe's losses,
learning-rate schedulers and pre/postblocks: tests/data/credit_registry/.

Every value is computed by CREDIT's code (credit.losses.load_loss, credit.scheduler.load_scheduler,
credit.preblock/credit.postblock via its gen2 dataset); nothing is re-derived here.

(A) Losses: losses.json, pred.npy, target.npy, lat_weights.nc, grad_*.npy.
    pred/target: float32 (B, C, T, H, W) = (2, 5, 1, 6, 8), normal with std 1.5, channels
    U_0, U_1, T_0, T_1, SP. For each case a gen2 config (nested data schema, then
    credit.trainers.utils.inject_flat_var_keys as credit/applications/train_gen2.py does), then
    train_criterion = load_loss(conf) / valid_criterion = load_loss(conf, validation=True) and the
    gen2 trainer's call criterion(target, pred).mean(); value and d value / d pred (autograd).
    lat_weights.nc holds the latitudes CREDIT's loss.latitude_weights reads; it has 16 longitudes
    because VariableTotalLoss2D takes column 10 of the (lat, lon) weights (8 raise IndexError).
(B) Schedulers: schedulers.json. torch AdamW (lr = trainer.learning_rate, betas (0.9, 0.95) as
    CREDIT's load_model_states_and_optimizer) on one parameter, CREDIT's load_scheduler, driven as
    TrainerERA5Gen2.train_one_epoch + BaseTrainer.fit drive it; the lr each batch's
    optimizer.step() uses.
(C) Pre/postblocks: transforms.yml (a gen2 config over ../era5_tiny, the data section and fitted
    scaler of era5_tiny/credit2026_preprocess.yml), transforms_x.npy / transforms_y.npy (CREDIT's
    normalised input and target of one sample through its dataset and the preblocks),
    transforms_raw_y.npy (the physical target the dataset read, before the preblocks, in target
    channel order), transforms_post.npy (the postblocks run on transforms_y as if it were the
    prediction: physical, target channel order), transforms_sample.json.

Usage (any python with torch and miles-credit 2026.2; writes next to itself):
  python models/make_credit_registry_fixture.py
"""
import copy
import json
import math
import os
import tempfile
import warnings

import numpy as np
import torch
import xarray as xr
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "credit_registry"))
ERA5_TINY = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "era5_tiny"))

LAT = [75.0, 45.0, 15.0, -15.0, -45.0, -75.0]
N_LON_DATA = 8
N_LON_FILE = 16  # VariableTotalLoss2D: latitude_weights(conf)[:, 10] needs at least 11 longitudes
CHANNELS = ["U_0", "U_1", "T_0", "T_1", "SP"]
VARIABLE_WEIGHTS = {"U": [1.0, 2.0], "T": [0.5, 0.25], "SP": 3.0}
LOSSES = ["mse", "mae", "msle", "huber", "logcosh", "xtanh", "xsigmoid"]


def save_npy(name, a):
    np.save(os.path.join(OUT, name), np.ascontiguousarray(a))


def json_safe(v):
    """Scheduler state -> JSON: tensors/arrays to lists, non-finite floats to "inf"/"-inf"/"nan",
    callables (LambdaLR's lambdas are None in its state_dict anyway) to their name."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if torch.is_tensor(v):
        return json_safe(v.tolist())
    if isinstance(v, np.ndarray):
        return json_safe(v.tolist())
    if isinstance(v, (np.floating, float)):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(v, (np.integer,)):
        return int(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if callable(v):
        return getattr(v, "__name__", repr(v))
    return repr(v)


# ----------------------------------------------------------------------------------------- (A)
def loss_conf(training_loss, weighted, parameters=None, validation_loss=None):
    conf = {
        "data": {
            "source": {
                "ERA5": {
                    "level_coord": "level",
                    "levels": [500, 850],
                    "variables": {"prognostic": {"vars_3D": ["U", "T"], "vars_2D": ["SP"]}},
                }
            }
        },
        "model": {"levels": 2},
        "loss": {
            "training_loss": training_loss,
            "use_power_loss": False,
            "use_spectral_loss": False,  # VariableTotalLoss2D reads it without a default
            "use_latitude_weights": weighted,
            "latitude_weights": "lat_weights.nc",
            "use_variable_weights": weighted,
            "variable_weights": copy.deepcopy(VARIABLE_WEIGHTS),
        },
    }
    if parameters is not None:
        conf["loss"]["training_loss_parameters"] = dict(parameters)
    if validation_loss is not None:
        conf["loss"]["validation_loss"] = validation_loss
    from credit.trainers.utils import inject_flat_var_keys

    inject_flat_var_keys(conf)  # as credit/applications/train_gen2.py: data.variables etc. for the loss
    return conf


def make_losses():
    from credit.losses import load_loss

    rng = np.random.default_rng(20260202)
    shape = (2, len(CHANNELS), 1, len(LAT), N_LON_DATA)
    pred = (1.5 * rng.standard_normal(shape)).astype(np.float32)
    target = (1.5 * rng.standard_normal(shape)).astype(np.float32)
    save_npy("pred.npy", pred)
    save_npy("target.npy", target)
    xr.Dataset(
        coords={
            "latitude": ("latitude", np.array(LAT, dtype=np.float64)),
            "longitude": ("longitude", np.arange(N_LON_FILE, dtype=np.float64) * (360.0 / N_LON_FILE)),
        }
    ).to_netcdf(
        os.path.join(OUT, "lat_weights.nc"),
        engine="netcdf4",
        encoding={"latitude": {"_FillValue": None}, "longitude": {"_FillValue": None}},
    )

    # (name suffix, loss name, parameters, weighted, validation, validation_loss)
    specs = []
    for name in LOSSES:
        # the plain config names validation_loss: load_loss(conf, validation=True) raises KeyError
        # 'validation_loss' without it (only VariableTotalLoss2D falls back to L1)
        specs += [
            (f"{name}/plain", name, None, False, False, "mse"),
            (f"{name}/weighted", name, None, True, False, None),
            (f"{name}/weighted/validation", name, None, True, True, None),  # no validation_loss: L1
            (f"{name}/plain/validation", name, None, False, True, "mse"),
        ]
    specs += [
        ("huber_delta0.5/plain", "huber", {"delta": 0.5}, False, False, "mse"),
        ("huber_delta0.5/weighted", "huber", {"delta": 0.5}, True, False, None),
    ]

    cases = []
    cwd = os.getcwd()
    os.chdir(OUT)  # latitude_weights: "lat_weights.nc", relative to the fixture folder
    try:
        for case_name, name, params, weighted, validation, vloss in specs:
            conf = loss_conf(name, weighted, params, vloss)
            train_criterion = load_loss(conf)
            valid_criterion = load_loss(conf, validation=True)
            criterion = valid_criterion if validation else train_criterion
            p = torch.from_numpy(pred.copy()).requires_grad_(True)
            t = torch.from_numpy(target.copy())
            # trainer_gen2.py (train and validate): criterion(y.float().to(y_pred.dtype), y_pred).mean()
            loss = criterion(t.float().to(p.dtype), p).mean()
            loss.backward()
            assert p.grad is not None and torch.isfinite(p.grad).all() and torch.isfinite(loss)
            grad_name = "grad_" + case_name.replace("/", "_") + ".npy"
            save_npy(grad_name, p.grad.numpy().astype(np.float32))
            cases.append(
                {
                    "name": case_name,
                    "training_loss": name,
                    "validation_loss": vloss,
                    "parameters": dict(params or {}),
                    "weighted": weighted,
                    "validation": validation,
                    "criterion": type(criterion).__name__,
                    "value": float(loss.detach().double()),
                    "grad": grad_name,
                }
            )
    finally:
        os.chdir(cwd)
    doc = {
        "credit_version": credit_version(),
        "lat": LAT,
        "lat_weights_file": "lat_weights.nc",
        "channels": CHANNELS,
        "variable_weights": VARIABLE_WEIGHTS,
        "pred": "pred.npy",
        "target": "target.npy",
        "cases": cases,
    }
    with open(os.path.join(OUT, "losses.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return cases


# ----------------------------------------------------------------------------------------- (B)
BATCHES_PER_EPOCH = 50
EPOCHS = 20
PLATEAU_METRICS = [1.0, 0.9, 0.85, 0.85, 0.85, 0.85, 0.8, 0.79995, 0.79995, 0.7999,
                   0.7, 0.7, 0.7, 0.7, 0.7, 0.65, 0.66, 0.67, 0.6, 0.6]  # fmt: skip

SCHEDULER_CASES = [
    # config/gen_2/examples/example-v2026.2.yml's type and learning rate, smaller steps
    ("linear-warmup-cosine", 1.0e-3,
     {"scheduler_type": "linear-warmup-cosine", "warmup_steps": 100, "total_steps": 800, "min_lr": 1.0e-5}),
    # config/gen_2/camulator/camulator_gen2_casper.yml (T_max: *epochs)
    ("cosine-annealing/camulator", 1.0e-4, {"scheduler_type": "cosine-annealing", "T_max": EPOCHS, "last_epoch": -1}),
    ("cosine-annealing/past_T_max", 1.0e-4, {"scheduler_type": "cosine-annealing", "T_max": 6, "last_epoch": -1}),
    # config/gen_2/smoke/smoke_gen2_casper.yml
    ("cosine-annealing-restarts/smoke", 1.0e-3,
     {"scheduler_type": "cosine-annealing-restarts", "first_cycle_steps": 50, "cycle_mult": 1.0, "max_lr": 1.0e-3,
      "min_lr": 1.0e-6, "warmup_steps": 10, "gamma": 1.0}),
    ("cosine-annealing-restarts/mult2_gamma0.7", 1.0e-3,
     {"scheduler_type": "cosine-annealing-restarts", "first_cycle_steps": 50, "cycle_mult": 2.0, "max_lr": 1.0e-3,
      "min_lr": 1.0e-6, "warmup_steps": 10, "gamma": 0.7}),
    ("lambda", 1.0e-3, {"scheduler_type": "lambda"}),
    ("plateau", 1.0e-3,
     {"scheduler_type": "plateau", "mode": "min", "factor": 0.5, "patience": 2, "threshold": 1.0e-4, "cooldown": 1,
      "min_lr": 1.0e-6}),
]  # fmt: skip


def make_schedulers():
    from credit.scheduler import load_scheduler, update_on_batch, update_on_epoch

    cases = []
    for name, lr, section in SCHEDULER_CASES:
        conf = {"trainer": {"learning_rate": lr, "weight_decay": 0.0, "use_scheduler": True,
                            "scheduler": copy.deepcopy(section)}}  # fmt: skip
        stype = section["scheduler_type"]
        metrics = PLATEAU_METRICS if stype == "plateau" else None
        w = torch.nn.Parameter(torch.ones(1))
        optimizer = torch.optim.AdamW([w], lr=float(conf["trainer"]["learning_rate"]), betas=(0.9, 0.95),
                                      weight_decay=conf["trainer"]["weight_decay"])  # fmt: skip
        scheduler = load_scheduler(optimizer, conf)
        lrs = []
        for epoch in range(EPOCHS):
            # TrainerERA5Gen2.train_one_epoch, at its start (before any optimizer.step(): torch warns)
            if stype == "lambda":
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step",
                                            category=UserWarning)
                    scheduler.step()
            for _ in range(BATCHES_PER_EPOCH):
                (w * w).sum().backward()
                lrs.append(float(optimizer.param_groups[0]["lr"]))  # the lr this optimizer.step() uses
                optimizer.step()
                optimizer.zero_grad()
                # end of each batch (outside the accumulation boundary)
                if stype in update_on_batch:
                    scheduler.step()
            # BaseTrainer.fit, after train and validate
            if stype in update_on_epoch:
                if stype == "plateau":
                    scheduler.step(metrics[epoch])
                else:
                    scheduler.step()
        cases.append(
            {
                "name": name,
                "learning_rate": lr,
                "scheduler": section,
                "batches_per_epoch": BATCHES_PER_EPOCH,
                "epochs": EPOCHS,
                "metrics": metrics,
                "lrs": lrs,
                "state_dict": json_safe(scheduler.state_dict()),
            }
        )
    doc = {
        "credit_version": credit_version(),
        "update_on_batch": list(update_on_batch),
        "update_on_epoch": list(update_on_epoch),
        "cases": cases,
    }
    with open(os.path.join(OUT, "schedulers.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return cases


# ----------------------------------------------------------------------------------------- (C)
T = "ERA5/prognostic/3d/T"
U = "ERA5/prognostic/3d/U"
SP = "ERA5/prognostic/2d/SP"
TP = "ERA5/diagnostic/2d/tp"
TSI = "ERA5/dynamic_forcing/2d/tsi"
SCALER = "../era5_tiny/credit2026_fitted_scaler.json"
SAMPLE_TIME = "2021-01-01T00:00:00"

PREBLOCKS = {
    "per_step": {
        "fill": {
            "type": "fill_values",
            "args": {
                "variables": [TP, TSI],
                "rules": [
                    {"search": "nan", "fill": 0.0},
                    {"search": 0.0, "op": "<", "fill": 0.0},
                    {"search": 1.0e-5, "op": "<=", "fill": 0.0},  # drizzle to 0: makes the block act on tp
                ],
            },
        },
        "log_u": {"type": "log_transform", "args": {"variables": [U], "eps": 1.0e-6, "base": "e"}},
        "log10_tp": {"type": "log_transform", "args": {"variables": [TP], "eps": 1.0e-5, "base": "10"}},
        "sqrt_t": {"type": "sqrt_transform", "args": {"variables": [T]}},
        "scaler": {
            "type": "bridgescaler_transform",
            "args": {
                "scaler_path": SCALER,
                "variables": [],
                "method": "transform",
                "scaler_params": {"channels_last": False},
            },
        },
        "concat": {"type": "concat"},
    }
}
POSTBLOCKS = {
    "per_step": {
        "reconstruct": {"type": "reconstruct"},
        "scaler": {
            "type": "bridgescaler_transform",
            "args": {"scaler_path": SCALER, "variables": [T, U, SP, TP], "method": "inverse_transform"},
        },
        "exp_u": {"type": "exp_transform", "args": {"variables": [U], "eps": 1.0e-6, "base": "e"}},
        "exp10_tp": {"type": "exp_transform", "args": {"variables": [TP], "eps": 1.0e-5, "base": "10"}},
        "square_t": {"type": "square_transform", "args": {"variables": [T]}},
    }
}


def transforms_config():
    with open(os.path.join(ERA5_TINY, "credit2026_preprocess.yml")) as fh:
        conf = yaml.safe_load(fh)
    v = conf["data"]["source"]["ERA5"]["variables"]
    for kind in ("prognostic", "diagnostic", "dynamic_forcing", "static"):
        v[kind]["path"] = "../era5_tiny/" + v[kind]["path"]
    conf["loss"]["latitude_weights"] = "../era5_tiny/" + conf["loss"]["latitude_weights"]
    conf["preblocks"] = copy.deepcopy(PREBLOCKS)
    conf["postblocks"] = copy.deepcopy(POSTBLOCKS)
    return conf


def channel_names(channel_map):
    names = []
    for var_key in sorted(channel_map, key=lambda k: channel_map[k]["slice"].start):
        n_levels, n_time = channel_map[var_key]["orig_shape"]
        for i in range(n_levels * n_time):
            names.append(f"{var_key}_{i}" if n_levels * n_time > 1 else var_key)
    return names


def make_transforms():
    import pandas as pd
    from credit.postblock import apply_postblocks, build_postblocks
    from credit.postblock.reconstruct import FlattenToTensor
    from credit.preblock import apply_preblocks, build_preblocks
    from credit.preblock.concat import ConcatToTensor
    from credit.trainers.utils import load_dataset

    conf = transforms_config()
    with open(os.path.join(OUT, "transforms.yml"), "w") as fh:
        fh.write(
            "# CREDIT gen2 config (miles-credit 2026.2) over tests/data/era5_tiny, paths relative to this file:\n"
            "# the data section and fitted scaler of era5_tiny/credit2026_preprocess.yml, with a preblock chain\n"
            "# fill_values (tp, tsi) -> log e (U) -> log 10 (tp) -> sqrt (T) -> bridgescaler -> concat, and the\n"
            "# inverse postblocks reconstruct -> bridgescaler inverse -> exp e (U) -> exp 10 (tp) -> square (T).\n"
            "# Written by models/make_credit_registry_fixture.py.\n"
        )
        yaml.safe_dump(conf, fh, sort_keys=False)

    cwd = os.getcwd()
    os.chdir(OUT)  # the config's paths are relative to its folder
    try:
        with open("transforms.yml") as fh:
            conf = yaml.safe_load(fh)
        with tempfile.TemporaryDirectory() as tmp:
            conf["save_loc"] = tmp  # anything CREDIT's dataset writes goes there, not into the fixture
            ds = load_dataset(conf, is_train=True)
            t = pd.Timestamp(SAMPLE_TIME)
            sample = ds[(t, 0)]
            batch = {dt: {s: {k: v.unsqueeze(0) for k, v in src.items()} for s, src in sample[dt].items()}
                     for dt in ("input", "target")}  # fmt: skip
            meta = sample.get("metadata", {})

            # the physical target as the dataset read it (FillValues writes into the caller's dict:
            # take it from a copy first), concatenated in CREDIT's target channel order
            raw = {dt: {s: dict(src) for s, src in batch[dt].items()} for dt in batch}
            _, raw_y, raw_meta = ConcatToTensor()(raw)

            ic = apply_preblocks(build_preblocks(conf, phase="ic_only"), batch)  # none in this config
            res = apply_preblocks(build_preblocks(conf, phase="per_step"), ic)
            x = res["x"]
            y = res["y"]

            # postblocks on the normalised target taken as the model's prediction
            # (as float32, the dtype the file stores it in, so that wxe starts from the same values)
            print("transforms: CREDIT's normalised target is", y.dtype)
            full = {"x": x, "y": y, "y_pred": y.float().clone(), "metadata": res["metadata"]}
            full = apply_postblocks(build_postblocks(conf, phase="per_step"), full)
            full = FlattenToTensor(key="y_processed", out_key="y_post")(full)  # target channel order
            post = full["y_post"]
    finally:
        os.chdir(cwd)

    assert channel_names(raw_meta["target"]["_channel_map"]) == channel_names(res["metadata"]["target"]["_channel_map"])
    x = x.numpy().astype(np.float32)
    y = y.numpy().astype(np.float32)
    raw_y = raw_y.numpy().astype(np.float32)
    post = post.detach().numpy().astype(np.float32)
    if post.ndim == 4 and y.ndim == 5:
        post = post.reshape(y.shape)
    for name, a in (("x", x), ("y", y), ("raw_y", raw_y), ("post", post)):
        assert np.isfinite(a).all(), name
    save_npy("transforms_x.npy", x)
    save_npy("transforms_y.npy", y)
    save_npy("transforms_raw_y.npy", raw_y)
    save_npy("transforms_post.npy", post)

    def times(key):
        out = []
        for src in meta.values() if isinstance(meta, dict) else []:
            if isinstance(src, dict) and key in src:
                out += [str(pd.Timestamp(int(v))) for v in np.asarray(src[key]).ravel()]
        return out

    doc = {
        "credit_version": credit_version(),
        "config": "transforms.yml",
        "time": SAMPLE_TIME,
        "input_datetime": times("input_datetime"),
        "target_datetime": times("target_datetime"),
        "x": "transforms_x.npy",
        "y": "transforms_y.npy",
        "raw_y": "transforms_raw_y.npy",
        "post": "transforms_post.npy",
        "x_shape": list(x.shape),
        "y_shape": list(y.shape),
        "input_channels": channel_names(res["metadata"]["input"]["_channel_map"]),
        "target_channels": channel_names(res["metadata"]["target"]["_channel_map"]),
        "preblocks": list(PREBLOCKS["per_step"]),
        "postblocks": list(POSTBLOCKS["per_step"]),
    }
    with open(os.path.join(OUT, "transforms_sample.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return x, y, raw_y, post, doc


def credit_version():
    try:
        from credit._version import __version__

        return __version__
    except ImportError:
        return None


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    losses = make_losses()
    for c in losses:
        print(f"loss {c['name']:32s} {c['criterion']:20s} {c['value']:.9g}")
    scheds = make_schedulers()
    for c in scheds:
        lrs = c["lrs"]
        print(f"scheduler {c['name']:42s} first {lrs[:3]} min {min(lrs):.3g} max {max(lrs):.3g} last {lrs[-1]:.6g}")
    x, y, raw_y, post, doc = make_transforms()
    print("transforms x", x.shape, "y", y.shape, "raw_y", raw_y.shape, "post", post.shape)
    rel = np.abs(post - raw_y) / np.maximum(np.abs(raw_y), 1e-30)
    rel[:, doc["target_channels"].index(TP)][raw_y[:, doc["target_channels"].index(TP)] <= 1.0e-5] = 0  # filled
    for i, ch in enumerate(doc["target_channels"]):
        print(f"  {ch:28s} raw [{raw_y[:, i].min():.6g}, {raw_y[:, i].max():.6g}] "
              f"y [{y[:, i].min():.4g}, {y[:, i].max():.4g}] post max rel diff {rel[:, i].max():.3g}")  # fmt: skip
    print("written to", OUT)


if __name__ == "__main__":
    main()
