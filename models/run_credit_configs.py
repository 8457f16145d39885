#!/usr/bin/env python3
"""Run wxe on CREDIT's own shipped configs, as a CREDIT user would: each config is loaded and
only its paths, dates, grid size and model size are changed; synthetic data, scalers and an
ONNX export of the config's CREDIT model class are written into a temporary directory; then
`wxe finetune CONFIG --steps 3` and `wxe forecast CONFIG --steps 2` run on it, and the exit
code and first error line of each are recorded (docs/credit-configs.md holds a run's table).

What is changed in each config (nothing else):
- paths: every data/validation path (the file name kept, the directory the temp dir), the
  scaler files (preblocks' scaler_path / mean_path / std_path, loss.args.scaler_path,
  gen1 data.mean_path / std_path), loss.latitude_weights, save_loc, and any other absolute path;
- dates: a few days of 2019 (gen1: train_years / valid_years 2019 and 2020, files holding a
  few days of each year);
- grid size: the smallest grid >= 16 x 32 for which the model's padded dims are divisible by
  the windows at every stage (its padding_conf and window sizes kept);
- model size: dim (16, 32, 64, 128), depth (1, 1, 1, 1), dim_head 8.
Dataset types other than `local` (arco_era5, weatherbench2_era5, hrrr, tisr) are kept as they
are: their data is remote (tisr is computed), so nothing is written for them.

Data: netCDF (or zarr v2, where the path names .zarr) per year with dims (time, level,
latitude, longitude) under the config's variable and level coordinate names, values in [1, 2]
(positive for log/sqrt transforms); statics without time. Scalers: mean/std netCDF of the
synthetic data (gen1 layout: 3D variables per `level`, 2D scalars) and the bridgescaler JSON
made from them by CREDIT's own converter (credit.cli._convert._build_bridgescaler_jsons, what
`credit convert` runs), one per source, merged. Model: credit.models.load_model(conf) on the
config's model section at the small size (a config without a model section gets a plain
wxformer with its data's channel counts), exported with models/export_credit.py's export_ts.

Usage (a python with torch, miles-credit 2026.2, xarray, netCDF4, zarr, bridgescaler, onnx):
  $WXE_PYTHON models/run_credit_configs.py --wxe build/wxe --credit-repo CREDIT_CHECKOUT \
      [--work DIR] [--only NAME_SUBSTRING ...] [--json results.json] [--markdown table.md]
  $WXE_PYTHON models/run_credit_configs.py --wxe build/wxe --configs DIR_OF_YML
--credit-repo takes a checkout or a bare git directory (read with `git show HEAD:path`).
"""
from __future__ import annotations

import argparse
import copy
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIG_LIST = ["config/example-v2026.2.yml", "config/gen_1/example/example-v2026.1.0.yml"]
SMALL_DIM = [16, 32, 64, 128]
SMALL_DEPTH = [1, 1, 1, 1]
YEAR = 2019
VTYPES = ("prognostic", "diagnostic", "dynamic_forcing", "static")


# ----------------------------------------------------------------------------- config source
def read_configs(args):
    """[(name, text, note)] in a fixed order."""
    out = []
    if args.configs:
        for f in sorted(glob.glob(os.path.join(args.configs, "*.yml")) + glob.glob(os.path.join(args.configs, "*.yaml"))):
            out.append((os.path.basename(f), open(f).read(), ""))
        return out
    repo = args.credit_repo
    if os.path.isdir(os.path.join(repo, "config")):  # a checkout
        names = sorted(os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, "config/gen_2/**/*.yml"), recursive=True))
        names += CONFIG_LIST

        def show(p):
            full = os.path.join(repo, p)
            note = ""
            if os.path.islink(full):
                note = "symlink to " + os.readlink(full)
            return open(full).read(), note
    else:  # a bare git directory
        ls = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", "HEAD", "config/gen_2"],
                            capture_output=True, text=True, check=True).stdout.split()
        names = sorted(p for p in ls if p.endswith(".yml")) + CONFIG_LIST

        def show(p):
            mode = subprocess.run(["git", "-C", repo, "ls-tree", "HEAD", p], capture_output=True, text=True,
                                  check=True).stdout.split()[0]
            text = subprocess.run(["git", "-C", repo, "show", "HEAD:" + p], capture_output=True, text=True,
                                  check=True).stdout
            if mode == "120000":  # a symlink: read its target
                target = os.path.normpath(os.path.join(os.path.dirname(p), text.strip()))
                return show(target)[0], "symlink to " + text.strip()
            return text, ""
    for n in names:
        text, note = show(n)
        out.append((n, text, note))
    return out


# ----------------------------------------------------------------------------- helpers
class FlowSeqDumper(yaml.SafeDumper):
    """Lists of scalars as flow sequences [a, b, c], as CREDIT's configs (and `credit convert`) write them."""

    def represent_sequence(self, tag, sequence, flow_style=None):
        if all(isinstance(x, (int, float, str, bool, type(None))) for x in sequence):
            flow_style = True
        return super().represent_sequence(tag, sequence, flow_style=flow_style)


FlowSeqDumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v))
def lcm(a, b):
    return a * b // math.gcd(a, b)


def pad_pair(v):
    if v is None:
        return [0, 0]
    if isinstance(v, (int, float)):
        return [int(v), int(v)]
    return [int(v[0]), int(v[1])]


