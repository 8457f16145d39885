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


def main():
    import pandas as pd
    import torch
    from credit.datasets.gen_2.channel_utils import ChannelSchema
    from credit.losses.base import BaseLoss
    from credit.postblock import apply_postblocks, build_postblocks
    from credit.preblock import apply_preblocks, build_preblocks
    from credit.trainers.utils import load_dataset

    conf = reg.transforms_config()
    conf["postblocks"]["per_step"]["reconstruct"] = {"type": "reconstruct", "args": {"detach": False}}
    conf["postblocks"]["per_step"].update(copy.deepcopy(TWIN))
    conf["loss"] = copy.deepcopy(LOSS)
    with open(os.path.join(OUT, "baseloss.yml"), "w") as fh:
        fh.write("# transforms.yml with the target twin postblocks and CREDIT 2026's loss.type base.\n"
                 "# Written by models/make_credit_baseloss_fixture.py.\n")
        yaml.safe_dump(conf, fh, sort_keys=False)
    cwd = os.getcwd()
    os.chdir(OUT)
    try:
        with open("baseloss.yml") as fh:
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
                p = pred.clone().requires_grad_(True)
                full = {"x": res["x"], "y": y.clone(), "y_pred": p, "metadata": res["metadata"]}
                full = apply_postblocks(build_postblocks(conf, phase="per_step"), full)
                crit = BaseLoss(channel_schema=ChannelSchema.load_or_from_config(conf), validation=validation,
                                **conf["loss"]["args"])
                loss = crit(full)
                loss.backward()
                tag = "validation" if validation else "training"
                out[tag] = {"value": float(loss), "var_losses": crit.last_var_losses}
                if not validation:
                    reg.save_npy("baseloss_grad.npy", p.grad.numpy().astype(np.float32))
                    out[tag]["grad"] = "baseloss_grad.npy"
                    out["weights"] = {k: float(v) for k, v in crit._combination_weights.items()}
            reg.save_npy("baseloss_pred.npy", pred.numpy().astype(np.float32))
            reg.save_npy("baseloss_target.npy", y.numpy().astype(np.float32))
    finally:
        os.chdir(cwd)
    out.update({"config": "baseloss.yml", "pred": "baseloss_pred.npy", "target": "baseloss_target.npy",
                "time": reg.SAMPLE_TIME, "credit_version": reg.credit_version()})
    with open(os.path.join(OUT, "baseloss.json"), "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
