#!/usr/bin/env python3
"""Checks CREDIT checkpoints written by `wxe convert CKPT --to credit --like ORIG.pt`.

check OUT.pt ORIG.pt NAME
    A converted fine-tune checkpoint: torch.load(weights_only=True), CREDIT's model (the tiny
    config of models/export_credit.py) loads it with strict=True, the tensors have the
    original's names, order, shapes and dtypes, the optimizer state has the key layout of the
    installed torch's AdamW and one moment per parameter of its shape, AdamW loads it and takes
    a step.

roundtrip NAME [--no-sn] [--wxe build/wxe]
    An exact oracle for the whole path: PyTorch takes one AdamW step on the CREDIT model (the
    tiny fixture checkpoint, or with --no-sn a model without spectral norm, so that to_qkv is
    split); the result is written as a wxe fine-tune checkpoint directory (model.safetensors:
    spectral-norm layers as weight_orig/u/v, the others in the Linear layout; optimizer.safetensors:
    exp_avg./exp_avg_sq. per parameter, mapped like the weights), `wxe convert --to credit --like`
    turns it back, and its model_state_dict and optimizer_state_dict must equal PyTorch's bit
    for bit.

nextgen [--wxe build/wxe] [--mpirun mpirun]
    Issue 23's case, the CREDIT 2026.2 nextgen_wxformer of tests/data/credit_nextgen (spectral
    norm, column attention through nn.MultiheadAttention, frames 2, TorchScript export): wxe
    fine-tunes 5 steps from the CREDIT checkpoint (linear-warmup-cosine, EMA), saves, resumes for
    a 6th step, converts back with --like; CREDIT's model loads it with strict=True and has as
    many parameters as wxe trained; then CREDIT's own trainer loading function
    (credit.trainers.utils.load_model_states_and_optimizer, reload_epoch: true) resumes from it:
    the scheduler's state equals a LinearWarmupCosineScheduler stepped as often, the optimizer
    takes a step. With --mpirun the same run at tp 2 converts and loads too.

    $WXE_PYTHON models/check_credit_export.py roundtrip crossformer_tiny
    $WXE_PYTHON models/check_credit_export.py nextgen
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_credit import INPUT_SHAPE, TINY_KW, model_class  # noqa: E402

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)


def check_optimizer_layout(osd, model):
    """osd's keys as the installed torch's AdamW writes them; moments shaped like the parameters."""
    params = list(model.parameters())
    ref = adamw([torch.nn.Parameter(torch.zeros(1))]).state_dict()
    assert set(osd) == set(ref), (set(osd), set(ref))
    assert len(osd["param_groups"]) == 1
    g, rg = osd["param_groups"][0], ref["param_groups"][0]
    assert list(g) == list(rg), f"param_groups keys {list(g)} != AdamW's {list(rg)}"
    assert g["params"] == list(range(len(params))), "params are not 0..n-1 over model.parameters()"
    for i, s in osd["state"].items():
        assert set(s) == {"step", "exp_avg", "exp_avg_sq"}, set(s)
        assert s["step"].dtype == torch.float32 and s["step"].dim() == 0, s["step"]
        for k in ("exp_avg", "exp_avg_sq"):
            assert s[k].shape == params[i].shape, f"state {i} {k} {tuple(s[k].shape)} vs parameter {tuple(params[i].shape)}"


def check(out, orig, name):
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
        check_optimizer_layout(ck["optimizer_state_dict"], model)
        opt = adamw(model.parameters())
        opt.load_state_dict(ck["optimizer_state_dict"])
        n = len(ck["optimizer_state_dict"]["state"])
        steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
        print(f"optimizer_state_dict: AdamW key layout ok, loaded, state for {n} of {len(list(model.parameters()))} "
              f"parameters, step {steps}")
        model.train()
        model(torch.randn(*INPUT_SHAPE)).square().mean().backward()
        opt.step()  # the loaded state is usable
        print("one more AdamW step from the loaded state: ok")


# --------------------------------------------------------------------------- roundtrip


def linear_layout(sd):
    """CREDIT's legacy names -> what wxe fine-tuning saves: modules with spectral norm as they
    are; to_qkv split into to_q/to_k/to_v; 1x1 to_out and feed-forward weights 2-D."""
    sn = {k[: -len(".weight_orig")] for k in sd if k.endswith(".weight_orig")}
    out = {}
    for k, t in sd.items():
        mod, leaf = k.rsplit(".", 1)
        if mod in sn:
            out[k] = t
        elif mod.endswith("to_qkv") and leaf in ("weight", "bias"):
            for part, c in zip(("to_q", "to_k", "to_v"), t.chunk(3, dim=0)):
                out[f"{mod[:-6]}{part}.{leaf}"] = c.reshape(c.shape[0], -1) if leaf == "weight" else c
        elif leaf == "weight" and t.dim() == 4 and t.shape[2:] == (1, 1) and (
            mod.endswith("to_out") or mod.endswith(".layers.1") or mod.endswith(".layers.4")
        ):
            out[k] = t.reshape(t.shape[0], t.shape[1])
        else:
            out[k] = t
    return {k: v.contiguous() for k, v in out.items()}


def roundtrip(name, no_sn, wxe):
    from safetensors.torch import save_file

    tmp = tempfile.mkdtemp(prefix="credit_rt_")
    torch.manual_seed(0)
    if no_sn:
        model = model_class(name)(**dict(TINY_KW, use_spectral_norm=False))
        like = os.path.join(tmp, "original.pt")
        torch.save({"epoch": 0, "model_state_dict": model.state_dict()}, like)
    else:
        model = model_class(name)(**TINY_KW)
        like = os.path.join(REPO, "tests/data", f"{name}_checkpoint.pt")
        model.load_state_dict(torch.load(like, weights_only=True)["model_state_dict"], strict=True)
    # one PyTorch training step: parameters, u/v (train-mode power iteration) and moments move
    opt = adamw(model.parameters())
    model.train()
    model(torch.randn(*INPUT_SHAPE)).square().mean().backward()
    opt.step()
    want_sd, want_opt = model.state_dict(), opt.state_dict()

    # as wxe fine-tuning saves it
    ck = os.path.join(tmp, "step_000001")
    os.makedirs(ck)
    save_file(linear_layout(want_sd), os.path.join(ck, "model.safetensors"), metadata={"step": "1"})
    names = [n for n, _ in model.named_parameters()]
    moments = {}
    for key in ("exp_avg", "exp_avg_sq"):
        per_name = {names[i]: s[key] for i, s in want_opt["state"].items()}
        moments.update({f"{key}.{n}": t for n, t in linear_layout(per_name).items()})
    meta = {"step": "1", "adam_step": "1", "lr": repr(LR), "beta1": repr(BETAS[0]), "beta2": repr(BETAS[1]),
            "eps": repr(EPS), "weight_decay": repr(WD)}
    save_file(moments, os.path.join(ck, "optimizer.safetensors"), metadata=meta)
    n_split = sum(k.endswith(".to_q.weight") for k in linear_layout(want_sd))

    out = os.path.join(tmp, "credit.pt")
    r = subprocess.run([wxe, "convert", ck, "--to", "credit", "--output", out, "--like", like],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    print(r.stdout.strip())

    got = torch.load(out, weights_only=True)
    sd = got["model_state_dict"]
    assert list(sd) == list(want_sd), "model_state_dict key order differs from CREDIT's"
    bad = [k for k in sd if not (sd[k].dtype == want_sd[k].dtype and torch.equal(sd[k], want_sd[k]))]
    assert not bad, f"{len(bad)} tensors differ: {bad[:5]}"
    fresh = model_class(name)(**dict(TINY_KW, use_spectral_norm=not no_sn))
    fresh.load_state_dict(sd, strict=True)
    osd = got["optimizer_state_dict"]
    check_optimizer_layout(osd, fresh)
    assert osd["param_groups"] == want_opt["param_groups"], (osd["param_groups"][0], want_opt["param_groups"][0])
    assert sorted(osd["state"]) == sorted(want_opt["state"])
    for i, s in want_opt["state"].items():
        for k, t in s.items():
            assert osd["state"][i][k].dtype == t.dtype and torch.equal(osd["state"][i][k], t), f"state {i} ({names[i]}) {k}"
    opt2 = adamw(fresh.parameters())
    opt2.load_state_dict(osd)
    print(f"{name} {'without' if no_sn else 'with'} spectral norm ({n_split} to_qkv split into q/k/v): "
          f"model_state_dict {len(sd)} tensors and AdamW state of {len(osd['state'])} parameters equal "
          f"PyTorch's bit for bit; strict load and optimizer load ok")


# --------------------------------------------------------------------------- CREDIT's resume


def resume_with_credit(ckpt, model, lr, weight_decay, sched=None):
    """Resumes from `ckpt` (a converted checkpoint) through CREDIT's own loading function, as its
    trainer does with load_weights/load_optimizer/load_scheduler/load_scaler and reload_epoch."""
    import shutil

    from credit.trainers.utils import load_model_states_and_optimizer

    save_loc = tempfile.mkdtemp(prefix="credit_resume_")
    shutil.copy(ckpt, os.path.join(save_loc, "checkpoint.pt"))
    open(os.path.join(save_loc, "training_log.csv"), "w").close()
    trainer = {"learning_rate": lr, "weight_decay": weight_decay, "amp": False, "load_weights": True,
               "load_optimizer": True, "load_scaler": True, "load_scheduler": True, "reload_epoch": True,
               "start_epoch": 0, "use_scheduler": sched is not None}
    if sched is not None:
        trainer["scheduler"] = dict(sched, scheduler_type="linear-warmup-cosine")
    conf = {"save_loc": save_loc, "trainer": trainer}
    conf, model, optimizer, scheduler, scaler = load_model_states_and_optimizer(conf, model, torch.device("cpu"))
    return conf, model, optimizer, scheduler, scaler


def nextgen(wxe, mpirun):
    from credit.models.wxformer.wxformer_next import NextGenWXFormer
    from credit.scheduler import LinearWarmupCosineScheduler
    from make_credit_nextgen_fixture import KW, X

    d = os.path.join(REPO, "tests/data/credit_nextgen")
    like = os.path.join(d, "checkpoint.pt")
    tmp = tempfile.mkdtemp(prefix="credit_nextgen_")
    lr, sched = 1e-3, dict(warmup_steps=2, total_steps=8, min_lr=1e-5)
    args = ["finetune", os.path.join(d, "model.onnx"), "--weights", like, "--data", os.path.join(d, "data"),
            "--lr", repr(lr), "--schedule", "linear-warmup-cosine", "--warmup-steps", "2", "--total-steps", "8",
            "--min-lr", "1e-5", "--ema", "--threads", "1"]

    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    runs = [("tp1", [wxe])]
    if mpirun:
        runs.append(("tp2", [mpirun, "--oversubscribe", "-n", "2", wxe]))
    for name, launcher in runs:
        save = os.path.join(tmp, name)
        tp = ["--tp", "2"] if name == "tp2" else []
        run(launcher + args + tp + ["--save", save, "--steps", "5"])
        err = run(launcher + args + tp + ["--save", save, "--steps", "6", "--resume"])
        assert "resumed from" in err, err
        trained = [l for l in err.splitlines() if "wxe: training" in l]
        out = os.path.join(tmp, f"{name}.pt")
        print(f"{name}:", run([wxe, "convert", os.path.join(save, "step_000006"), "--to", "credit", "--output", out,
                                "--like", like]).strip())
        ck = torch.load(out, weights_only=True)
        assert list(ck) == ["epoch", "model_state_dict", "optimizer_state_dict", "scheduler_state_dict",
                            "scaler_state_dict"], list(ck)
        model = NextGenWXFormer(**KW)
        model.load_state_dict(ck["model_state_dict"], strict=True)
        n = sum(p.numel() for p in model.parameters())
        ref = torch.load(like, weights_only=True)["model_state_dict"]
        assert list(ck["model_state_dict"]) == list(ref), "key order differs"
        if name == "tp1":
            wxe_n = int(trained[0].split("training ")[1].split(" ")[0])
            assert wxe_n == n, (wxe_n, n)
        print(f"{name}: strict load ok, {n} parameters (wxe trained {trained[0].split('training ')[1]}), "
              f"col_attn.attn.in_proj_weight {tuple(ck['model_state_dict']['col_attn.attn.in_proj_weight'].shape)}")
        check_optimizer_layout_sched(ck["optimizer_state_dict"], model)

        fresh = NextGenWXFormer(**KW)
        conf, fresh, opt, scheduler, scaler = resume_with_credit(out, fresh, lr, 0.01, sched)
        want = LinearWarmupCosineScheduler(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr), **sched)
        for _ in range(6):
            want.optimizer.step()
            want.step()
        got_sd, want_sd = scheduler.state_dict(), want.state_dict()
        assert got_sd == want_sd, (got_sd, want_sd)
        assert conf["trainer"]["start_epoch"] == 1
        # CREDIT builds its scheduler after loading the optimizer (the new scheduler's first step
        # sets lr to the warm-up's 0) and then loads the scheduler's state, which leaves the
        # optimizer's lr as it is: the first resumed step runs at that lr, with a checkpoint
        # CREDIT wrote itself too. The next scheduler step restores the schedule.
        first_lr = opt.param_groups[0]["lr"]
        steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
        fresh.train()
        fresh(torch.randn(*X)).square().mean().backward()
        opt.step()
        scheduler.step()
        want.optimizer.step()
        want.step()
        assert opt.param_groups[0]["lr"] == want.get_last_lr()[0], (opt.param_groups[0]["lr"], want.get_last_lr())
        print(f"{name}: CREDIT's load_model_states_and_optimizer resumed it (start_epoch 1): scheduler state after "
              f"{got_sd['last_epoch']} steps equal to LinearWarmupCosineScheduler's (lr {got_sd['_last_lr'][0]:.6g}), "
              f"scaler {scaler.state_dict()}, AdamW step {steps}; one more AdamW + scheduler step ok, lr "
              f"{opt.param_groups[0]['lr']:.6g} as CREDIT's schedule (the first resumed step ran at {first_lr}, "
              f"as CREDIT resumes its own checkpoints)")


def check_optimizer_layout_sched(osd, model):
    """check_optimizer_layout with a scheduler's initial_lr in param_groups."""
    g = dict(osd["param_groups"][0])
    assert "initial_lr" in g, list(g)
    g.pop("initial_lr")
    check_optimizer_layout(dict(osd, param_groups=[g]), model)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("out")
    c.add_argument("orig")
    c.add_argument("name")
    r = sub.add_parser("roundtrip")
    r.add_argument("name")
    r.add_argument("--no-sn", action="store_true")
    r.add_argument("--wxe", default=os.path.join(REPO, "build/wxe"))
    n = sub.add_parser("nextgen")
    n.add_argument("--wxe", default=os.path.join(REPO, "build/wxe"))
    n.add_argument("--mpirun", default="")
    a = ap.parse_args()
    if a.cmd == "check":
        check(a.out, a.orig, a.name)
    elif a.cmd == "nextgen":
        nextgen(a.wxe, a.mpirun)
    else:
        roundtrip(a.name, a.no_sn, a.wxe)


if __name__ == "__main__":
    main()
