#!/usr/bin/env python3
"""Writes a small ERA5-like data set for the CREDIT data tests (tests/data/era5_tiny/).

Two "years" of 6-hourly fields on a 32x64 grid: 2020 as netCDF-4 and 2021 as zarr (the
pure-zarr layout with xarray's _ARRAY_DIMENSIONS, as xarray writes it), plus a forcing file
per year, a static file, the scalers (bridgescaler JSON written by CREDIT's own converter,
and gen1 mean/std netCDF) and a CREDIT gen2 config. Values follow a closed formula that tests/era5_test.cpp recomputes:

    f(var, h, lev, i, j) = A + B * sin(0.1 i + 0.07 j + 0.05 h) + C * lev / 1000

h: hours since 2020-12-31T00, lev: the level's coordinate value (hPa), i: latitude row,
j: longitude column. The files are written by ncgen (Debian netcdf-bin) from CDL text, so
no Python netCDF package is needed; the scaler needs miles-credit (bridgescaler, torch,
xarray). Usage: python models/make_era5_fixture.py [OUT_DIR]
"""
import json
import math
import os
import shutil
import subprocess
import sys

H, W = 32, 64
LEVELS = [300, 500, 850]
COEF = {  # A, B, C
    "T": (250.0, 10.0, 30.0),
    "U": (5.0, 8.0, 10.0),
    "SP": (100000.0, 500.0, 0.0),
    "tp": (0.001, 0.001, 0.0),
    "tsi": (1.0e6, 3.0e5, 0.0),
    "LSM": (0.5, 0.5, 0.0),
}
UNITS = {"T": "K", "U": "m s-1", "SP": "Pa", "tp": "m", "tsi": "J m-2", "LSM": "1"}
LONG = {"T": "Temperature", "U": "U component of wind", "SP": "Surface pressure",
        "tp": "Total precipitation", "tsi": "TOA incident solar radiation", "LSM": "Land-sea mask"}


def f(var, h, lev, i, j):
    a, b, c = COEF[var]
    return a + b * math.sin(0.1 * i + 0.07 * j + 0.05 * h) + c * lev / 1000.0


def lat_lon():
    lat = [90.0 - 180.0 * i / (H - 1) for i in range(H)]
    lon = [360.0 * j / W for j in range(W)]
    return lat, lon


def nums(xs):
    return ", ".join(repr(float(x)) if isinstance(x, float) else str(x) for x in xs)


def cdl(name, times, vars3, vars2, static=False):
    """CDL text of one file; times are hours since 2020-12-31T00 (the formula's h)."""
    lat, lon = lat_lon()
    out = [f"netcdf {name} {{", "dimensions:"]
    if not static:
        out.append(f"  time = {len(times)} ;")
    if vars3:
        out.append(f"  level = {len(LEVELS)} ;")
    out += [f"  latitude = {H} ;", f"  longitude = {W} ;", "variables:"]
    if not static:
        out += ["  double time(time) ;", '    time:units = "hours since 2020-12-31 00:00:00" ;',
                '    time:calendar = "standard" ;']
    if vars3:
        out += ["  int level(level) ;", '    level:units = "hPa" ;']
    out += ["  double latitude(latitude) ;", '    latitude:units = "degrees_north" ;',
            "  double longitude(longitude) ;", '    longitude:units = "degrees_east" ;']
    for v in vars3:
        out += [f"  float {v}(time, level, latitude, longitude) ;", f'    {v}:units = "{UNITS[v]}" ;',
                f'    {v}:long_name = "{LONG[v]}" ;']
    for v in vars2:
        dims = "latitude, longitude" if static else "time, latitude, longitude"
        out += [f"  float {v}({dims}) ;", f'    {v}:units = "{UNITS[v]}" ;', f'    {v}:long_name = "{LONG[v]}" ;']
    out.append("data:")
    if not static:
        out.append(f"  time = {nums([float(t) for t in times])} ;")
    if vars3:
        out.append(f"  level = {nums(LEVELS)} ;")
    out += [f"  latitude = {nums(lat)} ;", f"  longitude = {nums(lon)} ;"]
    for v in vars3:
        vals = [f(v, t, lev, i, j) for t in times for lev in LEVELS for i in range(H) for j in range(W)]
        out.append(f"  {v} = {nums(vals)} ;")
    for v in vars2:
        ts = [0] if static else times
        vals = [f(v, t, 0, i, j) for t in ts for i in range(H) for j in range(W)]
        out.append(f"  {v} = {nums(vals)} ;")
    out.append("}")
    return "\n".join(out) + "\n"


def ncgen(text, target, tmp):
    path = os.path.join(tmp, "x.cdl")
    with open(path, "w") as fh:
        fh.write(text)
    subprocess.run(["ncgen", "-k", "nc4", "-o", target, path], check=True)


