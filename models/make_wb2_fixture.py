#!/usr/bin/env python3
"""A tiny local copy in WeatherBench2's ERA5 layout (tests/data/wb2_tiny): one zarr v2 store
as gs://weatherbench2/datasets/era5/1959-2023_01_10-6h-64x32_equiangular_conservative.zarr
holds it (xarray's to_zarr): dims (time, level, longitude, latitude) for upper-air variables,
(time, longitude, latitude) for surface ones, (longitude, latitude) for statics; latitudes
ascending; time in hours since 1959-01-01. Four days of 6-hourly made-up fields (a formula of
time, level, latitude and longitude, written also as expected_*.npy in (lat, lon) order), and
wb2_tiny.yml, a CREDIT gen2 config (dataset_type weatherbench2_era5, resolution 64x32) whose
source `path` (wxe's key) names the store.

Usage (any Python with numpy, xarray and zarr):
  python models/make_wb2_fixture.py
"""
import os

import numpy as np
import pandas as pd
import xarray as xr

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "wb2_tiny"))
STORE = "1959-2023_01_10-6h-64x32_equiangular_conservative.zarr"
LEVELS = [500, 850]  # a subset of the store's 13 levels, to stay small


def field(name, t, lev, lat, lon):
    """(len(lon), len(lat)) values of a variable at hour t and level lev (0 for 2D)."""
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon))  # (lon, lat)
    base = {"temperature": 250.0, "u_component_of_wind": 5.0, "2m_temperature": 280.0, "land_sea_mask": 0.5}[name]
    return (base + 10 * np.cos(la) + 3 * np.sin(lo + t / 24.0) + 0.01 * lev).astype(np.float32)


def main():
    os.makedirs(OUT, exist_ok=True)
    lat = np.linspace(-87.1875, 87.1875, 32)  # WeatherBench2's 64x32 equiangular grid (no poles)
    lon = np.arange(64) * 5.625
    times = pd.date_range("2020-01-01", periods=6, freq="6h")
    hours = ((times - pd.Timestamp("1959-01-01")) / pd.Timedelta("1h")).values.astype(np.int64)
    data = {}
    for v in ("temperature", "u_component_of_wind"):
        data[v] = (("time", "level", "longitude", "latitude"),
                   np.stack([np.stack([field(v, h, l, lat, lon) for l in LEVELS]) for h in hours]))
    data["2m_temperature"] = (("time", "longitude", "latitude"), np.stack([field("2m_temperature", h, 0, lat, lon) for h in hours]))
    data["land_sea_mask"] = (("longitude", "latitude"), field("land_sea_mask", 0, 0, lat, lon))
    ds = xr.Dataset(data, coords={"time": times, "level": np.array(LEVELS, dtype=np.int64), "longitude": lon, "latitude": lat})
    ds.time.encoding.update({"units": "hours since 1959-01-01", "dtype": "int64"})
    store = os.path.join(OUT, STORE)
    if os.path.exists(store):
        import shutil
        shutil.rmtree(store)
    enc = {v: {"compressors": None} for v in data}
    ds.to_zarr(store, zarr_format=2, consolidated=True, encoding=enc)
    # the values wxe must read, (lat, lon) as CREDIT transposes them: 2020-01-01T06, levels 500 and 850
    h = hours[1]
    for name, a in (("T500", field("temperature", h, 500, lat, lon)), ("T850", field("temperature", h, 850, lat, lon)),
                    ("t2m", field("2m_temperature", h, 0, lat, lon)), ("lsm", field("land_sea_mask", 0, 0, lat, lon))):
        np.save(os.path.join(OUT, f"expected_{name}.npy"), np.ascontiguousarray(a.T))
    with open(os.path.join(OUT, "wb2_tiny.yml"), "w") as fh:
        fh.write(f"""# CREDIT gen2 config over a tiny local copy of WeatherBench2's ERA5 layout (made by
# models/make_wb2_fixture.py); `path` is wxe's key for the local copy of the store.
save_loc: "save"
data:
  source:
    WBERA5:
      dataset_type: "weatherbench2_era5"
      resolution: "64x32"
      path: "{STORE}"
      levels: [500, 850]
      variables:
        prognostic:
          vars_3D: ["temperature"]
          vars_2D: ["2m_temperature"]
        static:
          vars_2D: ["land_sea_mask"]
  start_datetime: "2020-01-01T00"
  end_datetime: "2020-01-03T00"
  timestep: "6h"
  forecast_len: 1
""")


if __name__ == "__main__":
    main()
