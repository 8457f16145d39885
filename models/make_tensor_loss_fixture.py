#!/usr/bin/env python3
"""Golden files of CREDIT's whole-tensor losses (tests/data/credit_registry/tensor_losses), made by
CREDIT itself (miles-credit 2026.2): SpectralLoss2D ("spectral"), PSDLoss ("power") and
CovarianceWeightedMSELoss ("covmse") called as CREDIT's trainer calls a criterion, loss(target,
pred), and VariableTotalLoss2D (latitude and variable weights, mse) with use_spectral_loss and
use_power_loss. Per case: the value and, by autograd, d loss / d pred.

Files: pred.npy, target.npy (1, 3, 1, 6, 40 float32), lat.nc (the latitudes VariableTotalLoss2D
weighs by), cases.json (name -> value, gradient file, arguments), grad_<name>.npy.

Usage: /root/credit-venv/bin/python models/make_tensor_loss_fixture.py
"""
import json
import os

import numpy as np
import torch
import xarray as xr

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                                    "credit_registry", "tensor_losses"))
B, C, T, H, W = 1, 3, 1, 6, 40
LAT = np.array([75.0, 45.0, 15.0, -15.0, -45.0, -75.0])


def main():
    from credit.losses.gen_1.covariance import CovarianceWeightedMSELoss
    from credit.losses.gen_1.power import PSDLoss
    from credit.losses.gen_1.spectral import SpectralLoss2D
    from credit.losses.gen_1.weighted_loss import VariableTotalLoss2D, latitude_weights

    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(11)
    x = np.arange(W) * 2 * np.pi / W
    base = np.sin(3 * x)[None, None, None, None, :] + 0.5 * np.cos(7 * x)[None, None, None, None, :]
    target = (base + 0.3 * rng.normal(size=(B, C, T, H, W))).astype(np.float32)
    pred = (target + 0.2 * rng.normal(size=(B, C, T, H, W))).astype(np.float32)
    np.save(os.path.join(OUT, "pred.npy"), pred)
    np.save(os.path.join(OUT, "target.npy"), target)
    xr.Dataset(coords={"latitude": LAT, "longitude": np.arange(W) * 9.0}).to_netcdf(os.path.join(OUT, "lat.nc"))
    conf = {"data": {"variables": ["T"], "surface_variables": ["SP", "tp"], "diagnostic_variables": []},
            "model": {"levels": 1},
            "loss": {"training_loss": "mse", "use_latitude_weights": True, "latitude_weights": os.path.join(OUT, "lat.nc"),
                     "use_variable_weights": True, "variable_weights": {"T": [1.0], "SP": 2.0, "tp": 0.5},
                     "use_spectral_loss": True, "use_power_loss": True, "spectral_lambda_reg": 0.1,
                     "spectral_wavenum_init": 5}}
    lat_w = latitude_weights(conf)[:, 10].unsqueeze(0).unsqueeze(-1)  # VariableTotalLoss2D's (1, H, 1)
    cases = {
        "spectral": (lambda: SpectralLoss2D(wavenum_init=5, reduction="none"), None, {"wavenum_init": 5}),
        "spectral_lat": (lambda: SpectralLoss2D(wavenum_init=3, reduction="none"), lat_w, {"wavenum_init": 3, "lat": True}),
        "power": (lambda: PSDLoss(wavenum_init=5), None, {"wavenum_init": 5}),
        "power_lat": (lambda: PSDLoss(wavenum_init=0), lat_w, {"wavenum_init": 0, "lat": True}),
        "covmse": (lambda: CovarianceWeightedMSELoss(reduction="none"), None, {}),
        "covmse_norm": (lambda: CovarianceWeightedMSELoss(reduction="mean", batch_normalize=True, off_diagonal_scale=0.5),
                        None, {"batch_normalize": True, "off_diagonal_scale": 0.5}),
        "vtl2d": (lambda: VariableTotalLoss2D(conf), None, {"config": conf["loss"]}),
    }
    out = {}
    for name, (make, w, args) in cases.items():
        p = torch.tensor(pred, requires_grad=True)
        t = torch.tensor(target)
        crit = make()
        val = crit(t, p, weights=w) if w is not None else crit(t, p)
        val = val.mean()  # the trainer's reduction of a criterion's output
        val.backward()
        np.save(os.path.join(OUT, f"grad_{name}.npy"), p.grad.numpy().astype(np.float32))
        out[name] = {"value": float(val), "grad": f"grad_{name}.npy", "args": args}
    with open(os.path.join(OUT, "cases.json"), "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(json.dumps({k: v["value"] for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
