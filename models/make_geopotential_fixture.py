#!/usr/bin/env python3
"""Golden files of CREDIT's geopotential_diagnostic postblock (tests/data/geopotential).

CREDIT's own GeopotentialDiagnostic (credit.postblock.geopotential, miles-credit 2026.2, its
shipped ERA5_Lev_Info.nc) on made-up physical columns: per case the inputs T, q (levels, H, W),
sp and zs (H, W), a cotangent g, and what CREDIT gives: phi = the block's output and, by torch
autograd of sum(phi * g), gT, gq, gsp: the module run on float64 tensors (its coefficients float32
as it reads them; phi, gT, ...: the arithmetic itself) and on float32 ones as in training (phi32,
gT32, ...: float32's rounding, which the near-cancelling alpha of the lowest levels amplifies to
~1e-4 relative). Cases: every one of the 137 levels; the lowest 10
(levels: [128, ..., 137]); the top 10 with flip_vertical false.

Usage: /root/credit-venv/bin/python models/make_geopotential_fixture.py
"""
import os

import numpy as np
import torch

from credit.postblock.geopotential import GeopotentialDiagnostic

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "geopotential"))
H, W = 2, 3
CASES = {"all": (None, True), "low10": (list(range(128, 138)), True), "noflip": (list(range(1, 11)), False)}


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(7)
    for name, (levels, flip) in CASES.items():
        L = 137 if levels is None else len(levels)
        frac = np.linspace(0, 1, L)[:, None, None]  # top to bottom
        T = (200 + 90 * frac + rng.normal(0, 2, (L, H, W))).astype(np.float32)
        q = (1e-6 + 1.5e-2 * frac**3 * rng.uniform(0.5, 1, (L, H, W))).astype(np.float32)
        sp = rng.uniform(7.0e4, 1.03e5, (H, W)).astype(np.float32)
        zs = rng.uniform(0, 3.0e4, (H, W)).astype(np.float32)
        g = rng.normal(0, 1, (L, H, W)).astype(np.float32)
        blk = GeopotentialDiagnostic(
            output_name="ERA5/computed_diagnostic/3d/geopotential",
            surface_geopotential_var="ERA5/static/2d/zs", surface_pressure_var="ERA5/prognostic/2d/sp",
            temperature_var="ERA5/prognostic/3d/T", specific_humidity_var="ERA5/prognostic/3d/q",
            flip_vertical=flip, levels=levels)
        out = {"T": T, "q": q, "sp": sp, "zs": zs, "g": g}
        for dtype, suffix in ((torch.float64, ""), (torch.float32, "32")):
            t_t = torch.tensor(T, dtype=dtype)[None, :, None].requires_grad_(True)  # (B, levels, time, H, W)
            q_t = torch.tensor(q, dtype=dtype)[None, :, None].requires_grad_(True)
            sp_t = torch.tensor(sp, dtype=dtype)[None, None, None].requires_grad_(True)
            batch = {"y_processed": {"ERA5": {"ERA5/prognostic/3d/T": t_t, "ERA5/prognostic/3d/q": q_t,
                                              "ERA5/prognostic/2d/sp": sp_t}},
                     "ic_raw": {"ERA5": {"ERA5/static/2d/zs": torch.tensor(zs, dtype=dtype)[None, None, None]}}}
            phi = blk(batch)["y_processed"]["ERA5"]["ERA5/computed_diagnostic/3d/geopotential"]
            (phi * torch.tensor(g, dtype=dtype)[None, :, None]).sum().backward()
            out.update({"phi" + suffix: phi.detach()[0, :, 0].numpy(), "gT" + suffix: t_t.grad[0, :, 0].numpy(),
                        "gq" + suffix: q_t.grad[0, :, 0].numpy(), "gsp" + suffix: sp_t.grad[0, 0, 0].numpy()})
        for k, v in out.items():
            np.save(os.path.join(OUT, f"{name}_{k}.npy"), np.ascontiguousarray(v, dtype=np.float64 if v.dtype == np.float64 else np.float32))
        print(name, "phi range", float(out["phi"].min()), float(out["phi"].max()))


if __name__ == "__main__":
    main()
