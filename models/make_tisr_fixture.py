"""Golden values of CREDIT 2026's computed "tisr" source (credit/datasets/gen_2/tisr.py) for
tests/tisr_test.cpp, written to tests/data/tisr/.

Runs CREDIT's own TISRDataset (built from a gen2 data config, as MultiSourceDataset builds it)
and reads the sample's "<source>/dynamic_forcing/2d/tisr" tensor: top-of-atmosphere incident
solar radiation (J m-2) integrated over (t - timestep, t] on the config's grid. Cases: the
seasons and hours, a leap day, before 2000 (negative J2000 days), past the CMIP6 table's
observed years (2014), the table's first and last years (extrapolated half years; past
2262-04-11 CREDIT's __getitem__ fails encoding the time as int64 nanoseconds, so that case calls
the _extract_field it makes), windows that
cross a year boundary, the default 360 steps and the examples' 2160, an integration step that
is not a whole second, grids whose torch.linspace is inexact, a grid read from a netCDF file
(1-D axes) and a curvilinear one (2-D XLAT/XLONG with a leading size-1 dimension), and the
shapes whose float32 sum runs each of torch's summation paths (1, 5, 9 x 16, 35, 7 x 72
points). Also CREDIT's error for a window reaching before 1850.

torch runs with one thread, as in CREDIT's DataLoader workers (the column blocking of torch's
float32 sum depends on the thread count).

Run with a Python that has torch and miles-credit (2026.2):  python models/make_tisr_fixture.py
"""

import json
import os

import numpy as np
import pandas as pd
import torch
import xarray as xr

from credit.datasets.gen_2.tisr import TISRDataset, _get_latlon_grid

torch.set_num_threads(1)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tisr")
SOURCE = "SOLAR"
KEY = f"{SOURCE}/dynamic_forcing/2d/tisr"


def data_config(t, timestep, grid, steps):
    src = {
        "dataset_type": "tisr",
        "variables": {
            "prognostic": None,
            "diagnostic": None,
            "dynamic_forcing": {"vars_2D": ["tisr"]},
            "static": None,
        },
    }
    if steps is not None:
        src["num_integration_steps"] = steps
    src.update(grid)
    t = pd.Timestamp(t)
    return {
        "source": {SOURCE: src},
        "start_datetime": str(t - pd.Timedelta(days=1)),
        "end_datetime": str(t + pd.Timedelta(days=1)),
        "timestep": timestep,
        "forecast_len": 1,
    }


def unix_s(t):
    return int((pd.Timestamp(t) - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1))


def write_grids():
    # a non-uniform 1-D grid (Gaussian-like latitudes, longitudes from -180)
    lat = np.array([87.5, 52.25, 10.0, -0.5, -33.3, -89.9], dtype=np.float64)
    lon = np.array([-180.0, -97.5, -12.25, 0.0, 45.0, 133.7, 179.5], dtype=np.float64)
    xr.Dataset(coords={"latitude": ("latitude", lat), "longitude": ("longitude", lon)}).to_netcdf(
        os.path.join(OUT, "grid_1d.nc"), engine="scipy"
    )
    # curvilinear: XLAT/XLONG (Time, south_north, west_east) with Time of size 1, float32
    y, x = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    xlat = (25.0 + 3.1 * y + 0.7 * x).astype(np.float32)[None]
    xlong = (-110.0 + 4.3 * x - 0.9 * y).astype(np.float32)[None]
    xr.Dataset(
        {
            "XLAT": (("Time", "south_north", "west_east"), xlat),
            "XLONG": (("Time", "south_north", "west_east"), xlong),
        }
    ).to_netcdf(os.path.join(OUT, "grid_2d.nc"), engine="scipy")


