#!/usr/bin/env python3
"""CREDIT 2026's own files for the era5_tiny data (tests/data/era5_tiny/credit2026_*), made with
CREDIT's tools (miles-credit 2026.2, torch, bridgescaler, xarray), so that the tests hold what
CREDIT really writes:

- credit2026_convert.yml, credit2026_convert_{pre,post}_scaler.json: `credit convert -y` run on a
  v1 config of the era5_tiny data (preblocks.per_step.{scaler, concat}, postblocks.per_step.
  {reconstruct, scaler}, validation_data, model, loss.latitude_weights, trainer.parallelism, ...),
  the config kept as CREDIT wrote it except the scaler paths made relative.
- credit2026_preprocess.yml, credit2026_fitted_scaler.json: the config (the converted one with
  CREDIT's strftime paths, which its dataset needs) `credit preprocess` fits its scaler with;
  the fitted scaler holds separate input and target statistics.
- credit2026_x.npy, credit2026_y.npy, credit2026_sample.json: CREDIT's normalised model input and
  target for one sample, from CREDIT's dataset through its preblocks (the fitted scaler and
  concat), the oracle of wxe's normalisation.

Needs ncgen (Debian netcdf-bin) for the v1 mean/std files. Usage:
  python models/make_credit2026_fixture.py [ERA5_TINY_DIR]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_era5_fixture as era5  # noqa: E402

V1 = """save_loc: "save"
seed: 1000
data:
  variables: ["T", "U"]
  surface_variables: ["SP"]
  dynamic_forcing_variables: ["tsi"]
  static_variables: ["LSM"]
  diagnostic_variables: ["tp"]
  save_loc: "era5_*"
  save_loc_dynamic_forcing: "forcing_*"
  save_loc_diagnostic: "era5_*"
  save_loc_static: "static.nc"
  mean_path: "mean_cfg.nc"
  std_path: "std_cfg.nc"
  train_years: [2020, 2021]
  valid_years: [2021, 2021]
  lead_time_periods: 6
  level_ids: [500, 850]
  history_len: 1
  valid_history_len: 1
  forecast_len: 0
  valid_forecast_len: 0
model:
  type: "crossformer"
  levels: 2
trainer:
  type: era5
  mode: none
  learning_rate: 1.0e-4
  weight_decay: 0.0
  grad_accum_every: 2
  train_batch_size: 1
  batches_per_epoch: 4
  epochs: 1
  use_scheduler: true
  scheduler:
    scheduler_type: linear-warmup-cosine
    warmup_steps: 3
    total_steps: 10
    min_lr: 1.0e-6
loss:
  training_loss: "mse"
  use_latitude_weights: true
  latitude_weights: "static.nc"
  use_variable_weights: false
"""


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "era5_tiny"))
    credit = shutil.which("credit") or os.path.join(os.path.dirname(sys.executable), "credit")
    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(out):  # the data, beside the configs as in tests/data/era5_tiny
            if f.startswith(("era5_", "forcing_", "static")):
                src = os.path.join(out, f)
                (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(tmp, f))
        for kind in ("mean", "std"):
            era5.ncgen(era5.gen1_stats(kind, [500, 850]), os.path.join(tmp, f"{kind}_cfg.nc"), tmp)
        with open(os.path.join(tmp, "v1.yml"), "w") as fh:
            fh.write(V1)
        run([credit, "convert", "-c", "v1.yml", "-o", "credit2026_convert.yml", "-y", "--level-coord", "level"], tmp)
        conf = yaml.safe_load(open(os.path.join(tmp, "credit2026_convert.yml")))
        text = open(os.path.join(tmp, "credit2026_convert.yml")).read()
        for j in ("credit2026_convert_pre_scaler.json", "credit2026_convert_post_scaler.json"):
            assert j in text
            shutil.copy(os.path.join(tmp, j), os.path.join(out, j))
        with open(os.path.join(out, "credit2026_convert.yml"), "w") as fh:
            fh.write("# written by `credit convert -y` (miles-credit 2026.2) from a v1 config of the era5_tiny data\n")
            fh.write(text)

        # credit preprocess: CREDIT's dataset reads strftime codes in the paths
        pre = conf
        v = pre["data"]["source"]["ERA5"]["variables"]
        for k, p in (("prognostic", "era5_%Y.*"), ("diagnostic", "era5_%Y.*"), ("dynamic_forcing", "forcing_%Y.nc")):
            v[k]["path"] = p
            v[k].pop("filename_time_format", None)
        pre["data"]["start_datetime"] = "2020-12-31T00"
        pre["data"]["end_datetime"] = "2021-01-01T18"
        pre["validation_data"] = {"start_datetime": "2021-01-01T00", "end_datetime": "2021-01-01T18"}
        pre["trainer"]["batches_per_epoch"] = 0
        pre["trainer"]["thread_workers"] = 0
        pre.pop("pbs", None)
        sc = pre["preblocks"]["per_step"]["scaler"]["args"]
        sc["scaler_path"] = "./credit2026_fitted_scaler.json"
        sc["variables"] = []
        sc["scaler_params"] = {"channels_last": False}  # per level, not per longitude
        post = pre["postblocks"]["per_step"]["scaler"]["args"]
        post["scaler_path"] = "./credit2026_fitted_scaler.json"
        with open(os.path.join(tmp, "credit2026_preprocess.yml"), "w") as fh:
            fh.write("# the config `credit preprocess` (miles-credit 2026.2) fitted credit2026_fitted_scaler.json with\n")
            yaml.safe_dump(pre, fh, sort_keys=False)
        run([sys.executable, "-m", "credit.applications.preprocess", "-c", "credit2026_preprocess.yml", "--device", "cpu"],
            tmp)
        for f in ("credit2026_preprocess.yml", "credit2026_fitted_scaler.json"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out, f))

        # CREDIT's normalised input and target of one sample: its dataset, then its preblocks
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            import pandas as pd
            from credit.preblock import apply_preblocks, build_preblocks
            from credit.trainers.utils import load_dataset

            conf1 = yaml.safe_load(open("credit2026_preprocess.yml"))
            ds = load_dataset(conf1, is_train=True)
            t = pd.Timestamp("2021-01-01T00:00:00")
            batch = ds[(t, 0)]
            batch = {dt: {s: {k: v.unsqueeze(0) for k, v in src.items()} for s, src in batch[dt].items()}
                     for dt in ("input", "target")}
            res = apply_preblocks(build_preblocks(conf1, phase="per_step"), batch)
            x = res["x"].numpy().astype(np.float32)
            y = res["y"].numpy().astype(np.float32)
        finally:
            os.chdir(cwd)
        np.save(os.path.join(out, "credit2026_x.npy"), x)
        np.save(os.path.join(out, "credit2026_y.npy"), y)
        with open(os.path.join(out, "credit2026_sample.json"), "w") as fh:
            json.dump({"time": "2021-01-01T00:00:00", "x_shape": list(x.shape), "y_shape": list(y.shape)}, fh)
            fh.write("\n")
    print("written to", out)


if __name__ == "__main__":
    main()
