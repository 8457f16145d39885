#!/usr/bin/env python3
"""Make the small PyTorch checkpoint fixtures used by tests/torch_checkpoint_test.cpp and
tests/safetensors_test.cpp. PyTorch is the oracle: every expected value comes from it.

Run from the repository root with a Python that has torch, numpy and safetensors
(e.g. the venv described in models/export_credit.py):

    $WXE_PYTHON models/make_pt_fixtures.py [--out tests/data/pt]

Outputs (all tiny, a few kilobytes each), in --out:

  bare.pt             flat state dict (OrderedDict), torch.save defaults (pickle protocol 2):
                      float32, float16, bfloat16, float64, int64, int32, int8, uint8, bool,
                      a 0-d tensor and an empty tensor
  bare_deflate.pt     bare.pt with every zip entry DEFLATE-compressed (zipfile rewrite)
  bare_zip64.pt       bare.pt rewritten with ZIP64 extra fields on every entry and a ZIP64
                      end of central directory
  views.pt            strided views sharing one storage: transpose, slice with offset,
                      step slice, stride-0 expand, a tensor with its own storage;
                      pickle protocol 4 (FRAME, MEMOIZE, SHORT_BINUNICODE, STACK_GLOBAL)
  trainer.pt          CREDIT-trainer-style dict: epoch, model_state_dict (a tiny model with
                      spectral norm, LayerNorm, BatchNorm), optimizer_state_dict (AdamW after
                      one step), scheduler_state_dict (LambdaLR), scaler_state_dict, loss,
                      and an extra uint16 tensor (saved via _rebuild_tensor_v3 + UntypedStorage)
  params.pt           {"state_dict": {name: nn.Parameter}, "note": str}: _rebuild_parameter
  legacy.pt           the pre-1.6 (non-zip) torch.save format, to check the error message
  evil_os_system.pt   hand-made pickles that would run a command if executed by pickle:
  evil_posix_system.pt  GLOBAL os.system / posix.system / subprocess.Popen + REDUCE,
  evil_subprocess.pt    STACK_GLOBAL builtins.eval + REDUCE (protocol 4). Each payload would
  evil_builtins_eval.pt create /tmp/wxe_pwned_<pid of the loading process>. They are never
                      executed here (only written as bytes and disassembled).
  py_written.safetensors  the bare.pt tensors written by safetensors.torch.save_file, with
                      metadata {"format": "pt", "source": "make_pt_fixtures.py"}
  <name>.expect.txt   one line per returned tensor, in file order:
                      key <TAB> dtype <TAB> shape (comma separated) <TAB> expected/<file>.npy
  expected/*.npy      PyTorch's values of each tensor (contiguous; bfloat16 as float32,
                      which is exact)
"""
import argparse
import collections
import io
import os
import pickletools
import shutil
import struct
import zipfile

import numpy as np
import torch
import torch.nn as nn

DTYPE_NAME = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}


