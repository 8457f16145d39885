#!/usr/bin/env python3
"""The learning rates CREDIT's gen2 trainer uses with linear-warmup-cosine
(tests/data/credit_lr_schedule.json): CREDIT's own LinearWarmupCosineScheduler (credit.scheduler,
miles-credit 2026.2) on a torch optimizer, driven as credit/trainers/trainer_gen2.py's
train_one_epoch drives it: per epoch, batches_per_epoch batches; optimizer.step() when
(batch + 1) % grad_accum_every == 0 or at the epoch's last batch; scheduler.step() after every
batch. Recorded: the optimizer's lr at each optimizer.step(). Usage:
  python models/make_credit_lr_reference.py [OUT.json]
"""
import json
import os
import sys

import torch
from credit.scheduler import LinearWarmupCosineScheduler

CASES = [  # lr, warmup, total, min_lr, grad_accum_every, batches_per_epoch, epochs
    (1e-4, 3, 10, 1e-6, 2, 4, 2),
    (1e-4, 3, 10, 1e-6, 3, 4, 2),  # the last step of an epoch sums fewer batches
    (3e-4, 2, 7, 0.0, 1, 5, 2),
]


def run(lr, warmup, total, min_lr, accum, bpe, epochs):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=lr)
    sched = LinearWarmupCosineScheduler(opt, warmup_steps=warmup, total_steps=total, min_lr=min_lr)
    lrs = []
    for _ in range(epochs):
        for steps in range(bpe):
            if (steps + 1) % accum == 0 or steps == bpe - 1:
                lrs.append(opt.param_groups[0]["lr"])
                opt.step()
            sched.step()
    return lrs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "credit_lr_schedule.json")
    cases = []
    for lr, w, t, m, a, b, e in CASES:
        cases.append({"learning_rate": lr, "warmup_steps": w, "total_steps": t, "min_lr": m, "grad_accum_every": a,
                      "batches_per_epoch": b, "epochs": e, "lrs": [repr(x) for x in run(lr, w, t, m, a, b, e)]})
    with open(out, "w") as fh:
        json.dump({"source": "credit.scheduler.LinearWarmupCosineScheduler (miles-credit 2026.2)", "cases": cases}, fh,
                  indent=1)
        fh.write("\n")
    print("written", out)


if __name__ == "__main__":
    main()
