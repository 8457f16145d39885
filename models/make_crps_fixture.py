#!/usr/bin/env python3
"""Golden references from CREDIT's own ensemble CRPS losses (miles-credit 2026.2):
tests/data/crps/. Every value is computed by CREDIT's code; nothing is re-derived here.

(A) KCRPS and almost-fair-crps: crps.json, pred.npy, target.npy, pred1.npy, target1.npy,
    lat_weights.nc, grad_*.npy.
    pred (B * m, C, T, H, W) = (6, 5, 1, 6, 8): B = 2 samples of m = 3 members, sample b's members
    in rows 3b..3b+2 (the trainer's repeat_interleave); target (2, 5, 1, 6, 8); normal, std 1.5.
    pred1 / target1: one sample (B = 1), for the validation case whose L1 loss broadcasts the
    target over the members (torch broadcasting needs B = 1 there).
    For each case the gen2 loss config of make_credit_registry_fixture.py (loss_conf: nested data
    schema, inject_flat_var_keys as credit/applications/train_gen2.py does), then
    load_loss(conf) / load_loss(conf, validation=True) and the gen2 trainer's call
    criterion(target, pred).mean(); value and d value / d pred (autograd).
(B) ring-crps: ring.json, ring_pred_K<K>.npy (K, 5, 1, 6, 8): member r is rank r's prediction,
    ring_target.npy (1, 5, 1, 6, 8); per rank ring_elem_K<K>_r<r>.npy (RingCRPSLoss(reduction
    "none"): the elementwise local contribution) and ring_grad_K<K>_r<r>.npy (d mean / d pred),
    ring_value in ring.json (the trainer's .mean()). K ranks of torch.distributed (gloo, CPU) run
    credit.losses.crps.RingCRPSLoss with the WORLD group, for K = 2 and 3.

Usage (any python with torch and miles-credit 2026.2; writes tests/data/crps):
  /root/credit-venv/bin/python models/make_crps_fixture.py
"""
import json
import os
import socket
import sys
import tempfile

import numpy as np
import torch
import xarray as xr

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "data", "crps"))
sys.path.insert(0, HERE)

import make_credit_registry_fixture as reg  # noqa: E402  (loss_conf, LAT, CHANNELS, credit_version)

B, M = 2, 3
SHAPE = (B, len(reg.CHANNELS), 1, len(reg.LAT), reg.N_LON_DATA)


def save_npy(name, a):
    np.save(os.path.join(OUT, name), np.ascontiguousarray(a))


def write_lat_file():
    xr.Dataset(
        coords={
            "latitude": ("latitude", np.array(reg.LAT, dtype=np.float64)),
            "longitude": ("longitude", np.arange(reg.N_LON_FILE, dtype=np.float64) * (360.0 / reg.N_LON_FILE)),
        }
    ).to_netcdf(
        os.path.join(OUT, "lat_weights.nc"),
        engine="netcdf4",
        encoding={"latitude": {"_FillValue": None}, "longitude": {"_FillValue": None}},
    )