def gen1_stats(kind, levels=LEVELS):
    # per level over the file's levels; 2D vars scalar
    lines = ["netcdf stats {", "dimensions:", f"  level = {len(levels)} ;", "variables:", "  int level(level) ;"]
    for v in ("T", "U"):
        lines.append(f"  double {v}(level) ;")
    for v in ("SP", "tp", "tsi"):
        lines.append(f"  double {v} ;")
    lines += ["data:", f"  level = {nums(levels)} ;"]
    for v, (a, b, c) in COEF.items():
        if v == "LSM":
            continue
        if v in ("T", "U"):
            vals = [a + c * lev / 1000.0 if kind == "mean" else b * (1.0 + lev / 1000.0) for lev in levels]
            lines.append(f"  {v} = {nums(vals)} ;")
        else:
            lines.append(f"  {v} = {nums([a if kind == 'mean' else b])} ;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "era5_tiny")
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    years = {2020: [0, 6, 12, 18], 2021: [24, 30, 36, 42]}
    for y, times in years.items():
        if y == 2020:
            target = os.path.join(out, f"era5_{y}.nc")
        else:  # pure zarr with xarray's dimension attributes
            d = os.path.join(out, f"era5_{y}.zarr")
            shutil.rmtree(d, ignore_errors=True)
            target = "file://" + os.path.abspath(d) + "#mode=zarr,file"
        ncgen(cdl(f"era5_{y}", times, ["T", "U"], ["SP", "tp"]), target, tmp)
        ncgen(cdl(f"forcing_{y}", times, [], ["tsi"]), os.path.join(out, f"forcing_{y}.nc"), tmp)
    ncgen(cdl("static", [], [], ["LSM"], static=True), os.path.join(out, "static.nc"), tmp)
    ncgen(gen1_stats("mean"), os.path.join(out, "mean.nc"), tmp)
    ncgen(gen1_stats("std"), os.path.join(out, "std.nc"), tmp)
    # The bridgescaler scaler as CREDIT writes one: `credit convert`'s converter
    # (credit.cli._convert) run on mean/std files holding the config's levels, saved by
    # bridgescaler's save_scaler_dict: {"input"|"target": {"era5": {"era5/prognostic/3d/T":
    # "<scaler JSON>", ...}}} with numpy-encoded float32 mean_x_ / var_x_.
    from credit.cli._convert import _build_bridgescaler_jsons
    cfg_levels = [500, 850]
    for kind in ("mean", "std"):
        ncgen(gen1_stats(kind, cfg_levels), os.path.join(tmp, f"{kind}_cfg.nc"), tmp)
    groups = {("prognostic", "3d"): ["T", "U"], ("prognostic", "2d"): ["SP"], ("diagnostic", "2d"): ["tp"],
              ("dynamic_forcing", "2d"): ["tsi"], ("static", "2d"): ["LSM"]}
    keys, _ = _build_bridgescaler_jsons(os.path.join(tmp, "mean_cfg.nc"), os.path.join(tmp, "std_cfg.nc"), groups,
                                        os.path.join(out, "scaler.json"), os.path.join(tmp, "post.json"),
                                        source_name="era5")
    if not keys:
        sys.exit("make_era5_fixture.py: needs miles-credit with bridgescaler, torch and xarray")
    shutil.rmtree(tmp)
    with open(os.path.join(out, "config.yml"), "w") as fh:
        fh.write(CONFIG)


CONFIG = """# CREDIT gen2 config for the tiny ERA5-like data (paths relative to this file)
save_loc: "save"
seed: 1000
data:
  source:
    era5:
      dataset_type: "local"
      level_coord: "level"
      levels: [500, 850]
      variables:
        prognostic:
          vars_3D: ["T", "U"]
          vars_2D: ["SP"]
          path: "era5_%Y.*"
        diagnostic:
          vars_2D: ["tp"]
          path: "era5_%Y.*"
        dynamic_forcing:
          vars_2D: ["tsi"]
          path: "forcing_%Y.nc"
        static:
          vars_2D: ["LSM"]
          path: "static.nc"
  start_datetime: "2020-12-31T00"
  end_datetime: "2021-01-01T12"
  valid_start_datetime: "2021-01-01T00"
  valid_end_datetime: "2021-01-01T18"
  timestep: "6h"
  history_len: 1
  forecast_len: 1
preblocks:
  norm:
    type: "bridgescaler_transform"
    args:
      scaler_path: "scaler.json"
trainer:
  learning_rate: 1.0e-4
  weight_decay: 0.0
  grad_max_norm: 1.0
  grad_accum_every: 1
  train_batch_size: 1
  batches_per_epoch: 2
  epochs: 1
  use_ema: false
  seed: 1000
loss:
  training_loss: "mse"
  use_latitude_weights: true
  use_variable_weights: false
"""

if __name__ == "__main__":
    main()