def write_expect(out, name, sd):
    os.makedirs(os.path.join(out, "expected"), exist_ok=True)
    lines = []
    for i, (k, t) in enumerate(sd.items()):
        t = t.detach()
        fname = f"{name}_{i}.npy"
        a = (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()
        np.save(os.path.join(out, "expected", fname), a)
        shape = ",".join(str(d) for d in t.shape)
        lines.append(f"{k}\t{DTYPE_NAME[t.dtype]}\t{shape}\texpected/{fname}\n")
    with open(os.path.join(out, f"{name}.expect.txt"), "w") as f:
        f.writelines(lines)


def rezip(src, dst, compression, zip64=False):
    """Copy a zip, entry by entry, with another compression or forced ZIP64 records."""
    old_limit = zipfile.ZIP64_LIMIT
    if zip64:
        zipfile.ZIP64_LIMIT = 0  # every size/offset "exceeds" it: ZIP64 extra fields + EOCD64
    try:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
            for info in zin.infolist():
                data = zin.read(info.filename)
                zi = zipfile.ZipInfo(info.filename, date_time=(2024, 1, 1, 0, 0, 0))
                zi.compress_type = compression
                with zout.open(zi, "w", force_zip64=zip64) as w:
                    w.write(data)
    finally:
        zipfile.ZIP64_LIMIT = old_limit


def bare_state_dict():
    g = torch.Generator().manual_seed(1)
    sd = collections.OrderedDict()
    sd["w_f32"] = torch.randn(3, 4, generator=g)
    sd["w_f16"] = torch.randn(5, generator=g).half()
    sd["w_bf16"] = torch.randn(2, 3, generator=g).bfloat16()
    sd["w_f64"] = torch.randn(2, 2, generator=g).double()
    sd["idx_i64"] = torch.arange(-3, 3).reshape(2, 3)
    sd["idx_i32"] = torch.tensor([7, -8, 2**31 - 1], dtype=torch.int32)
    sd["q_i8"] = torch.tensor([-128, 0, 127], dtype=torch.int8)
    sd["b_u8"] = torch.tensor([[0, 255], [1, 2]], dtype=torch.uint8)
    sd["mask"] = torch.tensor([True, False, True])
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["special"] = torch.tensor([float("inf"), -0.0, float("nan"), 1e-40])
    return sd


def views_state_dict():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = collections.OrderedDict()
    sd["base"] = base
    sd["transposed"] = base.t()                      # stride (1, 6)
    sd["slice"] = base[1:3, 2:5]                      # offset 8, stride (6, 1)
    sd["step"] = base[:, ::2]                         # stride (6, 2)
    sd["row_expand"] = base[2].unsqueeze(0).expand(3, 6)  # stride (0, 1), offset 12
    sd["own"] = torch.randn(2, 2, generator=torch.Generator().manual_seed(2))
    half = torch.arange(10, dtype=torch.float16)
    sd["h_tail"] = half[4:]                           # offset 4 into a float16 storage
    sd["h_all"] = half
    return sd


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.utils.spectral_norm(nn.Conv2d(2, 3, 3, padding=1))
        self.norm = nn.LayerNorm(3)
        self.bn = nn.BatchNorm1d(3)
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        h = self.conv(x).mean(dim=(2, 3))
        return self.lin(self.bn(self.norm(h)))


def trainer_checkpoint():
    torch.manual_seed(3)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 10))
    x = torch.randn(4, 2, 5, 5)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    model.eval()
    msd = model.state_dict()
    ckpt = {
        "epoch": 3,
        "model_state_dict": msd,
        "optimizer_state_dict": opt.state_dict(),
        "scheduler_state_dict": sched.state_dict(),
        "scaler_state_dict": {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                              "growth_interval": 2000, "_growth_tracker": 0},
        "loss": float(loss.detach()),
        "extra_u16": torch.tensor([1, 65535], dtype=torch.uint16),
    }
    return ckpt, msd


def zip_with_pickle(path, pkl, storages=()):
    """A torch-style zip whose data.pkl is the given bytes (not produced by pickle)."""
    prefix = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(prefix + "/data.pkl", pkl)
        z.writestr(prefix + "/byteorder", "little")
        for key, data in storages:
            z.writestr(prefix + "/data/" + key, data)
        z.writestr(prefix + "/version", "3\n")


def binunicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def evil_pickles():
    """(file name, pickle bytes, storages). Hand-assembled opcodes; never unpickled here."""
    touch = "touch /tmp/wxe_pwned_$PPID"  # $PPID of `sh -c` = the process calling system()
    # A valid tensor first ({"w": tensor([1., 2.])}), so the reader is mid-way through a
    # plausible state dict when it meets the bad GLOBAL.
    tensor_w = (
        binunicode("w")
        + b"ctorch._utils\n_rebuild_tensor_v2\n"
        + b"((" + binunicode("storage") + b"ctorch\nFloatStorage\n" + binunicode("0")
        + binunicode("cpu") + b"K\x02tQ"
        + b"K\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)Rt"
        + b"R"
    )
    storage0 = [("0", struct.pack("<2f", 1.0, 2.0))]
    out = []
    for mod, name in [("os", "system"), ("posix", "system")]:
        pkl = (b"\x80\x02}(" + tensor_w + binunicode("x")
               + f"c{mod}\n{name}\n".encode() + binunicode(touch) + b"\x85R" + b"u.")
        out.append((f"evil_{mod}_system.pt", pkl, storage0))
    # subprocess.Popen(["sh", "-c", touch])
    pkl = (b"\x80\x02csubprocess\nPopen\n]("
           + binunicode("sh") + binunicode("-c") + binunicode(touch) + b"e\x85R.")
    out.append(("evil_subprocess.pt", pkl, []))
    # protocol 4: STACK_GLOBAL builtins.eval, MEMOIZE, FRAME
    code = "__import__('os').system('touch /tmp/wxe_pwned_%d' % __import__('os').getpid())"
    body = (b"\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94"
            + binunicode(code) + b"\x94\x85\x94R\x94.")
    pkl = b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    out.append(("evil_builtins_eval.pt", pkl, []))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/pt")
    args = ap.parse_args()
    out = args.out
    if os.path.isdir(os.path.join(out, "expected")):
        shutil.rmtree(os.path.join(out, "expected"))
    os.makedirs(out, exist_ok=True)

    bare = bare_state_dict()
    torch.save(bare, os.path.join(out, "bare.pt"))
    write_expect(out, "bare", bare)
    rezip(os.path.join(out, "bare.pt"), os.path.join(out, "bare_deflate.pt"), zipfile.ZIP_DEFLATED)
    rezip(os.path.join(out, "bare.pt"), os.path.join(out, "bare_zip64.pt"), zipfile.ZIP_STORED,
          zip64=True)

    views = views_state_dict()
    torch.save(views, os.path.join(out, "views.pt"), pickle_protocol=4)
    write_expect(out, "views", views)

    ckpt, msd = trainer_checkpoint()
    torch.save(ckpt, os.path.join(out, "trainer.pt"))
    write_expect(out, "trainer", msd)

    g = torch.Generator().manual_seed(4)
    params = {"w": nn.Parameter(torch.randn(2, 3, generator=g)),
              "b": nn.Parameter(torch.randn(3, generator=g), requires_grad=False)}
    torch.save({"state_dict": params, "note": "parameters"}, os.path.join(out, "params.pt"))
    write_expect(out, "params", params)

    torch.save(collections.OrderedDict(a=torch.ones(2)), os.path.join(out, "legacy.pt"),
               _use_new_zipfile_serialization=False)

    for fname, pkl, storages in evil_pickles():
        pickletools.dis(pkl, out=io.StringIO())  # well-formed (disassembly only, no execution)
        zip_with_pickle(os.path.join(out, fname), pkl, storages)

    from safetensors.torch import load_file, save_file
    st_path = os.path.join(out, "py_written.safetensors")
    save_file(dict(bare), st_path, metadata={"format": "pt", "source": "make_pt_fixtures.py"})

    # Self-checks with PyTorch's own (safe) loader.
    def same(a, b):  # bitwise (NaN-safe)
        a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.view(torch.uint8), b.view(torch.uint8))
    for name, ref in [("bare.pt", bare), ("bare_deflate.pt", bare), ("bare_zip64.pt", bare),
                      ("views.pt", views), ("params.pt", params)]:
        # weights_only=True rejects FRAME (protocol 4); views.pt is our own file
        got = torch.load(os.path.join(out, name), weights_only=(name != "views.pt"))
        got = got.get("state_dict", got)
        assert list(got) == list(ref), name
        for k in ref:
            assert same(got[k].contiguous(), ref[k].detach().contiguous()), (name, k)
    got = torch.load(os.path.join(out, "trainer.pt"), weights_only=True)
    for k in msd:
        assert same(got["model_state_dict"][k], msd[k]), k
    got = load_file(st_path)
    for k in bare:
        assert same(got[k], bare[k]), k
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote fixtures to {out} ({total} bytes)")


if __name__ == "__main__":
    main()
