"""Fixture of `wxe score` (tests/score_plot_test.cpp): small forecast files on the grid of
tests/data/era5_tiny, as `wxe forecast` writes them, a climatology file, and the scores
WeatherBench 2 defines, computed here with numpy from the files as written (read back with
xarray) and the truth read from era5_tiny's files.

  weights: cell areas of latitude rows (sin(upper) - sin(lower), bounds half-way between rows
           and +-90), mean 1 (WB2 get_lat_weights); mean_w over latitude and longitude
  per init: mse, bias = mean_w(f - t), acc = mean_w(f't') / sqrt(mean_w(f'^2) mean_w(t'^2))
  over inits: means; rmse = sqrt(mean mse)

Usage: python models/make_score_fixture.py   (writes tests/data/score/)
"""
import os

import netCDF4
import numpy as np
import xarray as xr

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "tests", "data", "era5_tiny")
OUT = os.path.join(HERE, "..", "tests", "data", "score")
LEVELS = [500.0, 850.0]


def truth_at(t):
    """T (2 levels) and SP at time t (numpy datetime64) from era5_tiny's files."""
    year = str(t.astype("datetime64[Y]"))
    if year == "2020":
        ds = xr.open_dataset(os.path.join(TINY, "era5_2020.nc"))
    else:
        ds = xr.open_zarr(os.path.join(TINY, "era5_2021.zarr"), consolidated=False)
    s = ds.sel(time=t)
    return {"T": s["T"].sel(level=LEVELS).values.astype(np.float64), "SP": s["SP"].values.astype(np.float64)}


def grid():
    ds = xr.open_dataset(os.path.join(TINY, "era5_2020.nc"))
    return ds.latitude.values, ds.longitude.values, ds["T"].attrs, ds["SP"].attrs


def write_forecast(path, init, steps, fields, lat, lon, attrs):
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.createDimension("time", steps)
        nc.createDimension("level", len(LEVELS))
        nc.createDimension("latitude", len(lat))
        nc.createDimension("longitude", len(lon))
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "hours since " + str(init.astype("datetime64[s]")).replace("T", " ")
        t.calendar = "standard"
        t[:] = 6.0 * np.arange(1, steps + 1)
        v = nc.createVariable("level", "f8", ("level",))
        v.units = "hPa"
        v[:] = LEVELS
        v = nc.createVariable("latitude", "f8", ("latitude",))
        v.units = "degrees_north"
        v[:] = lat
        v = nc.createVariable("longitude", "f8", ("longitude",))
        v.units = "degrees_east"
        v[:] = lon
        for name, dims, digits in (("T", ("time", "level", "latitude", "longitude"), 2),
                                   ("SP", ("time", "latitude", "longitude"), 0)):
            v = nc.createVariable(name, "f4", dims, zlib=True, shuffle=True, least_significant_digit=digits)
            for a in ("units", "long_name"):
                if a in attrs[name]:
                    v.setncattr(a, attrs[name][a])
            v[:] = fields[name]


def weights(lat):
    order = np.argsort(lat)
    phi = np.deg2rad(lat[order])
    bounds = np.concatenate([[-np.pi / 2], (phi[:-1] + phi[1:]) / 2, [np.pi / 2]])
    area = np.sin(bounds[1:]) - np.sin(bounds[:-1])
    w = np.empty_like(area)
    w[order] = area
    return w / w.mean()


def stats(f, t, c, w):
    wm = lambda x: (x * w[:, None]).sum() / (w.sum() * x.shape[1])
    fa, ta = f - c, t - c
    return wm((f - t) ** 2), wm(f - t), wm(fa * ta) / np.sqrt(wm(fa ** 2) * wm(ta ** 2))


