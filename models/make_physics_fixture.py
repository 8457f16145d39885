#!/usr/bin/env python3
"""CREDIT 2026's physics postblocks on a small grid (tests/data/physics/, read by
tests/physics_blocks_test.cpp): tracer_fixer, global_mass_fixer, global_water_fixer,
global_energy_fixer_updown (credit/postblock/conservation.py, midpoint and trapezoid) and
wind_artifact_filter (credit/postblock/wind_filter.py, with and without preserve_amplitude),
CREDIT's own classes run on batch dicts of random fields of physical magnitude.

Writes statics.nc (lon2d, lat2d, hyai, hybi, PHIS: the blocks' save_loc_physics; its longitudes
cross 360 so the area's wrap is exercised) and cases.nc: the inputs (`<name>_mid`: 5 levels, the
midpoint rule's; `<name>_trapz`: 6 levels, the trapezoid's; `<name>_in`: the step's x_physical)
and each block's output. Usage (miles-credit 2026.2):
  /root/credit-venv/bin/python models/make_physics_fixture.py [OUT_DIR]
"""
import os
import sys

import numpy as np
import torch
import xarray as xr
from credit.postblock.conservation import (GlobalEnergyFixerUpDown, GlobalMassFixer, GlobalWaterFixer,
                                           TracerFixer)
from credit.postblock.wind_filter import WindArtifactFilter
from credit.physics_core import physics_hybrid_sigma_level

H, W, L = 8, 16, 5
S = "SRC"
K3 = {v: f"{S}/prognostic/3d/{v}" for v in ["T", "Q", "U", "V"]}
K2 = {v: f"{S}/prognostic/2d/{v}" for v in ["PS"]}
KD = {v: f"{S}/diagnostic/2d/{v}" for v in ["PRECT", "QFLX", "FSUTOA", "FLUT", "FSDS", "FSUS", "FLDS", "FLUS",
                                             "SHFLX", "LHFLX"]}