def grid_for(model):
    """Smallest (H, W) >= (16, 32) whose padded size suits every stage's windows."""
    strides = model.get("cross_embed_strides", [2, 2, 2, 2])
    gws = model.get("global_window_size", [8, 4, 2, 1])
    lws = model.get("local_window_size", 4)
    lws = lws if isinstance(lws, (list, tuple)) else [lws] * len(gws)
    m = 1
    s = 1
    for k in range(len(gws)):
        s *= strides[k]
        m = lcm(m, s * lcm(int(gws[k]), int(lws[k])))
    pc = model.get("padding_conf") or {}
    if pc.get("activate"):
        plat, plon = pad_pair(pc.get("pad_lat")), pad_pair(pc.get("pad_lon"))
    elif "pad_lat" in model or "pad_lon" in model:  # older flat keys
        plat, plon = pad_pair(model.get("pad_lat")), pad_pair(model.get("pad_lon"))
    else:
        plat, plon = [0, 0], [0, 0]

    def smallest(lo, pad):
        n = max(lo, max(pad))
        while (n + sum(pad)) % m:
            n += 1
        return n

    h = smallest(16, plat)
    w = smallest(32, plon)
    if w % 2:
        w2 = w + 1
        while (w2 + sum(plon)) % m:
            w2 += 1
        w = w2
    return h, w


def vars_of(vblock):
    v3 = list((vblock or {}).get("vars_3D") or [])
    v2 = list((vblock or {}).get("vars_2D") or [])
    return v3, v2


def sources_of(conf):
    """gen2 data.source -> {name: source dict}; gen1 -> None."""
    d = conf.get("data") or {}
    return d.get("source") if isinstance(d.get("source"), dict) else None


def reroot(path, tmp):
    """The same file name under tmp (directories dropped)."""
    path = str(path)
    return os.path.join(tmp, os.path.basename(path.rstrip("/")))


def concrete_name(template, when):
    """A file name matching a path template (strftime codes, at most one '*') for a date."""
    name = when.strftime(template) if "%" in template else template
    if "*" in name:
        name = name.replace("*", "")
        if not re.search(r"\.(nc|zarr|nc4)$", name):
            name += ".nc"
    return name


def is_zarr(name):
    return name.endswith(".zarr") or ".zarr" in name


# ----------------------------------------------------------------------------- data
def field(rng, shape):
    return (1.0 + rng.random(shape)).astype(np.float32)


def write_ds(ds, path):
    if is_zarr(os.path.basename(path)):
        shutil.rmtree(path, ignore_errors=True)
        ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True)
    else:
        enc = {v: {"_FillValue": None} for v in list(ds.data_vars) + list(ds.coords)}
        ds.to_netcdf(path, engine="netcdf4", encoding=enc)


def write_group(path, times, level_coord, levels, v3, v2, lat, lon, static, rng):
    import xarray as xr

    coords = {"latitude": ("latitude", lat), "longitude": ("longitude", lon)}
    data = {}
    H, W = len(lat), len(lon)
    if static:
        for v in v2:
            data[v] = (("latitude", "longitude"), field(rng, (H, W)))
        for v in v3:
            coords[level_coord] = (level_coord, np.asarray(levels, dtype=np.float64))
            data[v] = ((level_coord, "latitude", "longitude"), field(rng, (len(levels), H, W)))
    else:
        coords["time"] = ("time", np.asarray(times, dtype="datetime64[ns]"))
        T = len(times)
        if v3:
            coords[level_coord] = (level_coord, np.asarray(levels, dtype=np.float64))
        for v in v3:
            data[v] = (("time", level_coord, "latitude", "longitude"), field(rng, (T, len(levels), H, W)))
        for v in v2:
            data[v] = (("time", "latitude", "longitude"), field(rng, (T, H, W)))
    write_ds(xr.Dataset(data, coords=coords), path)


def write_year(path, times, level_coord, levels, v3, v2, lat, lon, chunk=73):
    """A whole year of spatially constant fields (a value per variable and step), appended in
    pieces of `chunk` steps, compressed (zarr: the default compressor; netCDF: zlib)."""
    import xarray as xr

    H, W = len(lat), len(lon)
    zarr = is_zarr(os.path.basename(path))
    shutil.rmtree(path, ignore_errors=True)
    if not zarr and os.path.exists(path):
        os.remove(path)
    pieces = []
    for i0 in range(0, len(times), chunk):
        tt = times[i0:i0 + chunk]
        T = len(tt)
        ramp = (1.0 + 0.5 * ((np.arange(i0, i0 + T) % 97) / 97.0)).astype(np.float32)
        coords = {"latitude": ("latitude", lat), "longitude": ("longitude", lon),
                  "time": ("time", np.asarray(tt, dtype="datetime64[ns]"))}
        if v3:
            coords[level_coord] = (level_coord, np.asarray(levels, dtype=np.float64))
        data = {}
        for k, v in enumerate(v3):
            a = np.broadcast_to((ramp + 0.01 * k)[:, None, None, None], (T, len(levels), H, W))
            data[v] = (("time", level_coord, "latitude", "longitude"), np.ascontiguousarray(a))
        for k, v in enumerate(v2):
            a = np.broadcast_to((ramp + 0.01 * (k + 50))[:, None, None], (T, H, W))
            data[v] = (("time", "latitude", "longitude"), np.ascontiguousarray(a))
        ds = xr.Dataset(data, coords=coords)
        if zarr:
            enc = {v: {"chunks": (1,) + ds[v].shape[1:]} for v in ds.data_vars} if i0 == 0 else None
            if i0 == 0:
                ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True, encoding=enc)
            else:
                ds.to_zarr(path, append_dim="time", zarr_format=2, consolidated=True)
        else:
            pieces.append(ds)
    if not zarr:
        ds = xr.concat(pieces, dim="time")
        enc = {v: {"zlib": True, "complevel": 1, "_FillValue": None, "chunksizes": (1,) + ds[v].shape[1:]}
               for v in ds.data_vars}
        ds.to_netcdf(path, engine="netcdf4", encoding=enc)


