#!/usr/bin/env python3
"""Golden files of CREDIT's mslp_diagnostic postblock (tests/data/mslp).

CREDIT's own mslp_from_surface_pressure (credit.postblock.mslp, miles-credit 2026.2) on made-up
points covering each of its branches (at sea level; the standard lapse rate; a surface colder
than 290.5 K whose sea-level temperature is warmer; a warm surface; a very cold one; slightly
negative surface heights): the inputs sp, t, zs (float32, N points) and, in float64 from them,
mslp and by torch autograd its derivatives dsp, dt (float64 values saved as float32).

Usage: /root/credit-venv/bin/python models/make_mslp_fixture.py
"""
import os

import numpy as np
import torch

from credit.postblock.mslp import mslp_from_surface_pressure

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "mslp"))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(11)
    n = 400
    sp = rng.uniform(50000.0, 105000.0, n)
    t = np.concatenate([rng.uniform(240.0, 300.0, n - 40), rng.uniform(283.0, 290.0, 20), rng.uniform(230.0, 254.0, 20)])
    zs = np.concatenate([rng.uniform(0.0, 45000.0, n - 60), np.zeros(20), rng.uniform(-5e-4, 5e-4, 20),
                         rng.uniform(8000.0, 20000.0, 20)])  # the last: with t 283-290 K, warm at sea level
    sp, t, zs = (a.astype(np.float32) for a in (sp, t, zs))
    sp64, t64 = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (sp, t))
    zs64 = torch.tensor(zs.astype(np.float64))
    m = mslp_from_surface_pressure(sp64, t64, zs64)
    m.sum().backward()
    for name, a in {"sp": sp, "t": t, "zs": zs, "mslp": m.detach().numpy(), "dsp": sp64.grad.numpy(),
                    "dt": t64.grad.numpy()}.items():
        np.save(os.path.join(OUT, name + ".npy"), np.asarray(a, dtype=np.float32))
    print(f"wrote {OUT}: {n} points")


if __name__ == "__main__":
    main()
