#!/usr/bin/env python3
"""A tiny local copy in Google's ARCO-ERA5 layout (tests/data/arco_tiny) and what CREDIT's own
arco_era5 dataset (credit.datasets.gen_2.era5.ARCOERA5Dataset) reads from it.

Two zarr v2 stores, named as CREDIT's remote ones:
- full_37-1h-0p25deg-chunk-1.zarr-v3: pressure-level 3D variables (time, level, latitude,
  longitude) and every 2D variable (time, latitude, longitude), statics included (ARCO keeps
  a time axis on them);
- model-level-1h-0p25deg.zarr-v1: model-level 3D variables (time, hybrid, latitude, longitude).
Hourly made-up fields on a 6 x 8 grid (latitudes descending from 90, as ARCO's), time in hours
since 1900-01-01. CREDIT's dataset is pointed at the local stores (its _init_fs replaced, the
rest of it as shipped) and its _extract_field output for each field type at 2020-01-01T06 is
saved as expected_<key with / as __>.npy. arco_hybrid.yml and arco_level.yml are CREDIT gen2
configs over the stores (`path`, `model_level_path`: wxe's keys for the local copies).

Usage (a Python with miles-credit, xarray, zarr):
  /root/credit-venv/bin/python models/make_arco_fixture.py
"""
import os
import shutil

import numpy as np
import pandas as pd
import xarray as xr
import zarr

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "arco_tiny"))
PRES = "full_37-1h-0p25deg-chunk-1.zarr-v3"
MODEL = "model-level-1h-0p25deg.zarr-v1"
PLEVELS = [500, 850]
HYBRID = [136, 137]
T = pd.Timestamp("2020-01-01T06")

SOURCE = {
    "ARCO": {
        "dataset_type": "arco_era5",
        "variables": {
            "prognostic": {"vars_3D": ["temperature"], "vars_2D": ["surface_pressure"]},
            "diagnostic": {"vars_2D": ["total_precipitation"]},
            "dynamic_forcing": None,
            "static": {"vars_2D": ["geopotential_at_surface", "sea_ice_cover"]},
        },
    }
}


def field(name, hour, lev, lat, lon):
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    base = {"temperature": 250.0, "surface_pressure": 1.0e5, "total_precipitation": 0.001,
            "geopotential_at_surface": 500.0, "sea_ice_cover": 0.2}[name]
    return (base * (1 + 0.01 * np.cos(la)) + 3 * np.sin(lo + hour / 24.0) + 0.01 * lev).astype(np.float32)


def write(path, data, coords):
    ds = xr.Dataset(data, coords=coords)
    ds.time.encoding.update({"units": "hours since 1900-01-01", "dtype": "int64"})
    if os.path.exists(path):
        shutil.rmtree(path)
    ds.to_zarr(path, zarr_format=2, consolidated=True, encoding={v: {"compressors": None} for v in data})


def main():
    os.makedirs(OUT, exist_ok=True)
    lat = np.linspace(90, -90, 6)
    lon = np.arange(8) * 45.0
    times = pd.date_range("2020-01-01", periods=13, freq="1h")
    hours = ((times - pd.Timestamp("1900-01-01")) / pd.Timedelta("1h")).values.astype(np.int64)
    coords = {"time": times, "latitude": lat, "longitude": lon}
    dims3 = ("time", "level", "latitude", "longitude")
    pres = {"temperature": (dims3, np.stack([np.stack([field("temperature", h, l, lat, lon) for l in PLEVELS]) for h in hours]))}
    for v in ("surface_pressure", "total_precipitation", "geopotential_at_surface", "sea_ice_cover"):
        pres[v] = (("time", "latitude", "longitude"), np.stack([field(v, h, 0, lat, lon) for h in hours]))
    write(os.path.join(OUT, PRES), pres, dict(coords, level=np.array(PLEVELS, dtype=np.int64)))
    model = {"temperature": (("time", "hybrid", "latitude", "longitude"),
                             np.stack([np.stack([field("temperature", h, 1000 + l, lat, lon) for l in HYBRID]) for h in hours]))}
    write(os.path.join(OUT, MODEL), model, dict(coords, hybrid=np.array(HYBRID, dtype=np.int64)))

    from credit.datasets.gen_2.era5 import ARCOERA5Dataset

    for name, lc, levels in (("hybrid", "hybrid", HYBRID), ("level", "level", PLEVELS)):
        src = {k: dict(v, level_coord=lc, levels=levels) for k, v in SOURCE.items()}
        conf = {"source": src, "start_datetime": "2020-01-01T00", "end_datetime": "2020-01-01T12", "timestep": "6h",
                "forecast_len": 1, "history_len": 1}
        ds = ARCOERA5Dataset(conf, return_target=True)

        def local_fs(self=ds):
            self._fs = True
            self.pres_level_store = zarr.storage.LocalStore(os.path.join(OUT, PRES), read_only=True)
            self.mod_level_store = zarr.storage.LocalStore(os.path.join(OUT, MODEL), read_only=True)

        ds._init_fs = local_fs
        sample = {}
        for ft in ("prognostic", "diagnostic", "static"):
            ds._extract_field(ft, T, sample)
        for key, t in sample.items():
            np.save(os.path.join(OUT, f"expected_{name}_{key.replace('/', '__')}.npy"), t.numpy().astype(np.float32))
        variables = "\n".join("    " + line for line in yaml_vars().splitlines())
        extra = f'      model_level_path: "{MODEL}"\n' if lc == "hybrid" else ""
        with open(os.path.join(OUT, f"arco_{name}.yml"), "w") as fh:
            fh.write(f"""# CREDIT gen2 config over a tiny local copy of ARCO-ERA5's layout (made by
# models/make_arco_fixture.py); `path` and `model_level_path` are wxe's keys for the local copies.
save_loc: "save"
data:
  source:
    ARCO:
      dataset_type: "arco_era5"
      level_coord: "{lc}"
      levels: {levels}
      path: "{PRES}"
{extra}{variables}
  start_datetime: "2020-01-01T00"
  end_datetime: "2020-01-01T12"
  timestep: "6h"
  forecast_len: 1
""")


def yaml_vars():
    return """  variables:
    prognostic:
      vars_3D: ["temperature"]
      vars_2D: ["surface_pressure"]
    diagnostic:
      vars_2D: ["total_precipitation"]
    static:
      vars_2D: ["geopotential_at_surface", "sea_ice_cover"]"""


if __name__ == "__main__":
    main()
