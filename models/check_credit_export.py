#!/usr/bin/env python3
"""Checks a CREDIT checkpoint written by `wxe convert CKPT --to credit --like ORIG.pt`.

Loads it with torch.load(weights_only=True), builds the CREDIT model (the tiny config of
models/export_credit.py), load_state_dict(strict=True), loads the optimizer state into
torch.optim.AdamW over model.parameters(), and compares every tensor with the original
checkpoint (untrained ones equal, trained ones moved).

    /root/wxe-venv/bin/python models/check_credit_export.py OUT.pt ORIG.pt crossformer_tiny
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_credit import model_class, TINY_KW  # noqa: E402


def main(out, orig, name):
    ck = torch.load(out, weights_only=True)
    ref = torch.load(orig, weights_only=True)
    assert set(ck) >= {"epoch", "model_state_dict"}, set(ck)
    model = model_class(name)(**TINY_KW)
    model.load_state_dict(ck["model_state_dict"], strict=True)
    sd, rsd = ck["model_state_dict"], ref["model_state_dict"]
    assert list(sd) == list(rsd), "key order differs"
    moved = same = 0
    for k in rsd:
        assert sd[k].shape == rsd[k].shape and sd[k].dtype == rsd[k].dtype, k
        if torch.equal(sd[k], rsd[k]):
            same += 1
        else:
            moved += 1
    print(f"model_state_dict: {len(sd)} tensors, strict load ok; {moved} changed by fine-tuning, {same} unchanged")
    if "optimizer_state_dict" in ck:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
        opt.load_state_dict(ck["optimizer_state_dict"])
        n = len(ck["optimizer_state_dict"]["state"])
        steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
        print(f"optimizer_state_dict: AdamW loaded, state for {n} of {len(list(model.parameters()))} parameters, step {steps}")
        x = torch.randn(1, 7, 1, 32, 64)
        model.train()
        model(x).square().mean().backward()
        opt.step()  # the loaded state is usable
        print("one more AdamW step from the loaded state: ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