KF = {"SOLIN": f"{S}/dynamic_forcing/2d/SOLIN"}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "physics")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(38)
    f32 = np.float32

    # the statics: a regular grid whose longitudes wrap past 360, hybrid coefficients top first
    lat = 90 - 180 / H * (np.arange(H) + 0.5)
    lon = (200 + 22.5 * np.arange(W)) % 360
    lon2d, lat2d = np.meshgrid(lon, lat)
    hyai = np.array([300.0, 5000.0, 12000.0, 9000.0, 2000.0, 0.0])  # Pa
    hybi = np.array([0.0, 0.0, 0.1, 0.4, 0.8, 1.0])
    phis = rng.uniform(0, 20000, (H, W))
    statics = xr.Dataset({"lon2d": (("lat", "lon"), lon2d.astype(f32)), "lat2d": (("lat", "lon"), lat2d.astype(f32)),
                          "hyai": (("ilev",), hyai.astype(f32)), "hybi": (("ilev",), hybi.astype(f32)),
                          "PHIS": (("lat", "lon"), phis.astype(f32))})
    sp = os.path.join(out, "statics.nc")
    statics.to_netcdf(sp)
    physics = dict(save_loc_physics=sp, lon_lat_level_name=["lon2d", "lat2d", "hyai", "hybi"], grid_type="sigma")

    data = {}

    def field(name, shape, lo, hi):
        a = rng.uniform(lo, hi, shape).astype(f32)
        data[name] = a
        return a

    def fields(tag, n):  # the 3D state of n levels, prediction and input, and the 2D fields
        for pre, lv in (("", n), ("_in", n)):
            field(f"T{pre}_{tag}", (lv, H, W), 200, 300)
            field(f"Q{pre}_{tag}", (lv, H, W), 1e-3, 1e-2)
            field(f"U{pre}_{tag}", (lv, H, W), -20, 20)
            field(f"V{pre}_{tag}", (lv, H, W), -20, 20)
        field(f"PS_{tag}", (H, W), 9.5e4, 1.03e5)
        field(f"PS_in_{tag}", (H, W), 9.5e4, 1.03e5)

    fields("mid", L)
    fields("trapz", L + 1)
    field("PRECT", (H, W), 0, 2e-3)
    field("QFLX", (H, W), 0, 1e-3)
    field("SOLIN_in", (H, W), 0, 1300)
    for v in ["FSUTOA", "FLUT", "FSDS", "FSUS", "FLDS", "FLUS", "SHFLX", "LHFLX"]:
        field(v, (H, W), 0, 300)

    def t(a, n=None):  # (levels, H, W) or (H, W) -> (1, levels, 1, H, W)
        a = torch.from_numpy(np.array(a))
        return a.reshape(1, -1, 1, H, W)

    def batch(tag):
        y = {K3[v]: t(data[f"{v}_{tag}"]) for v in ["T", "Q", "U", "V"]}
        y[K2["PS"]] = t(data[f"PS_{tag}"])
        for v, k in KD.items():
            y[k] = t(data[v])
        x = {K3[v]: t(data[f"{v}_in_{tag}"]) for v in ["T", "Q", "U", "V"]}
        x[K2["PS"]] = t(data[f"PS_in_{tag}"])
        x[KF["SOLIN"]] = t(data["SOLIN_in"])
        return {"y_processed": {S: y}, "x_physical": {S: x}}

    def run(block, tag, key, name):
        with torch.no_grad():
            r = block(batch(tag))["y_processed"][S][key]
        data[name] = r.numpy().reshape(data[f"{key.split('/')[-1]}_{tag}"].shape if key.split("/")[-1] in
                                       ("T", "Q", "U", "V", "PS") else (H, W))

    run(TracerFixer([K3["Q"], KD["PRECT"]], [4e-3, 1e-3]), "mid", K3["Q"], "tracer_Q")
    run(TracerFixer([K3["Q"]], 2e-3, 8e-3), "mid", K3["Q"], "tracer_hi_Q")
    for tag, mid in (("mid", True), ("trapz", False)):
        run(GlobalMassFixer(K3["Q"], K2["PS"], midpoint=mid, fix_level_num=3, **physics), tag, K2["PS"],
            f"mass_{tag}_PS")
        run(GlobalWaterFixer(K3["Q"], K2["PS"], KD["PRECT"], KD["QFLX"], 6, midpoint=mid, **physics), tag,
            KD["PRECT"], f"water_{tag}_PRECT")
        energy = GlobalEnergyFixerUpDown(K3["T"], K3["Q"], K3["U"], K3["V"], K2["PS"], "PHIS", KF["SOLIN"],
                                         KD["FSUTOA"], KD["FLUT"], KD["FSDS"], KD["FSUS"], KD["FLDS"], KD["FLUS"],
                                         KD["SHFLX"], KD["LHFLX"], 6, midpoint=mid, **physics)
        run(energy, tag, K3["T"], f"energy_{tag}_T")

    core = physics_hybrid_sigma_level(torch.from_numpy(lon2d.astype(f32)), torch.from_numpy(lat2d.astype(f32)),
                                      torch.from_numpy(hyai.astype(f32)), torch.from_numpy(hybi.astype(f32)), True)
    data["area"] = core.area.numpy()

    # the wind filter on normalised values (as camulator runs it, before the inverse scaler)
    for v in ["U", "V", "T"]:
        field(f"{v}_norm", (L, H, W), -3, 3)
    cases = {
        "wind_amp": dict(mask_level=2, target_levels=[1, 2, 3, 9], speed_threshold=2.8, smooth_sigma=1.2,
                         smooth_sigma_zonal=2.0, smooth_sigma_meridional=0.5, dilation_zonal=15,
                         dilation_meridional=5, falloff_sigma=4.0, preserve_amplitude=True),
        "wind_iso": dict(mask_level=1, target_levels=[0, 4], speed_threshold=3.5, smooth_sigma=1.0,
                         dilation_zonal=5, dilation_meridional=3, falloff_sigma=1.5, preserve_amplitude=False),
    }
    for name, kw in cases.items():
        f = WindArtifactFilter(K3["U"], K3["V"], [K3["U"], K3["V"], K3["T"]], **kw)
        y = {K3[v]: t(data[f"{v}_norm"]) for v in ["U", "V", "T"]}
        with torch.no_grad():
            r = f({"y_processed": {S: y}})["y_processed"][S]
        for v in ["U", "V", "T"]:
            data[f"{name}_{v}"] = r[K3[v]].numpy().reshape(L, H, W)

    dims = {(L, H, W): ("lev", "lat", "lon"), (L + 1, H, W): ("lev1", "lat", "lon"), (H, W): ("lat", "lon")}
    ds = xr.Dataset({k: (dims[v.shape], v.astype(f32)) for k, v in data.items()})
    ds.to_netcdf(os.path.join(out, "cases.nc"))
    print("wrote", sp, "and", os.path.join(out, "cases.nc"))


if __name__ == "__main__":
    main()