def write_wb2(path, times, levels, groups, lat, lon, rng):
    """One zarr v2 store in WeatherBench2's ERA5 layout: (time, level, longitude, latitude) upper-air,
    (time, longitude, latitude) surface, (longitude, latitude) statics, latitudes ascending, time in
    hours since 1959-01-01 (as models/make_wb2_fixture.py)."""
    import pandas as pd
    import xarray as xr

    H, W = len(lat), len(lon)
    T = len(times)
    data = {}
    for (t, dim), names in groups.items():
        for v in names:
            if t == "static":
                data[v] = (("longitude", "latitude"), field(rng, (W, H)))
            elif dim == "3d":
                data[v] = (("time", "level", "longitude", "latitude"), field(rng, (T, len(levels), W, H)))
            else:
                data[v] = (("time", "longitude", "latitude"), field(rng, (T, W, H)))
    ds = xr.Dataset(data, coords={"time": pd.DatetimeIndex(times), "level": np.asarray(levels, dtype=np.int64),
                                  "longitude": lon, "latitude": np.sort(lat)})
    ds.time.encoding.update({"units": "hours since 1959-01-01", "dtype": "int64"})
    shutil.rmtree(path, ignore_errors=True)
    ds.to_zarr(path, zarr_format=2, consolidated=True)


def write_arco(pres_path, model_path, level_coord, times, levels, groups, lat, lon, rng):
    """Local copies in Google's ARCO-ERA5 layout (as models/make_arco_fixture.py): the
    pressure-level store holds every 2D variable, statics too, with a time axis, and the 3D ones
    on `level`; with level_coord hybrid the 3D ones are in the model-level store on `hybrid`.
    Latitudes descending, time in hours since 1900-01-01."""
    import pandas as pd
    import xarray as xr

    H, W, T = len(lat), len(lon), len(times)
    pres, model = {}, {}
    for (t, dim), names in groups.items():
        for v in names:
            if dim == "3d":
                (model if level_coord == "hybrid" else pres)[v] = (("time", level_coord, "latitude", "longitude"),
                                                                   field(rng, (T, len(levels), H, W)))
            else:
                pres[v] = (("time", "latitude", "longitude"), field(rng, (T, H, W)))
    for path, data, lc in ((pres_path, pres, "level"), (model_path, model, "hybrid")):
        if not data:
            continue
        coords = {"time": pd.DatetimeIndex(times), "latitude": lat, "longitude": lon}
        if any(len(d[0]) == 4 for d in data.values()):
            coords[lc] = np.asarray(levels, dtype=np.int64)
        ds = xr.Dataset(data, coords=coords)
        ds.time.encoding.update({"units": "hours since 1900-01-01", "dtype": "int64"})
        shutil.rmtree(path, ignore_errors=True)
        ds.to_zarr(path, zarr_format=2, consolidated=True)


def timestep_hours(conf):
    d = conf.get("data") or {}
    ts = str(d.get("timestep", "6h"))
    m = re.match(r"^(\d+)\s*h", ts)
    if m:
        return int(m.group(1))
    if "lead_time_periods" in d:
        return int(d["lead_time_periods"])
    return 6


# ----------------------------------------------------------------------------- scalers
def write_stats(tmp, groups_by_source, levels_by_source):
    """mean/std netCDF in CREDIT's gen1 layout (3D per `level`, 2D scalars), all sources' variables."""
    import xarray as xr

    mean, std = {}, {}
    for src, groups in groups_by_source.items():
        levels = levels_by_source[src]
        for (ft, dim), names in groups.items():
            for v in names:
                if dim == "3d":
                    mean[v] = (("level",), np.full(len(levels), 1.5, np.float32))
                    std[v] = (("level",), np.full(len(levels), 0.3, np.float32))
                elif v == "tisr":  # computed (J m-2 over the timestep): its own scale, not the files' [1, 2]
                    mean[v] = ((), np.float32(1.0e6))
                    std[v] = ((), np.float32(1.0e6))
                else:
                    mean[v] = ((), np.float32(1.5))
                    std[v] = ((), np.float32(0.3))
    lev = None
    for src in levels_by_source:
        if levels_by_source[src]:
            lev = levels_by_source[src]
            break
    coords = {"level": ("level", np.asarray(lev, np.float64))} if lev else {}
    mp, sp = os.path.join(tmp, "stats_mean.nc"), os.path.join(tmp, "stats_std.nc")
    xr.Dataset(mean, coords=coords).to_netcdf(mp)
    xr.Dataset(std, coords=coords).to_netcdf(sp)
    return mp, sp