def main():
    os.makedirs(OUT, exist_ok=True)
    write_grids()
    g9 = {"lat_spec": [90, -90, 9], "lon_spec": [0, 337.5, 16]}  # 144 points, the poles included
    g7 = {"lat_spec": [90, -90, 7], "lon_spec": [-180, 175, 72]}  # inexact linspace, 504 points
    g35 = {"lat_spec": [80, -70, 5], "lon_spec": [10, 310, 7]}  # 35 points
    g5 = {"lat_spec": [60, -60, 5], "lon_spec": [20, 20, 1]}  # 5 points
    g1 = {"lat_spec": [40, 40, 1], "lon_spec": [255, 255, 1]}  # one point
    f1 = {"latlon_grid_path": os.path.join(OUT, "grid_1d.nc")}
    f2 = {"latlon_grid_path": os.path.join(OUT, "grid_2d.nc")}
    cases = [
        # name, time, timestep, num_integration_steps (None: CREDIT's default), grid, grid name
        ("summer_6h", "2021-06-01 00:00", "6h", 2160, g9, "g9"),
        ("leap_day_1h", "2020-02-29 12:00", "1h", None, g9, "g9"),
        ("winter_solstice", "2019-12-21 18:00", "1h", 360, g9, "g9"),
        ("equinox_6h", "2016-09-22 06:00", "6h", 2160, g9, "g9"),
        ("before_2000", "1999-07-15 09:00", "3h", 1080, g9, "g9"),
        ("new_year_window", "2021-01-01 03:00", "6h", 2160, g9, "g9"),
        ("start_1979", "1979-01-01 06:00", "6h", 2160, g9, "g9"),
        ("future_2050", "2050-07-01 12:00", "6h", 2160, g9, "g9"),
        ("table_first_year", "1850-01-01 06:00", "6h", 2160, g9, "g9"),
        ("table_last_year", "2299-12-31 18:00", "6h", 2160, g9, "g9"),
        ("odd_step", "2022-03-10 15:00", "1h", 7, g9, "g9"),
        ("one_step", "2022-08-03 07:00", "1h", 1, g9, "g9"),
        ("inexact_grid", "2023-05-17 21:00", "6h", 2160, g7, "g7"),
        ("grid_35", "2024-10-02 02:00", "1h", 360, g35, "g35"),
        ("grid_5", "2024-10-02 14:00", "1h", 360, g5, "g5"),
        ("grid_1", "2024-04-20 20:00", "1h", 360, g1, "g1"),
        ("grid_1_short", "2024-04-20 20:00", "1h", 5, g1, "g1"),
        ("file_1d", "2018-11-11 11:00", "6h", 2160, f1, "grid_1d.nc"),
        ("file_2d", "2018-07-04 20:00", "1h", 360, f2, "grid_2d.nc"),
    ]
    index = {"credit_key": KEY, "units": "J m-2", "cases": [], "grids": {}, "errors": []}
    for name, t, timestep, steps, grid, gname in cases:
        ds = TISRDataset(data_config(t, timestep, grid, steps))
        if pd.Timestamp(t) < pd.Timestamp("2262-04-11"):
            v = ds[(pd.Timestamp(t), 0)]["input"][KEY]
        else:
            # __getitem__ encodes the sample's time as int64 nanoseconds (encode_time), which ends
            # in 2262: the field itself comes from the same _extract_field call __getitem__ makes
            sample = {}
            ds._extract_field("dynamic_forcing", pd.Timestamp(t), sample)
            v = sample[KEY]
        assert v.dtype == torch.float32 and v.shape[:2] == (1, 1), v.shape
        v = v[0, 0].numpy()
        np.save(os.path.join(OUT, f"{name}.npy"), v)
        if gname not in index["grids"]:
            lat, lon = ds.latitude[0].numpy(), ds.longitude[0].numpy()  # (ny, nx) float32 each
            np.save(os.path.join(OUT, f"lat_{gname}.npy"), lat)
            np.save(os.path.join(OUT, f"lon_{gname}.npy"), lon)
            entry = {k: grid[k] for k in ("lat_spec", "lon_spec") if k in grid}
            if "latlon_grid_path" in grid:
                entry["file"] = gname
            index["grids"][gname] = entry
        index["cases"].append(
            {
                "name": name,
                "time": t,
                "unix_s": unix_s(t),
                "timestep_s": int(pd.Timedelta(timestep).total_seconds()),
                "num_integration_steps": ds.num_integration_steps,
                "grid": gname,
                "shape": list(v.shape),
                "max": float(v.max()),
            }
        )
        print(f"{name}: max {v.max():.1f} J m-2, shape {v.shape}")
    # the axes of config/gen_2/examples/multi_source_data.yml's spec grid, whose float32
    # torch.linspace latitudes differ from a plain start + step * i at 54 of 192 points
    lat, lon = _get_latlon_grid(lat_spec=[90, -90, 192], lon_spec=[0, 358.75, 288])
    np.save(os.path.join(OUT, "axis_lat_90_-90_192.npy"), lat[0, :, 0].numpy())
    np.save(os.path.join(OUT, "axis_lon_0_358.75_288.npy"), lon[0, 0, :].numpy())
    # a window that reaches into 1849: CREDIT raises
    t = "1850-01-01 00:00"
    ds = TISRDataset(data_config(t, "6h", g9, 2160))
    try:
        ds[(pd.Timestamp(t), 0)]
        raise SystemExit("expected CREDIT to reject a window before 1850")
    except ValueError as e:
        index["errors"].append({"time": t, "unix_s": unix_s(t), "timestep_s": 21600, "credit_error": str(e)})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
