#!/usr/bin/env python3
"""Export the tiny CREDIT CrossFormer / WXFormer models to ONNX with PyTorch 2.x.

The shared fixtures in shared/fixtures/credit/ were exported with PyTorch 1.13.
This script makes the PyTorch 2.x counterparts (TorchScript exporter and the
dynamo / torch.export exporter) of the two tiny models, so the importer can be
tested against the op sets newer exporters emit.

Setup (a venv OUTSIDE the repository; PyPI only; torch pulls several GB of
CUDA wheels even on a CPU-only machine, which is fine outside the repo):

    python3 -m venv "$WXE_VENV"      # e.g. WXE_VENV=../wxe-venv, beside the checkout
    "$WXE_VENV"/bin/pip install torch onnx onnxruntime onnxscript safetensors numpy \
        einops pyyaml xarray pandas cftime torchvision torch-harmonics \
        segmentation-models-pytorch
    # miles-credit's declared deps (cartopy, pygrib, zarr, ...) are not needed to
    # build the models; install it without them:
    "$WXE_VENV"/bin/pip install --no-deps miles-credit
    export WXE_PYTHON="$WXE_VENV"/bin/python   # the Python every script's usage line names

Run (from the repository root):

    $WXE_PYTHON models/export_credit.py                  # the set kept in tests/data
    $WXE_PYTHON models/export_credit.py --all --out /tmp/x  # also wxformer_tiny/ts
    $WXE_PYTHON models/export_credit.py --models wxformer_tiny --exporters ts
    $WXE_PYTHON models/export_credit.py --report /tmp/exports.md
    $WXE_PYTHON models/export_credit.py --analyze-only  # re-analyse existing files

Outputs, in --out (default tests/data):

    torch2_<model>_ts.onnx      (crossformer_tiny only unless --all; see DEFAULT_SKIP)
                                torch.onnx.export(dynamo=False, opset 17, constant folding),
                                spectral norm traced in the graph (weight_orig/weight_u/weight_v)
    torch2_<model>_dynamo.onnx  torch.onnx.export(dynamo=True, opset 18, external_data=False),
                                a single self-contained file
    torch2_<model>_x.npy        float32 input, torch.manual_seed(0); torch.randn(1, 7, 1, 32, 64)
    torch2_<model>_y.npy        float32 PyTorch eval-mode output, (1, 6, 1, 32, 64)

Models (the tiny config of shared/fixtures/README.md):

    crossformer_tiny  credit.models.crossformer.CrossFormer (ConvTranspose2d decoder)
    wxformer_tiny     credit.models.wxformer.crossformer.CrossFormer (PixelShuffle decoder)

Weights: torch.manual_seed(0) before construction, then three train-mode forwards
to warm the spectral-norm power iteration (as the shared fixtures did), then eval.
With this the weights equal the shared fixtures' checkpoints to ~4e-7 (the
spectral-norm u/v differ in the last bits), so the outputs are close to the
fixtures' *_y.npy too.

Each export is checked with onnxruntime against the PyTorch output; an exporter
that fails is caught and reported (see models/EXPORTS.md). --report writes a
Markdown summary: opset, node count, op types with counts, the op types outside
the PyTorch 1.13 fixtures' set and their attributes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import traceback
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = ("crossformer_tiny", "wxformer_tiny")
EXPORTERS = ("ts", "dynamo")
TS_OPSET = 17
# Combinations left out unless --all is given, with the reason (models/EXPORTS.md).
DEFAULT_SKIP = {
    ("wxformer_tiny", "ts"): "op-for-op the same graph as the shared PyTorch 1.13 fixture "
    "wxformer_tiny_opset17.onnx (same 4153-node op sequence and op counts) and 11.9 MB: "
    "it adds no coverage, so it is not kept in tests/data",
}
DYNAMO_OPSET = 18

# Op types of the PyTorch 1.13 fixture exports: the importer's baseline.
BASE_OPS = (
    "Constant Unsqueeze Mul Gather Shape Div MatMul Cast Reshape Identity Concat Add "
    "ReduceMean Transpose Conv Slice Gemm Sub LayerNormalization Relu Einsum Sqrt Erf "
    "Softmax InstanceNormalization Sigmoid ConvTranspose Resize Squeeze Pad "
    "ConstantOfShape DepthToSpace"
).split()

# Tiny config from shared/fixtures/README.md.
TINY_KW = dict(
    image_height=32,
    image_width=64,
    frames=1,
    output_frames=1,
    channels=2,
    levels=2,
    surface_channels=2,
    input_only_channels=1,
    output_only_channels=0,
    dim=(16, 32, 64, 128),
    depth=(1, 1, 2, 1),
    dim_head=8,
    global_window_size=(4, 2, 2, 1),
    local_window_size=2,
    cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
    cross_embed_strides=(2, 2, 2, 2),
    attn_dropout=0.0,
    ff_dropout=0.0,
    use_spectral_norm=True,
    interp=True,
    padding_conf={"activate": True, "mode": "earth", "pad_lat": [16, 16], "pad_lon": [16, 16]},
)
INPUT_SHAPE = (1, 7, 1, 32, 64)


def model_class(name):
    if name == "crossformer_tiny":
        from credit.models.crossformer import CrossFormer
    elif name == "wxformer_tiny":
        from credit.models.wxformer.crossformer import CrossFormer
    else:
        raise ValueError(f"unknown model {name}")
    return CrossFormer


def build_model(name, warm_steps=3):
    """Seed 0, construct, warm spectral norm with train-mode forwards, eval."""
    import torch

    torch.manual_seed(0)
    model = model_class(name)(**TINY_KW)
    model.train()
    with torch.no_grad():
        for _ in range(warm_steps):
            model(torch.randn(*INPUT_SHAPE))
    model.eval()
    return model


def make_input():
    import torch

    torch.manual_seed(0)
    return torch.randn(*INPUT_SHAPE, dtype=torch.float32)


# --------------------------------------------------------------------------- export


def export_ts(model, x, path):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=False,
            opset_version=TS_OPSET,
            do_constant_folding=True,
            training=torch.onnx.TrainingMode.EVAL,
            input_names=["x"],
            output_names=["y"],
        )
    return {"opset_requested": TS_OPSET}


def export_dynamo(model, x, path, opset=None):
    import torch

    opset = opset or DYNAMO_OPSET

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            model,
            (x,),
            dynamo=True,
            opset_version=opset,
            input_names=["x"],
            output_names=["y"],
            optimize=True,
            external_data=False,
        )
        # Save explicitly as one self-contained file (no .onnx.data side file).
        prog.save(path, external_data=False)
    return {"opset_requested": opset}


def ort_check(path, x, y):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0].name
    out = sess.run(None, {inp: x})[0]
    if out.shape != y.shape:
        return {"ort_shape": list(out.shape), "ort_max_abs_err": None}
    return {"ort_shape": list(out.shape), "ort_max_abs_err": float(np.abs(out - y).max())}


def essence(exc):
    """First meaningful lines of an exception message."""
    msg = f"{type(exc).__name__}: {exc}"
    lines = [ln.rstrip() for ln in msg.splitlines() if ln.strip()]
    return "\n".join(lines[:8])


# --------------------------------------------------------------------------- analysis


def _attr_repr(attr):
    import onnx
    from onnx import helper

    v = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        arr = onnx.numpy_helper.to_array(v)
        if arr.size <= 8:
            return f"tensor<{arr.dtype}>{list(arr.shape)}={arr.flatten().tolist()}"
        return f"tensor<{arr.dtype}>{list(arr.shape)}"
    if attr.type == onnx.AttributeProto.GRAPH:
        return f"graph({len(v.node)} nodes)"
    if attr.type == onnx.AttributeProto.GRAPHS:
        return f"graphs({len(v)})"
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (list, tuple)):
        return [x.decode(errors="replace") if isinstance(x, bytes) else x for x in v]
    if attr.type == onnx.AttributeProto.INT and attr.name == "to":
        return f"{v} ({onnx.TensorProto.DataType.Name(v)})"
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def _walk(graph, where="main"):
    """Yield (where, node) for the graph and any subgraphs (If/Loop/Scan bodies)."""
    import onnx

    for node in graph.node:
        yield where, node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk(a.g, f"{where}/{node.op_type}:{a.name}")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for i, g in enumerate(a.graphs):
                    yield from _walk(g, f"{where}/{node.op_type}:{a.name}[{i}]")


def _const_values(model):
    """name -> numpy array for initializers and Constant outputs (main graph)."""
    import onnx
    from onnx import numpy_helper

    vals = {}
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        vals[init.name] = numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            a = node.attribute[0]
            if a.name == "value":
                vals[node.output[0]] = numpy_helper.to_array(a.t)
            elif a.name == "value_ints":
                vals[node.output[0]] = np.array(list(a.ints), dtype=np.int64)
            elif a.name == "value_int":
                vals[node.output[0]] = np.array(a.i, dtype=np.int64)
            elif a.name == "value_floats":
                vals[node.output[0]] = np.array(list(a.floats), dtype=np.float32)
            elif a.name == "value_float":
                vals[node.output[0]] = np.array(a.f, dtype=np.float32)
    return vals


def analyze(path):
    """Summarise one ONNX file: opsets, io, op counts, attributes, functions."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    g = model.graph
    ext = [i.name for i in g.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    consts = _const_values(model)
    info = {
        "file": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "inputs": [(i.name, _shape(i)) for i in g.input],
        "outputs": [(o.name, _shape(o)) for o in g.output],
        "n_initializers": len(g.initializer),
        "n_params": int(sum(np.prod(i.dims) for i in g.initializer)),
        "external_data_initializers": len(ext),
        "sn_initializers": sum(
            1 for i in g.initializer if i.name.endswith(("weight_orig", "weight_u", "weight_v"))
        ),
        "functions": [f"{f.domain}::{f.name} ({len(f.node)} nodes)" for f in model.functions],
        "main_nodes": len(g.node),
    }
    counts = collections.Counter()
    domains = collections.Counter()
    attrs = collections.defaultdict(collections.Counter)
    subgraphs = collections.Counter()
    notes = collections.defaultdict(collections.Counter)
    nodes = list(_walk(g))
    for f in model.functions:
        nodes += list(_walk(f, f"function {f.domain}::{f.name}"))
    for where, node in nodes:
        key = node.op_type if not node.domain or node.domain == "ai.onnx" else f"{node.domain}::{node.op_type}"
        counts[key] += 1
        domains[node.domain or "ai.onnx"] += 1
        if where != "main":
            subgraphs[where] += 1
        sig = {a.name: _attr_repr(a) for a in node.attribute}
        if node.op_type == "Constant":
            # Only the kind of constant, not every value.
            sig = {k: (v.split("=")[0] if isinstance(v, str) else type(v).__name__) for k, v in sig.items()}
        attrs[key][json.dumps(sig, sort_keys=True, default=str)] += 1
        # Input-side facts the importer cares about.
        dyn = [i for i in node.input[1:] if i and i not in consts]
        if node.op_type in ("Slice",):
            st = consts.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
            ax = consts.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            notes[key][
                f"steps={None if st is None else st.tolist()} axes={None if ax is None else ax.tolist()}"
                + (" (some starts/ends/axes/steps computed at run time)" if dyn else "")
            ] += 1
        elif node.op_type in ("Pad",):
            pads = consts.get(node.input[1]) if len(node.input) > 1 else None
            axes = consts.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            notes[key][
                f"pads={None if pads is None else pads.tolist()} axes={None if axes is None else axes.tolist()}"
                f" constant_value_input={'yes' if len(node.input) > 2 and node.input[2] else 'no'}"
            ] += 1
        elif node.op_type in ("Resize",):
            desc = []
            for idx, nm in ((1, "roi"), (2, "scales"), (3, "sizes")):
                if len(node.input) > idx and node.input[idx]:
                    v = consts.get(node.input[idx])
                    desc.append(f"{nm}={'runtime' if v is None else v.tolist()}")
            notes[key][" ".join(desc)] += 1
        elif key not in BASE_OPS or node.op_type in ("LayerNormalization", "Reshape", "Gather",
                                                     "ReduceMean", "Squeeze", "Unsqueeze"):
            # Describe every input (constant: dtype/shape, small values; else run time)
            # and the number of outputs, so the importer knows what to expect.
            desc = []
            for i, nm in enumerate(node.input):
                if not nm:
                    desc.append("''")
                elif nm in consts:
                    v = consts[nm]
                    desc.append(f"const {v.dtype}{list(v.shape)}"
                                + (f"={v.flatten().tolist()}" if v.size <= 4 and i > 0 else ""))
                else:
                    desc.append("runtime")
            if node.op_type in ("Reshape", "Gather"):
                # only the shape / indices input matters here
                what = "shape" if node.op_type == "Reshape" else "indices"
                v = consts.get(node.input[1])
                if v is None:
                    desc = [f"{what} runtime"]
                elif node.op_type == "Reshape":
                    flags = [f for f, c in (("has 0", (v == 0).any()), ("has -1", (v == -1).any())) if c]
                    desc = [f"shape const rank {v.size}" + (f" ({', '.join(flags)})" if flags else "")]
                else:
                    desc = [f"indices const {v.dtype}{list(v.shape)}"]
            outs = sum(1 for o in node.output if o)
            notes[key][f"in=({', '.join(desc)}) outputs={outs}"] += 1
    info["node_count"] = sum(counts.values())
    info["op_counts"] = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    info["domains"] = dict(domains)
    info["subgraphs"] = dict(subgraphs)
    info["new_ops"] = sorted(k for k in counts if k not in BASE_OPS)
    info["attrs"] = {k: dict(v) for k, v in attrs.items()}
    info["notes"] = {k: dict(v) for k, v in notes.items()}
    init_types = collections.Counter(onnx.TensorProto.DataType.Name(i.data_type) for i in g.initializer)
    info["initializer_dtypes"] = dict(init_types)
    return info


def _shape(vi):
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    import onnx

    return f"{onnx.TensorProto.DataType.Name(t.elem_type)}{dims}"


def report_md(results):
    """Markdown for a list of result dicts (export + analysis)."""
    out = []
    for r in results:
        head = f"### `{r['file']}`"
        out.append(head)
        out.append("")
        if r.get("error"):
            out.append(f"**Export failed** ({r['model']}, {r['exporter']}):")
            out.append("")
            out.append("```")
            out.append(r["error"])
            out.append("```")
            out.append("")
            continue
        a = r["analysis"]
        err = r.get("ort_max_abs_err")
        out.append(f"- size: {a['bytes']:,} bytes; ir_version {a['ir_version']}; producer `{a['producer']}`")
        out.append(f"- opset_import: {a['opset_import']}")
        out.append(f"- inputs: {a['inputs']}; outputs: {a['outputs']}")
        out.append(
            f"- initializers: {a['n_initializers']} ({a['n_params']:,} values; dtypes {a['initializer_dtypes']}); "
            f"external-data initializers: {a['external_data_initializers']}; "
            f"spectral-norm initializers (weight_orig/_u/_v): {a['sn_initializers']}"
        )
        out.append(f"- model-level functions: {a['functions'] or 'none'}; subgraphs (If/Loop/Scan): "
                   f"{a['subgraphs'] or 'none'}")
        out.append(f"- nodes: {a['node_count']} (main graph {a['main_nodes']})")
        if err is not None:
            out.append(f"- onnxruntime vs PyTorch eval output: max abs err {err:.3g}")
        out.append("- op types: " + ", ".join(f"{k} {v}" for k, v in a["op_counts"].items()))
        out.append("- op types NOT in the PyTorch 1.13 fixtures' set: "
                   + (", ".join(f"**{k}**" for k in a["new_ops"]) or "none"))
        out.append("")
        out.append("| op | count | attributes (distinct sets, with counts) | inputs / outputs |")
        out.append("| --- | --- | --- | --- |")
        for op, n in a["op_counts"].items():
            combos = sorted(a["attrs"].get(op, {}).items(), key=lambda kv: -kv[1])
            at = "; ".join(f"`{s}` x{c}" for s, c in combos[:8])
            if len(combos) > 8:
                at += f"; ... {len(combos) - 8} more sets"
            nt = "; ".join(f"{s} x{c}" for s, c in sorted(a["notes"].get(op, {}).items(),
                                                          key=lambda kv: -kv[1])[:12])
            mark = "**NEW** " if op in a["new_ops"] else ""
            out.append(f"| {mark}{op} | {n} | {at} | {nt} |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "tests", "data"))
    p.add_argument("--models", default=",".join(MODELS),
                   help="comma-separated subset of " + ",".join(MODELS))
    p.add_argument("--exporters", default=",".join(EXPORTERS),
                   help="comma-separated subset of " + ",".join(EXPORTERS))
    p.add_argument("--dynamo-opset", type=int, default=DYNAMO_OPSET,
                   help=f"opset for the dynamo exporter (default {DYNAMO_OPSET}; the exporter's "
                   "own default in torch 2.14 is 20, which adds Gelu)")
    p.add_argument("--all", action="store_true",
                   help="also make the combinations skipped by default: "
                   + "; ".join(f"{m}/{e}" for m, e in DEFAULT_SKIP))
    p.add_argument("--report", help="write a Markdown summary to this path ('-' for stdout)")
    p.add_argument("--json", help="write the raw results as JSON to this path")
    p.add_argument("--analyze-only", action="store_true",
                   help="do not export; analyse and ORT-check the files already in --out")
    args = p.parse_args(argv)

    models = [m for m in args.models.split(",") if m]
    exporters = [e for e in args.exporters.split(",") if e]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m}")
    for e in exporters:
        if e not in EXPORTERS:
            p.error(f"unknown exporter {e}")
    os.makedirs(args.out, exist_ok=True)

    if not args.analyze_only:
        import torch

        torch.set_num_threads(max(1, os.cpu_count() or 1))
        print(f"torch {torch.__version__}", file=sys.stderr)

    results = []
    for name in models:
        xpath = os.path.join(args.out, f"torch2_{name}_x.npy")
        ypath = os.path.join(args.out, f"torch2_{name}_y.npy")
        model = None
        if args.analyze_only:
            x, y = np.load(xpath), np.load(ypath)
        else:
            import torch

            model = build_model(name)
            xt = make_input()
            with torch.no_grad():
                yt = model(xt)
            x = xt.numpy().astype(np.float32)
            y = yt.numpy().astype(np.float32)
            np.save(xpath, x)
            np.save(ypath, y)
            nparams = sum(p.numel() for p in model.parameters())
            print(f"{name}: {nparams:,} params, y {tuple(y.shape)}", file=sys.stderr)
        for exp in exporters:
            if (name, exp) in DEFAULT_SKIP and not args.all:
                print(f"{name}/{exp}: skipped by default ({DEFAULT_SKIP[(name, exp)]}); "
                      "--all makes it", file=sys.stderr)
                continue
            path = os.path.join(args.out, f"torch2_{name}_{exp}.onnx")
            r = {"model": name, "exporter": exp, "file": os.path.basename(path)}
            if not args.analyze_only:
                for stale in (path, path + ".data"):
                    if os.path.exists(stale):
                        os.remove(stale)
                t0 = time.time()
                try:
                    if exp == "dynamo":
                        r.update(export_dynamo(model, xt, path, args.dynamo_opset))
                    else:
                        r.update(export_ts(model, xt, path))
                except Exception as exc:  # record and go on
                    r["error"] = essence(exc)
                    print(f"{name}/{exp}: EXPORT FAILED: {r['error']}", file=sys.stderr)
                    traceback.print_exc(file=sys.stderr)
                    if os.path.exists(path):
                        os.remove(path)
                    results.append(r)
                    continue
                r["export_seconds"] = round(time.time() - t0, 1)
            if not os.path.exists(path):
                r["error"] = "file missing"
                results.append(r)
                continue
            r["side_files"] = [f for f in os.listdir(args.out)
                               if f.startswith(os.path.basename(path)) and f != os.path.basename(path)]
            try:
                r.update(ort_check(path, x, y))
            except Exception as exc:
                r["ort_error"] = essence(exc)
            r["analysis"] = analyze(path)
            a = r["analysis"]
            print(f"{name}/{exp}: {a['bytes']:,} B, {a['node_count']} nodes, opset {a['opset_import']}, "
                  f"ORT max abs err {r.get('ort_max_abs_err')}, new ops {a['new_ops']}"
                  + (f", ORT ERROR {r['ort_error']}" if r.get("ort_error") else ""), file=sys.stderr)
            results.append(r)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.report:
        md = report_md(results)
        if args.report == "-":
            print(md)
        else:
            with open(args.report, "w") as f:
                f.write(md + "\n")
    failed_ort = [r for r in results if r.get("ort_error")]
    return 1 if failed_ort else 0


if __name__ == "__main__":
    sys.exit(main())