def write_bridgescaler(out, mp, sp, groups_by_source, spatial=(), npoints=0):
    """CREDIT's converter per source, the dicts merged into one {input|target: {source: ...}} file;
    the keys in `spatial` (a block's spatial_variables) get a grid-wise scaler instead: bridgescaler's
    DStandardScalerTensor with one mean and variance per grid point (CREDIT flattens such a variable
    to (batch, lat * lon) before the scaler)."""
    from credit.cli._convert import _build_bridgescaler_jsons

    merged = {"input": {}, "target": {}}
    with tempfile.TemporaryDirectory() as t:
        for src, groups in groups_by_source.items():
            pre, post = os.path.join(t, src + "_pre.json"), os.path.join(t, src + "_post.json")
            _build_bridgescaler_jsons(mp, sp, groups, pre, post, source_name=src)
            d = json.load(open(pre))
            for side in ("input", "target"):
                merged[side].update(d.get(side, {}))
        if spatial:
            import torch
            from bridgescaler import save_scaler_dict
            from bridgescaler.distributed_tensor import DStandardScalerTensor

            sc = DStandardScalerTensor(channels_last=False)
            sc.mean_x_ = torch.full((npoints,), 1.5, dtype=torch.float32)
            sc.var_x_ = torch.full((npoints,), 0.09, dtype=torch.float32)
            sc.x_columns_ = list(range(npoints))
            sc._fit = True
            sc.n_ = 1
            f = os.path.join(t, "spatial.json")
            save_scaler_dict({"x": {"x": {"x": sc}}}, f)
            text = json.load(open(f))["x"]["x"]["x"]
            for side in ("input", "target"):
                for src, d in merged[side].items():
                    for key in d:
                        if key in spatial:
                            d[key] = text
    with open(out, "w") as fh:
        json.dump(merged, fh)


# ----------------------------------------------------------------------------- model
def default_model(n3, levels, n2, n_in_only, n_out_only):
    return {"type": "wxformer", "frames": 1, "levels": max(levels, 1), "channels": n3, "surface_channels": n2,
            "input_only_channels": n_in_only, "output_only_channels": n_out_only, "patch_width": 1,
            "patch_height": 1, "frame_patch_size": 1, "global_window_size": [4, 2, 2, 1], "local_window_size": 2,
            "cross_embed_strides": [2, 2, 2, 2], "interp": True, "use_spectral_norm": True,
            "padding_conf": {"activate": False}}


def export_model(conf, path, log):
    import inspect

    import torch
    from credit.models import _load_model_entry, load_model
    from export_credit import export_ts

    m = conf["model"]
    cls, _ = _load_model_entry(m["type"])
    params = inspect.signature(cls.__init__).parameters
    if "dim_head" in params:
        m["dim_head"] = 8
    note = ""
    torch.manual_seed(0)
    try:
        if sources_of(conf) is not None:
            # credit/applications/train_gen2.py: model.post_conf is dropped (with a warning), then load_model
            conf_p = copy.deepcopy(conf)
            if (conf_p["model"].pop("post_conf", None) or {}).get("activate"):
                note = "model.post_conf dropped before building the model, as CREDIT's train_gen2 does"
        else:
            # the gen1 trainer runs credit_main_parser first (it fills post_conf's indices)
            from credit.parser import credit_main_parser

            conf_p = credit_main_parser(copy.deepcopy(conf), parse_training=True, parse_predict=False)
        model = load_model(conf_p)
    except Exception as e:  # noqa: BLE001
        if (m.get("post_conf") or {}).get("activate"):
            note = f"CREDIT could not build the model with its post_conf ({type(e).__name__}: {str(e)[:120]}); exported with post_conf off"
            conf2 = copy.deepcopy(conf)
            conf2["model"]["post_conf"] = {"activate": False}
            model = load_model(conf2)
        else:
            raise
    frames = int(m.get("frames", 1))
    cin = int(m.get("channels", 0)) * int(m.get("levels", 0)) + int(m.get("surface_channels", 0)) + int(
        m.get("input_only_channels", 0))
    x = torch.randn(1, cin, frames, int(m["image_height"]), int(m["image_width"]))
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()
    with torch.no_grad():
        y = model(x)
    export_ts(model, x, path)
    log.write(f"exported {type(model).__module__}.{type(model).__name__} x {tuple(x.shape)} -> y {tuple(y.shape)}\n")
    return note, tuple(x.shape), tuple(y.shape)