def make_ensemble_losses():
    from credit.losses import load_loss

    rng = np.random.default_rng(20260238)
    pred = (1.5 * rng.standard_normal((B * M,) + SHAPE[1:])).astype(np.float32)
    target = (1.5 * rng.standard_normal(SHAPE)).astype(np.float32)
    save_npy("pred.npy", pred)
    save_npy("target.npy", target)
    save_npy("pred1.npy", pred[:M])
    save_npy("target1.npy", target[:1])
    write_lat_file()
    # (case, loss, parameters, weighted, validation, validation_loss, one sample)
    specs = [
        ("KCRPS/plain", "KCRPS", None, False, False, None, False),
        ("KCRPS_biased/plain", "KCRPS", {"biased": True}, False, False, None, False),
        ("KCRPS/weighted", "KCRPS", None, True, False, None, False),
        # VariableTotalLoss2D: "for ensembles, load same loss for train and valid", even with a
        # validation_loss named
        ("KCRPS/weighted/validation", "KCRPS", None, True, True, "mse", False),
        ("almost-fair-crps/plain", "almost-fair-crps", {"alpha": 0.95}, False, False, None, False),
        ("almost-fair-crps/weighted", "almost-fair-crps", {"alpha": 0.95}, True, False, None, False),
        # not KCRPS: no validation_loss -> L1 of every member against the (broadcast) target
        ("almost-fair-crps/weighted/validation", "almost-fair-crps", {"alpha": 0.95}, True, True, None, True),
    ]
    cases = []
    cwd = os.getcwd()
    os.chdir(OUT)  # latitude_weights: "lat_weights.nc", relative to the fixture folder
    try:
        for case_name, name, params, weighted, validation, vloss, one in specs:
            conf = reg.loss_conf(name, weighted, params, vloss)
            criterion = load_loss(conf, validation=validation)
            p = torch.from_numpy((pred[:M] if one else pred).copy()).requires_grad_(True)
            t = torch.from_numpy((target[:1] if one else target).copy())
            loss = criterion(t.float().to(p.dtype), p).mean()  # trainer_gen2.py's call
            loss.backward()
            assert p.grad is not None and torch.isfinite(p.grad).all() and torch.isfinite(loss)
            grad_name = "grad_" + case_name.replace("/", "_") + ".npy"
            save_npy(grad_name, p.grad.numpy().astype(np.float32))
            cases.append(
                {
                    "name": case_name,
                    "training_loss": name,
                    "parameters": dict(params or {}),
                    "validation_loss": vloss,
                    "weighted": weighted,
                    "validation": validation,
                    "criterion": type(criterion).__name__,
                    "inner": type(getattr(criterion, "loss_fn", criterion)).__name__,
                    "pred": "pred1.npy" if one else "pred.npy",
                    "target": "target1.npy" if one else "target.npy",
                    "value": float(loss.detach().double()),
                    "grad": grad_name,
                }
            )
    finally:
        os.chdir(cwd)
    return cases


def ring_rank(rank, K, port, members, target, q):
    import torch.distributed as dist
    from credit.losses.crps import RingCRPSLoss

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=K)
    try:
        p = torch.from_numpy(members[rank : rank + 1].copy()).requires_grad_(True)
        t = torch.from_numpy(target.copy())
        elem = RingCRPSLoss(reduction="none", group=dist.group.WORLD)(t, p)
        loss = elem.mean()  # trainer_gen2.py's .mean()
        loss.backward()
        q.put((rank, elem.detach().numpy().copy(), p.grad.numpy().copy(), float(loss.detach().double())))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_ring():
    import torch.multiprocessing as mp

    rng = np.random.default_rng(20260239)
    target = (1.5 * rng.standard_normal((1,) + SHAPE[1:])).astype(np.float32)
    save_npy("ring_target.npy", target)
    runs = []
    for K in (2, 3):
        members = (1.5 * rng.standard_normal((K,) + SHAPE[1:])).astype(np.float32)
        save_npy(f"ring_pred_K{K}.npy", members)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=ring_rank, args=(r, K, port, members, target, q)) for r in range(K)]
        for pr in procs:
            pr.start()
        got = sorted([q.get(timeout=120) for _ in range(K)], key=lambda g: g[0])
        for pr in procs:
            pr.join()
            assert pr.exitcode == 0, pr.exitcode
        values = []
        for r, elem, grad, value in got:
            save_npy(f"ring_elem_K{K}_r{r}.npy", elem.astype(np.float32))
            save_npy(f"ring_grad_K{K}_r{r}.npy", grad.astype(np.float32))
            values.append(value)
        runs.append({"K": K, "pred": f"ring_pred_K{K}.npy", "values": values})
    return runs


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    doc = {
        "credit_version": reg.credit_version(),
        "lat": reg.LAT,
        "channels": reg.CHANNELS,
        "variable_weights": reg.VARIABLE_WEIGHTS,
        "members": M,
        "cases": make_ensemble_losses(),
        "ring_target": "ring_target.npy",
        "ring": make_ring(),
    }
    with open(os.path.join(OUT, "crps.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(f"wrote {OUT}: {len(doc['cases'])} cases, ring K = 2, 3")


if __name__ == "__main__":
    main()
