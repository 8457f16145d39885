#!/usr/bin/env python3
"""Fixture for ONNX `If`: a small gen1 CREDIT CrossFormer (credit/models/crossformer.py) with
"mirror" boundary padding (reflect in latitude), exported by the TorchScript exporter. The
run-time reflect Pad hides the time dimension's size from the exporter, so `x.squeeze(2)`
becomes `If(Equal(Shape(x)[2], 1), then: Squeeze(x, 2), else: Identity(x))`, as at CREDIT's
production grid. wxe folds that If once the input shape is bound.

Small: dim (4, 8, 16, 32), dim_head 4, depth 1, no spectral norm, 32x64 grid, padding 16/16.
Writes tests/data/crossformer_mirror_if.onnx, crossformer_mirror_if_x.npy, _y.npy.
    $WXE_PYTHON models/make_if_fixture.py
"""
import collections
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

from credit.models.crossformer import CrossFormer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
KW = dict(image_height=32, image_width=64, frames=1, output_frames=1, channels=2, levels=2, surface_channels=2,
          input_only_channels=1, output_only_channels=0, dim=(4, 8, 16, 32), depth=(1, 1, 1, 1), dim_head=4,
          global_window_size=(4, 2, 2, 1), local_window_size=2,
          cross_embed_kernel_sizes=((4, 8), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2, 2),
          attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=False, interp=True,
          padding_conf={"activate": True, "mode": "mirror", "pad_lat": [16, 16], "pad_lon": [16, 16]})

torch.manual_seed(0)
model = CrossFormer(**KW).eval()
x = torch.randn(1, 7, 1, 32, 64)
with torch.no_grad():
    y = model(x)
path = os.path.join(OUT, "crossformer_mirror_if.onnx")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=True,
                      input_names=["x"], output_names=["y"])
ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
assert ops["If"] == 1, ops
out = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
print("params", sum(p.numel() for p in model.parameters()), "bytes", os.path.getsize(path),
      "ORT vs PyTorch", float(np.abs(out - y.numpy()).max()))
np.save(os.path.join(OUT, "crossformer_mirror_if_x.npy"), x.numpy())
np.save(os.path.join(OUT, "crossformer_mirror_if_y.npy"), y.numpy())

# A general If: the condition depends on the input's values, so it cannot be folded.
#   y = If(ReduceSum(x) > 0, then: x * 2 + b, else: x - 1), b a (3,) initializer of the then
#   branch. Writes tests/data/if_runtime.onnx; onnxruntime checks both ways.
from onnx import TensorProto, helper  # noqa: E402

two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
bias = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, -0.25, 1.0])
then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t0"], name="/then/Mul"),
                            helper.make_node("Add", ["t0", "b"], ["t"], name="/then/Add")],
                           "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])],
                           initializer=[two, bias])
else_g = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"], name="/else/Sub")], "else", [],
                           [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])], initializer=[one])
zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
graph = helper.make_graph(
    [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="/ReduceSum"),
     helper.make_node("Greater", ["s", "zero"], ["c"], name="/Greater"),
     helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="/If")],
    "if_runtime", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[zero])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(model)
path = os.path.join(OUT, "if_runtime.onnx")
onnx.save(model, path)
sess = ort.InferenceSession(path)
for xv in (np.arange(6, dtype=np.float32).reshape(2, 3), -np.arange(6, dtype=np.float32).reshape(2, 3)):
    want = xv * 2 + np.array([0.5, -0.25, 1.0], np.float32) if xv.sum() > 0 else xv - 1
    assert np.allclose(sess.run(None, {"x": xv})[0], want)
print(path, "checked with onnxruntime")