# ----------------------------------------------------------------------------- one config
def walk_paths(obj, tmp, skip=()):
    """Rewrite every remaining absolute path string under tmp (same file name)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in skip:
                continue
            if isinstance(v, str) and (v.startswith("/") or v.startswith("$")) and "/" in v:
                obj[k] = reroot(v, tmp)
            else:
                walk_paths(v, tmp, skip)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, str) and (v.startswith("/") or v.startswith("$")) and "/" in v:
                obj[i] = reroot(v, tmp)
            else:
                walk_paths(v, tmp, skip)


def prepare(name, text, tmp, log, variant=False):
    """Write the adapted config, data, scalers and model into tmp; return (config path, init, notes)."""
    import datetime as dt

    conf = yaml.safe_load(text)
    notes = []
    if variant:
        notes += make_variant(conf)
    rng = np.random.default_rng(0)
    data = conf.setdefault("data", {})
    srcs = sources_of(conf)
    hours = timestep_hours(conf)
    nsteps = 12 if hours >= 6 else 24
    t0 = dt.datetime(YEAR, 1, 1)
    times = [t0 + dt.timedelta(hours=hours * i) for i in range(nsteps + 4)]
    train_end = times[7]
    valid_start, valid_end = times[8], times[nsteps - 1]

    # --- model section / grid
    model = conf.get("model")
    if not model or "type" not in model:
        notes.append("no model section in the config: a plain wxformer with its data's channel counts")
        n3 = n2 = nin = nout = 0
        nlev = 0
        for s in (srcs or {}).values():
            vv = s.get("variables") or {}
            lv = len(s.get("levels") or [])
            p3, p2 = vars_of(vv.get("prognostic"))
            if p3:
                nlev = max(nlev, lv)
            n3 += len(p3)
            n2 += len(p2)
            for t in ("static", "dynamic_forcing"):
                a, b = vars_of(vv.get(t))
                nin += len(b) + len(a) * lv
            a, b = vars_of(vv.get("diagnostic"))
            nout += len(b) + len(a) * lv
        model = default_model(n3, nlev, n2, nin, nout)
        conf["model"] = model
    pc = model.get("padding_conf") or {}
    for k in ("pad_lat", "pad_lon"):
        if pc.get("activate") and isinstance(pc.get(k), (int, float)):
            # CREDIT 2026.2's boundary_padding iterates the value: a number is a TypeError there
            notes.append(f"model.padding_conf.{k}: {pc[k]} made [{pc[k]}, {pc[k]}] (CREDIT 2026.2 cannot build "
                         f"the model with a number: TypeError 'int' object is not iterable in boundary_padding)")
            pc[k] = [pc[k], pc[k]]
    H, W = grid_for(model)
    model["image_height"], model["image_width"] = H, W
    model["dim"] = list(SMALL_DIM)
    model["depth"] = list(SMALL_DEPTH)
    lat = np.linspace(90, -90, H)
    lon = np.arange(W) * (360.0 / W)

    # --- data
    groups_by_source, levels_by_source = {}, {}
    static_file = None
    if srcs is not None:
        files = {}
        for section in ("data", "validation_data"):
            sec = conf.get(section)
            if not isinstance(sec, dict):
                continue
            if section == "data":
                sec["start_datetime"], sec["end_datetime"] = t0.isoformat(), train_end.isoformat()
            else:
                sec["start_datetime"], sec["end_datetime"] = valid_start.isoformat(), valid_end.isoformat()
            for sname, s in (sec.get("source") or {}).items():
                vv = s.get("variables") or {}
                levels = list(s.get("levels") or [])
                level_coord = s.get("level_coord") or "level"
                has3 = any(vars_of(vv.get(t))[0] for t in VTYPES)
                if has3 and not levels:
                    levels = list(range(int(model.get("levels", 2))))
                    if section == "data":
                        notes.append(f"source {sname}: no levels in the config, the files hold {len(levels)}")
                groups = groups_by_source.setdefault(sname, {})
                levels_by_source[sname] = levels
                for t in VTYPES:
                    a, b = vars_of(vv.get(t))
                    if a:
                        groups[(t, "3d")] = a
                    if b:
                        groups[(t, "2d")] = b
                if s.get("dataset_type") == "tisr":
                    if "lat_spec" in s:
                        s["lat_spec"] = [90.0, -90.0, H]
                    if "lon_spec" in s:
                        s["lon_spec"] = [0.0, 360.0 - 360.0 / W, W]
                if s.get("dataset_type") == "weatherbench2_era5" and s.get("path") and section == "data":
                    s["path"] = os.path.join(tmp, os.path.basename(s["path"]))
                    write_wb2(s["path"], times, levels, groups, lat, lon, rng)
                    log.write(f"wrote WeatherBench2-layout store {os.path.basename(s['path'])}\n")
                    continue
                if s.get("dataset_type") == "weatherbench2_era5" and s.get("path"):
                    s["path"] = os.path.join(tmp, os.path.basename(s["path"]))
                if s.get("dataset_type") == "arco_era5" and s.get("path"):
                    for k in ("path", "model_level_path"):
                        if s.get(k):
                            s[k] = os.path.join(tmp, os.path.basename(s[k]))
                    if section == "data":
                        write_arco(s["path"], s.get("model_level_path"), level_coord, times, levels, groups, lat, lon, rng)
                        log.write(f"wrote ARCO-ERA5-layout stores for {sname}\n")
                    continue
                if s.get("dataset_type", "local") != "local":
                    continue
                # group variable types by path template
                by_path = {}
                for t in VTYPES:
                    blk = vv.get(t)
                    if not blk or "path" not in blk:
                        continue
                    tpl = os.path.basename(str(blk["path"]).rstrip("/"))
                    blk["path"] = os.path.join(tmp, tpl)
                    a, b = vars_of(blk)
                    # templates that name the same file (era5_%Y.zarr, era5_%Y*.zarr) share it
                    e = by_path.setdefault((concrete_name(tpl, t0), t == "static"), [[], []])
                    e[0] += [x for x in a if x not in e[0]]
                    e[1] += [x for x in b if x not in e[1]]
                # validation_data's own files too (where it names others: camulator's)
                for (fname, static), (a, b) in by_path.items():
                    # a file several sources name holds the union of their variables and levels
                    e = files.setdefault((fname, static), [level_coord, [], [], []])
                    e[1] += [x for x in levels if x not in e[1]]
                    e[2] += [x for x in a if x not in e[2]]
                    e[3] += [x for x in b if x not in e[3]]
        for (fname, static), (level_coord, levels, a, b) in files.items():
            f = os.path.join(tmp, fname)
            levels = sorted(levels)
            if static:
                static_file = static_file or f
                write_group(f, None, level_coord, levels, a, b, lat, lon, True, rng)
            else:
                write_group(f, times, level_coord, levels, a, b, lat, lon, False, rng)
            log.write(f"wrote {os.path.basename(f)}: 3D {a} 2D {b}\n")
    else:  # gen1 flat schema
        levels = list(data.get("level_ids") or [])
        lc = "level"
        groups = {}
        spec = [("variables", "save_loc", "prognostic", "3d"), ("surface_variables", "save_loc_surface", "prognostic", "2d"),
                ("dynamic_forcing_variables", "save_loc_dynamic_forcing", "dynamic_forcing", "2d"),
                ("diagnostic_variables", "save_loc_diagnostic", "diagnostic", "2d"),
                ("static_variables", "save_loc_static", "static", "2d")]
        by_path = {}
        for vk, pk, t, dim in spec:
            names = list(data.get(vk) or [])
            if not names:
                continue
            groups[(t, dim)] = names
            tpl = os.path.basename(str(data.get(pk) or data["save_loc"]).rstrip("/"))
            data[pk] = os.path.join(tmp, tpl)
            e = by_path.setdefault((tpl, t == "static"), [[], []])
            (e[0] if dim == "3d" else e[1]).extend(names)
        data["train_years"] = [YEAR, YEAR + 1]
        data["valid_years"] = [YEAR + 1, YEAR + 2]
        notes.append(f"gen1: train_years [{YEAR}, {YEAR + 1}], valid_years [{YEAR + 1}, {YEAR + 2}]: a file per "
                     f"year named prefix + year, each holding the whole year")
        for (tpl, static), (a, b) in by_path.items():
            if static:
                f = os.path.join(tmp, concrete_name(tpl.replace("*", ""), t0))
                static_file = static_file or f
                write_group(f, None, lc, levels, a, b, lat, lon, True, rng)
            else:
                for y in (YEAR, YEAR + 1):
                    # gen1 years are whole years (credit convert: start .. end of the years), so the
                    # files hold the whole year, constant fields per step (they compress to little)
                    ty = [dt.datetime(y, 1, 1) + dt.timedelta(hours=hours * i)
                          for i in range((dt.datetime(y + 1, 1, 1) - dt.datetime(y, 1, 1)).days * 24 // hours)]
                    # the year right after the glob's prefix (wxe reads gen1 'X*' as 'X%Y*')
                    yt = tpl if "%Y" in tpl else (tpl.replace("*", "%Y*", 1) if "*" in tpl else tpl)
                    if not re.search(r"\.(nc|zarr)", yt):
                        yt += ".zarr"
                    f = os.path.join(tmp, concrete_name(yt, ty[0]))
                    write_year(f, ty, lc, levels, a, b, lat, lon)
                    log.write(f"wrote {os.path.basename(f)}: {len(ty)} steps, 3D {a} 2D {b}\n")
        for k in ("save_loc_physics",):
            if k in data:
                data[k] = static_file or reroot(data[k], tmp)
        groups_by_source["ERA5"] = groups
        levels_by_source["ERA5"] = levels

    # --- scalers
    mp, sp = write_stats(tmp, groups_by_source, levels_by_source)
    scaler_files = set()

    def fix_block(blk):
        if not isinstance(blk, dict):
            return
        a = blk.get("args") or {}
        if "scaler_path" in a:
            a["scaler_path"] = reroot(a["scaler_path"], tmp)
            scaler_files.add(a["scaler_path"])
        for k, src in (("mean_path", mp), ("std_path", sp)):
            if k in a:
                a[k] = reroot(a[k], tmp)
                shutil.copy(src, a[k])

    for sec in ("preblocks", "postblocks"):
        blocks = conf.get(sec) or {}
        for k, v in list(blocks.items()):
            if isinstance(v, dict) and "type" in v:
                fix_block(v)
            elif isinstance(v, dict):
                for v2 in v.values():
                    fix_block(v2)
    loss = conf.get("loss") or {}
    la = loss.get("args") if isinstance(loss.get("args"), dict) else loss
    if "scaler_path" in la:
        la["scaler_path"] = reroot(la["scaler_path"], tmp)
        scaler_files.add(la["scaler_path"])
    if "latitude_weights" in la:
        la["latitude_weights"] = static_file or os.path.join(tmp, "latw.nc")
    if srcs is None:
        for k, src in (("mean_path", mp), ("std_path", sp)):
            if k in data:
                data[k] = reroot(data[k], tmp)
                shutil.copy(src, data[k])
    spatial = set()
    for sec in ("preblocks", "postblocks"):
        for v in (conf.get(sec) or {}).values():
            for blk in (v.values() if isinstance(v, dict) and "type" not in v else [v]):
                if isinstance(blk, dict):
                    spatial.update((blk.get("args") or {}).get("spatial_variables") or [])
    for f in scaler_files:
        write_bridgescaler(f, mp, sp, groups_by_source, spatial, H * W)
        log.write(f"bridgescaler {os.path.basename(f)} sources {list(groups_by_source)}\n")

    # --- the physics postblocks' statics (save_loc_physics): the grid in 2-D, hybrid coefficients
    # (half levels with midpoint, else full levels) and a surface geopotential
    per_step = (conf.get("postblocks") or {}).get("per_step") or {}
    for blk in (per_step.values() if isinstance(per_step, dict) else []):
        a = (blk.get("args") or {}) if isinstance(blk, dict) else {}
        if "save_loc_physics" not in a:
            continue
        a["save_loc_physics"] = reroot(a["save_loc_physics"], tmp)
        if os.path.exists(a["save_loc_physics"]):
            continue
        import xarray as xr
        n = len(levels_by_source.get(str(a.get("q_var", "")).split("/")[0]) or [0]) + bool(a.get("midpoint"))
        k = np.linspace(0, 1, n)
        names = list(a.get("lon_lat_level_name") or ["lon2d", "lat2d", "hyai", "hybi"])
        phis = a.get("surface_geopotential_name") or "PHIS"
        phis = phis[0] if isinstance(phis, list) else phis
        lon2d, lat2d = np.meshgrid(lon, lat)
        xr.Dataset({names[0]: (("lat", "lon"), lon2d.astype(np.float32)),
                    names[1]: (("lat", "lon"), lat2d.astype(np.float32)),
                    names[2]: (("ilev",), (2e4 * np.sin(np.pi * k) * (1 - k) + 200 * (1 - k)).astype(np.float32)),
                    names[3]: (("ilev",), (k ** 2).astype(np.float32)),
                    phis: (("lat", "lon"), rng.uniform(0, 2e4, (H, W)).astype(np.float32))}).to_netcdf(a["save_loc_physics"])
        log.write(f"wrote physics statics {os.path.basename(a['save_loc_physics'])}: {n} values of {names[2]}\n")

    # --- the rest of the paths
    conf["save_loc"] = os.path.join(tmp, "save")
    walk_paths(conf, tmp, skip=("pbs", "slurm"))
    if isinstance(conf.get("inference"), dict):
        pass  # rerooted by walk_paths

    # --- model export
    onnx_path = os.path.join(tmp, "model.onnx")
    note, xs, ys = export_model(conf, onnx_path, log)
    if note:
        notes.append(note)
    notes.append(f"grid {H} x {W}, model in {xs[1]} / out {ys[1]} channels")
    cfg = os.path.join(tmp, "config.yml")
    with open(cfg, "w") as fh:
        fh.write(f"# {name}: CREDIT's config with paths, dates, grid and model size changed\n")
        yaml.dump(conf, fh, Dumper=FlowSeqDumper, sort_keys=False)
    return cfg, onnx_path, t0.strftime("%Y-%m-%dT%H"), notes


REMOTE_KEYS = ("product", "mode", "extent", "resolution", "num_integration_steps")


def variant_changes(conf):
    """What the variant run changes beyond paths, dates, grid and model size (empty: no variant)."""
    out = []
    m = conf.get("model") or {}
    if sources_of(conf) is None and (m.get("post_conf") or {}).get("activate"):
        out.append("model.post_conf.activate: false")
    if (conf.get("trainer") or {}).get("load_weights"):
        out.append("trainer.load_weights: false")
    for sname, s in (sources_of(conf) or {}).items():
        if s.get("dataset_type") == "weatherbench2_era5":
            out.append(f"source {sname}: path of a local copy of the WeatherBench2 store (wxe's key)")
        elif s.get("dataset_type") == "arco_era5":
            out.append(f"source {sname}: path (and model_level_path) of local copies of the ARCO-ERA5 stores (wxe's keys)")
        elif s.get("dataset_type", "local") not in ("local", "tisr"):
            out.append(f"source {sname}: dataset_type {s.get('dataset_type')} -> local files")
    return out


def make_variant(conf):
    """Apply variant_changes to conf; return them as notes."""
    changes = variant_changes(conf)
    m = conf.get("model") or {}
    if sources_of(conf) is None and (m.get("post_conf") or {}).get("activate"):
        m["post_conf"]["activate"] = False
    if (conf.get("trainer") or {}).get("load_weights"):
        conf["trainer"]["load_weights"] = False
    for section in ("data", "validation_data"):
        sec = conf.get(section)
        if not isinstance(sec, dict):
            continue
        for sname, s in (sec.get("source") or {}).items():
            vv = s.get("variables") or {}
            if s.get("dataset_type") == "weatherbench2_era5":
                s["path"] = f"/{sname}_wb2_copy.zarr"  # wxe's key: a local copy of the WeatherBench2 store
            elif s.get("dataset_type") == "arco_era5":  # wxe's keys: local copies of ARCO-ERA5's stores
                s["path"] = f"/{sname}_full_37-1h-0p25deg-chunk-1.zarr-v3"
                if s.get("level_coord") == "hybrid":
                    s["model_level_path"] = f"/{sname}_model-level-1h-0p25deg.zarr-v1"
            elif s.get("dataset_type", "local") not in ("local", "tisr"):
                s["dataset_type"] = "local"
                for k in REMOTE_KEYS:
                    s.pop(k, None)
                for t in VTYPES:
                    if vv.get(t):
                        vv[t]["path"] = f"/{sname}_static.nc" if t == "static" else f"/{sname}_%Y.nc"
    return ["variant: " + c for c in changes]


def first_error(text):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\berror\b|: error|terminate|what\(\)|abort", ln, re.I):
            return ln
    return lines[-1] if lines else ""


def run_wxe(cmd, log, timeout):
    log.write("$ " + " ".join(cmd) + "\n")
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    log.write(out[-4000:] + "\n--- stderr\n" + err[-6000:] + f"\n--- rc {rc} ({time.time() - t:.1f} s)\n")
    warnings = sorted({ln.strip() for ln in err.splitlines() if "warning" in ln.lower()})
    return rc, first_error(err) if rc != 0 else "", warnings, time.time() - t


def short(text, tmp):
    return text.replace(tmp + "/", "").replace(tmp, ".")


def do_config(name, text, note, work, wxe, timeout, variant=False):
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name.replace("config/", "")).strip("_") + ("_variant" if variant else "")
    tmp = os.path.join(work, slug)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    res = {"config": name + (" (variant)" if variant else ""), "note": note, "dir": tmp}
    with open(os.path.join(tmp, "log.txt"), "w") as log:
        try:
            cfg, onnx_path, init, notes = prepare(name, text, tmp, log, variant)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=log)
            res["prepare_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            return res
        res["notes"] = notes
        save = os.path.join(tmp, "run")
        rc, err, warn, sec = run_wxe([wxe, "finetune", cfg, "--model", onnx_path, "--steps", "3", "--save", save,
                                      "--threads", "2"], log, timeout)
        steps = 0
        tl = os.path.join(save, "training_log.csv")
        if os.path.exists(tl):
            rows = [ln for ln in open(tl).read().splitlines()[1:] if ln.strip()]
            steps = len(rows)
        res["finetune"] = {"rc": rc, "error": short(err, tmp), "steps_logged": steps, "warnings": warn, "seconds": round(sec, 1)}
        out = os.path.join(tmp, "f.nc")
        rc, err, warn, sec = run_wxe([wxe, "forecast", cfg, "--model", onnx_path, "--init", init, "--steps", "2",
                                      "--output", out, "--threads", "2"], log, timeout)
        res["forecast"] = {"rc": rc, "error": short(err, tmp), "written": os.path.exists(out), "warnings": warn,
                           "seconds": round(sec, 1)}
    return res


def markdown(results):
    rows = ["| config | finetune --steps 3 | forecast --steps 2 |", "|---|---|---|"]
    for r in results:
        if "prepare_error" in r:
            rows.append(f"| {r['config']} | not run: set-up failed: `{r['prepare_error']}` | not run |")
            continue
        f, g = r["finetune"], r["forecast"]
        a = f"trained ({f['steps_logged']} steps logged)" if f["rc"] == 0 else f"refused (rc {f['rc']}): `{f['error']}`"
        b = "forecast written" if g["rc"] == 0 and g["written"] else f"refused (rc {g['rc']}): `{g['error']}`"
        rows.append(f"| {r['config']} | {a} | {b} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wxe", required=True, help="the wxe binary")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--credit-repo", help="CREDIT checkout or bare git directory")
    g.add_argument("--configs", help="a directory of CREDIT yml files")
    ap.add_argument("--work", help="working directory (default: a new temp dir, kept)")
    ap.add_argument("--only", nargs="*", help="run only configs whose path contains one of these")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per wxe command")
    ap.add_argument("--variants", action="store_true",
                    help="where a config is refused, also run it with remote dataset types made local files, "
                         "missing levels listed, load_weights off and gen1 post_conf off (each noted)")
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--markdown", help="write the table here")
    args = ap.parse_args()
    wxe = os.path.abspath(args.wxe)
    work = args.work or tempfile.mkdtemp(prefix="credit_configs_")
    os.makedirs(work, exist_ok=True)
    results = []
    seen = {}
    for name, text, note in read_configs(args):
        if args.only and not any(s in name for s in args.only):
            continue
        if text in seen:
            results.append({"config": name, "note": f"same file as {seen[text]}", "duplicate_of": seen[text]})
            print(f"{name}: same file as {seen[text]}", flush=True)
            continue
        seen[text] = name
        print(f"== {name}", flush=True)
        r = do_config(name, text, note, work, wxe, args.timeout)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "dir"}, indent=None)[:1500], flush=True)
        failed = "prepare_error" in r or r["finetune"]["rc"] != 0 or r["forecast"]["rc"] != 0
        if failed and args.variants and variant_changes(yaml.safe_load(text)):
            # how far the rest of the config gets once a config-level obstacle is changed
            r = do_config(name, text, note, work, wxe, args.timeout, variant=True)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "dir"}, indent=None)[:1500], flush=True)
    table = markdown([r for r in results if "duplicate_of" not in r])
    print(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table)
    print("work dir:", work)


if __name__ == "__main__":
    main()
