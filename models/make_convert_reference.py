#!/usr/bin/env python3
"""Ground truth for `wxe convert` and `--weights`, made by PyTorch and CREDIT itself.

For each legacy checkpoint in ../shared/fixtures/credit (CREDIT trainer format: 1x1 conv
projections, fused to_qkv, spectral norm weight_orig/u/v) this loads the checkpoint into the
CREDIT model, calls torch.nn.utils.remove_spectral_norm on every layer that has it (PyTorch's
eval-mode fold, on the fused qkv matrix), then reshapes and splits as CREDIT's
remap_conv_state_dict does (to_qkv -> to_q/to_k/to_v from contiguous [q | k | v] blocks;
to_out, feed-forward layers.1 / layers.4 (O, I, 1, 1) -> (O, I)); every other tensor unchanged.
The result is written as tests/data/<model>_converted_ref.safetensors.

It also exports crossformer_tiny built from another seed (spectral norm removed) as
tests/data/crossformer_tiny_seed1_snbaked.onnx: a graph from one initialization that, run with
the fixture checkpoint's weights, must give the checkpoint's outputs.

Run with the venv described in models/export_credit.py:
    $WXE_PYTHON models/make_convert_reference.py [--fixtures ../shared/fixtures/credit]
"""
import argparse
import os
import sys
import warnings

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_credit import INPUT_SHAPE, TINY_KW, model_class  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEAR_SUFFIXES = (".to_out.weight", ".layers.1.weight", ".layers.4.weight")


def remove_all_spectral_norm(model):
    for module in model.modules():
        if hasattr(module, "weight_orig"):
            torch.nn.utils.remove_spectral_norm(module)


def to_linear_layout(sd):
    out = {}
    for key, val in sd.items():
        if ".to_qkv." in key:
            stem, leaf = key.rsplit(".to_qkv.", 1)
            for name, part in zip(("to_q", "to_k", "to_v"), val.reshape(val.shape[0], -1).chunk(3, dim=0)):
                out[f"{stem}.{name}.{leaf}"] = part.contiguous()
        elif key.endswith(LINEAR_SUFFIXES) and val.dim() == 4 and val.shape[-2:] == (1, 1):
            out[key] = val.reshape(val.shape[0], val.shape[1]).contiguous()
        else:
            out[key] = val.contiguous()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(REPO, "..", "shared", "fixtures", "credit"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data"))
    args = ap.parse_args()
    for name in ("crossformer_tiny", "wxformer_tiny"):
        ckpt = torch.load(os.path.join(args.fixtures, f"{name}_checkpoint.pt"), map_location="cpu", weights_only=False)
        model = model_class(name)(**TINY_KW)
        model.load_state_dict(ckpt["model_state_dict"])
        model.eval()
        remove_all_spectral_norm(model)
        sd = to_linear_layout(model.state_dict())
        path = os.path.join(args.out, f"{name}_converted_ref.safetensors")
        save_file(sd, path)
        print(f"wrote {path}: {len(sd)} tensors")

    torch.manual_seed(1)
    model = model_class("crossformer_tiny")(**TINY_KW)
    model.eval()
    remove_all_spectral_norm(model)
    path = os.path.join(args.out, "crossformer_tiny_seed1_snbaked.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(*INPUT_SHAPE),), path, dynamo=False, opset_version=17,
                          do_constant_folding=True, input_names=["x"], output_names=["y"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