def main():
    os.makedirs(OUT, exist_ok=True)
    lat, lon, t_attrs, sp_attrs = grid()
    attrs = {"T": t_attrs, "SP": sp_attrs}
    rng = np.random.default_rng(44)
    inits = [np.datetime64("2020-12-31T12"), np.datetime64("2020-12-31T18")]
    steps = 2
    models = {"a": (1.5, 0.4), "b": (0.8, 0.2)}  # noise scale of T (K), bias of T
    files = {}
    for m, (noise, bias) in models.items():
        for i, init in enumerate(inits):
            f = {"T": np.empty((steps, 2, len(lat), len(lon))), "SP": np.empty((steps, len(lat), len(lon)))}
            for k in range(steps):
                tr = truth_at(init + np.timedelta64(6 * (k + 1), "h"))
                smooth = np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(lon))[None, :]
                f["T"][k] = tr["T"] + bias + noise * (k + 1) * (0.5 * smooth + rng.standard_normal(tr["T"].shape))
                f["SP"][k] = tr["SP"] + 80 * noise * (smooth + rng.standard_normal(tr["SP"].shape))
            path = os.path.join(OUT, f"{m}_{i + 1}.nc")
            write_forecast(path, init, steps, f, lat, lon, attrs)
            files.setdefault(m, []).append((path, init))
    # the climatology file: the mean of the data's 8 times, shifted (no grid point's truth)
    times = np.arange(np.datetime64("2020-12-31T00"), np.datetime64("2021-01-02T00"), np.timedelta64(6, "h"))
    all_t = [truth_at(t) for t in times]
    clim = {v: np.mean([x[v] for x in all_t], axis=0) for v in ("T", "SP")}
    clim["T"] += 0.3
    with netCDF4.Dataset(os.path.join(OUT, "clim.nc"), "w", format="NETCDF4") as nc:
        nc.createDimension("level", 2)
        nc.createDimension("latitude", len(lat))
        nc.createDimension("longitude", len(lon))
        nc.createVariable("level", "f8", ("level",))[:] = LEVELS
        nc.createVariable("latitude", "f8", ("latitude",))[:] = lat
        nc.createVariable("longitude", "f8", ("longitude",))[:] = lon
        nc.createVariable("T", "f4", ("level", "latitude", "longitude"), zlib=True)[:] = clim["T"]
        nc.createVariable("SP", "f4", ("latitude", "longitude"), zlib=True)[:] = clim["SP"]
    clim_file = {v: xr.open_dataset(os.path.join(OUT, "clim.nc"))[v].values.astype(np.float64) for v in ("T", "SP")}
    # the training period's mean: data.start_datetime..end_datetime of era5_tiny/config.yml
    train = np.arange(np.datetime64("2020-12-31T00"), np.datetime64("2021-01-01T18"), np.timedelta64(6, "h"))
    tr_t = [truth_at(t) for t in train]
    clim_train = {v: np.mean([x[v] for x in tr_t], axis=0) for v in ("T", "SP")}
    w = weights(lat)
    rows = ["climatology,model,variable,level,lead_hours,n_init,rmse,bias,acc,mse_1,mse_2"]
    for cname, c in (("file", clim_file), ("training", clim_train)):
        for m in models:
            for var, levels in (("T", [0, 1]), ("SP", [None])):
                for li in levels:
                    for k in range(steps):
                        per = []
                        for path, init in files[m]:
                            ds = xr.open_dataset(path)
                            f = ds[var].values.astype(np.float64)[k]
                            tr = truth_at(init + np.timedelta64(6 * (k + 1), "h"))[var]
                            cc = c[var]
                            if li is not None:
                                f, tr, cc = f[li], tr[li], cc[li]
                            per.append(stats(f, tr, cc, w))
                        per = np.array(per)
                        lev = "" if li is None else "%g" % LEVELS[li]
                        rows.append(f"{cname},{m}_1,{var},{lev},{6 * (k + 1)},{len(per)},{np.sqrt(per[:, 0].mean()):.12g},"
                                    f"{per[:, 1].mean():.12g},{per[:, 2].mean():.12g},{per[0, 0]:.12g},{per[1, 0]:.12g}")
    with open(os.path.join(OUT, "expected_scores.csv"), "w") as fh:
        fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
