#!/usr/bin/env python3
"""CREDIT 2026's loss.type base (credit/losses/base.py BaseLoss) on the era5_tiny sample of
tests/data/credit_registry/transforms.yml, made by CREDIT itself (miles-credit 2026.2, torch):

- baseloss.yml: transforms.yml with the target twin postblocks (reconstruct in_key y, out_key
  y_target_processed, then the prediction's scaler / exp / square blocks with key
  y_target_processed) and a loss section `type: base` (mse, an mae override for tp,
  inverse-variance weights from the fitted scaler, a manual weight, latitude weights);
- baseloss_pred.npy: a prediction (CREDIT's normalised target + seeded noise, float32);
- baseloss.json: BaseLoss's training and validation values on (pred, CREDIT's target) through
  CREDIT's postblocks, and the files of d loss / d pred (autograd through the postblocks):
  baseloss_grad.npy (training criterion).

Usage (any Python with torch and miles-credit):
  python models/make_credit_baseloss_fixture.py
"""
import copy
import json
import os
import sys
import tempfile

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_credit_registry_fixture as reg  # noqa: E402

OUT = reg.OUT
TWIN = {
    "reconstruct_target": {"type": "reconstruct", "args": {"in_key": "y", "out_key": "y_target_processed"}},
    "scaler_target": {
        "type": "bridgescaler_transform",
        "args": {"scaler_path": reg.SCALER, "variables": [reg.T, reg.U, reg.SP, reg.TP],
                 "method": "inverse_transform", "key": "y_target_processed"},
    },
    "exp_u_target": {"type": "exp_transform",
                     "args": {"variables": [reg.U], "eps": 1.0e-6, "base": "e", "key": "y_target_processed"}},
    "exp10_tp_target": {"type": "exp_transform",
                        "args": {"variables": [reg.TP], "eps": 1.0e-5, "base": "10", "key": "y_target_processed"}},
    "square_t_target": {"type": "square_transform", "args": {"variables": [reg.T], "key": "y_target_processed"}},
}
LOSS = {
    "type": "base",
    "args": {
        "training_loss": "mse",
        "validation_loss": "huber",
        "validation_loss_parameters": {"delta": 0.5},
        "base_loss_overrides": {reg.TP: {"loss": "mae"}},
        "var_weighting": "inverse_variance",
        "scaler_path": reg.SCALER,
        "variable_weights": {reg.SP: 2.0},
        "normalize_weights": True,
        "use_latitude_weights": True,
        "latitude_weights": "../era5_tiny/static.nc",
    },
}


GEO = "ERA5/computed_diagnostic/3d/geopotential"


def geo_block(key):
    """CREDIT's geopotential_diagnostic over the sample's variables: LSM standing in for the surface
    geopotential, U (after its exp) for specific humidity, the lowest two of ERA5's 137 levels."""
    args = {"output_name": GEO, "surface_geopotential_var": "ERA5/static/2d/LSM", "surface_pressure_var": reg.SP,
            "temperature_var": reg.T, "specific_humidity_var": reg.U, "levels": [136, 137]}
    if key:
        args["key"] = key
    return {"type": "geopotential_diagnostic", "args": args}


def main():
    for name, geo in (("baseloss", False), ("baseloss_geo", True)):
        make(name, geo)


def make(name, geo):
    """name.yml, name.json, name_grad.npy (and, for baseloss, the prediction and target). geo: with
    a geopotential_diagnostic block on the prediction and on the target twin (include_computed_diagnostics
    true, CREDIT's default), the prediction float64: in float32 the block's rounding, amplified
    near the surface, moves this loss by percents; BaseLoss itself scores in float32 as always
    (mse throughout: mae's sign would flip where float32 and float64 postblocks tie)."""
    import pandas as pd
    import torch
    from credit.datasets.gen_2.channel_utils import ChannelSchema
    from credit.losses.base import BaseLoss
    from credit.postblock import apply_postblocks, build_postblocks
    from credit.preblock import apply_preblocks, build_preblocks
    from credit.trainers.utils import load_dataset

    conf = reg.transforms_config()
    conf["postblocks"]["per_step"]["reconstruct"] = {"type": "reconstruct", "args": {"detach": False}}
    if geo:
        conf["postblocks"]["per_step"]["geopotential"] = geo_block(None)
    conf["postblocks"]["per_step"].update(copy.deepcopy(TWIN))
    if geo:
        conf["postblocks"]["per_step"]["geopotential_target"] = geo_block("y_target_processed")
    conf["loss"] = copy.deepcopy(LOSS)
    if geo:
        conf["loss"]["args"]["variable_weights"][GEO] = 1.0e-3
        del conf["loss"]["args"]["base_loss_overrides"]
    with open(os.path.join(OUT, name + ".yml"), "w") as fh:
        fh.write("# transforms.yml with the target twin postblocks and CREDIT 2026's loss.type base" +
                 (" and geopotential_diagnostic blocks" if geo else "") + ".\n"
                 "# Written by models/make_credit_baseloss_fixture.py.\n")
        yaml.safe_dump(conf, fh, sort_keys=False)
    cwd = os.getcwd()
    os.chdir(OUT)
    try:
        with open(name + ".yml") as fh:
            conf = yaml.safe_load(fh)
        with tempfile.TemporaryDirectory() as tmp:
            conf["save_loc"] = tmp
            ds = load_dataset(conf, is_train=True)
            sample = ds[(pd.Timestamp(reg.SAMPLE_TIME), 0)]
            batch = {dt: {s: {k: v.unsqueeze(0) for k, v in src.items()} for s, src in sample[dt].items()}
                     for dt in ("input", "target")}  # fmt: skip
            res = apply_preblocks(build_preblocks(conf, phase="per_step"), batch)
            y = res["y"].float()
            gen = torch.Generator().manual_seed(2026)
            pred = (y + 0.05 * torch.randn(y.shape, generator=gen)).float()
            out = {}
            for validation in (False, True):
                p = (pred.double() if geo else pred.clone()).requires_grad_(True)
                full = {"x": res["x"], "y": y.double() if geo else y.clone(), "y_pred": p, "metadata": res["metadata"],
                        "ic_raw": batch["input"]}
                full = apply_postblocks(build_postblocks(conf, phase="per_step"), full)
                crit = BaseLoss(channel_schema=ChannelSchema.load_or_from_config(conf), validation=validation,
                                **conf["loss"]["args"])
                loss = crit(full)
                loss.backward()
                tag = "validation" if validation else "training"
                out[tag] = {"value": float(loss), "var_losses": crit.last_var_losses}
                if not validation:
                    reg.save_npy(name + "_grad.npy", p.grad.numpy().astype(np.float32))
                    out[tag]["grad"] = name + "_grad.npy"
                    out["weights"] = {k: float(v) for k, v in crit._combination_weights.items()}
            if not geo:
                reg.save_npy("baseloss_pred.npy", pred.numpy().astype(np.float32))
                reg.save_npy("baseloss_target.npy", y.numpy().astype(np.float32))
    finally:
        os.chdir(cwd)
    out.update({"config": name + ".yml", "pred": "baseloss_pred.npy", "target": "baseloss_target.npy",
                "time": reg.SAMPLE_TIME, "credit_version": reg.credit_version()})
    with open(os.path.join(OUT, name + ".json"), "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
