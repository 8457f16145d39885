// Gradient cases (tests/grad_check.h: finite differences of the reference forward) for the
// elementwise, shape and data ops, whose backward kernels are in
// kernels/cpu/backward_pointwise.cpp; and direct checks of what the harness cannot see
// (absent output gradients, full overwrite of the uninitialized input gradients).
#include <cmath>
#include <limits>
#include <set>

#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// Values on a grid of step 0.2 plus `offset`: two tensors with different offsets never come
// within 2h of each other (Max/Min ties, Clip bounds), so finite differences stay off kinks.
Tensor grid(Shape s, unsigned seed, float offset = 0.f) {
  Tensor t = randn(std::move(s), seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::round(t.data<float>()[i] * 5) / 5 + offset;
  return t;
}

// Normal values pushed at least `margin` away from 0 (Relu, Abs, divisors).
Tensor off_zero(Shape s, unsigned seed, float margin = 0.2f) {
  Tensor t = randn(std::move(s), seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& v = t.data<float>()[i];
    v = v < 0 ? v - margin : v + margin;
  }
  return t;
}

// |normal| + lo (Sqrt, Log, Pow's base).
Tensor positive(Shape s, unsigned seed, float lo = 0.5f) {
  Tensor t = randn(std::move(s), seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::fabs(t.data<float>()[i]) + lo;
  return t;
}

Tensor ints(Shape s, std::vector<int64_t> v) { return Tensor::from_i64(v).reshaped(std::move(s)); }
Tensor ints(std::vector<int64_t> v) { return Tensor::from_i64(v); }

Tensor ints32(Shape s, std::vector<int64_t> v) {
  Tensor t(DType::I32, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = (int32_t)v[i];
  return t;
}

Tensor bools(Shape s, std::vector<int> v) {
  Tensor t(DType::Bool, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<uint8_t>()[i] = (uint8_t)v[i];
  return t;
}

Tensor floats(std::vector<float> v) { return Tensor::from_f32({(int64_t)v.size()}, v); }

GradCase fixed(GradCase c, std::vector<int> f) {
  c.fixed = std::move(f);
  return c;
}

// A case whose node has `nout` outputs (Split).
GradCase multi_out(const std::string& label, const std::string& op, int nout, std::vector<Tensor> inputs,
                   std::map<std::string, Attr> attrs = {}) {
  GradCase c = grad_case(label, op, std::move(inputs), attrs);
  c.node = make_node(op, (int)c.inputs.size(), nout, std::move(attrs));
  return c;
}

// Broadcast shape pairs: same shape, trailing (3, 1), scalar, both sides broadcast, 1-D.
const std::vector<std::pair<Shape, Shape>> kPairs = {
    {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {3, 1}}, {{2, 3, 4}, {}}, {{3, 1}, {2, 1, 4}}, {{4}, {2, 3, 4}}};

std::vector<GradCase> binary_cases(const std::string& op) {
  std::vector<GradCase> r;
  unsigned seed = 10;
  for (auto& [sa, sb] : kPairs) {
    Tensor a, b;
    if (op == "Div") {
      a = randn(sa, seed);
      b = off_zero(sb, seed + 1, 0.5f);
    } else if (op == "Pow") {
      a = positive(sa, seed);
      b = randn(sb, seed + 1);
    } else if (op == "Max" || op == "Min") {
      a = grid(sa, seed);
      b = grid(sb, seed + 1, 0.1f);
    } else {
      a = randn(sa, seed);
      b = randn(sb, seed + 1);
    }
    r.push_back(grad_case(op + " " + shape_str(sa) + " " + shape_str(sb), op, {a, b}));
    seed += 2;
  }
  return r;
}

}  // namespace

// ---- binary arithmetic with broadcasting ----
GRAD_CASES("Add") { return binary_cases("Add"); }
GRAD_CASES("Sub") { return binary_cases("Sub"); }
GRAD_CASES("Mul") { return binary_cases("Mul"); }
GRAD_CASES("Div") { return binary_cases("Div"); }
GRAD_CASES("Pow") {
  auto r = binary_cases("Pow");
  // integer exponent (no gradient for it), and a negative base with a constant exponent
  r.push_back(grad_case("Pow int64 exponent", "Pow", {randn({2, 3}, 30), ints({2, 1}, {2, 3})}));
  r.push_back(fixed(grad_case("Pow negative base", "Pow", {off_zero({2, 3}, 31), Tensor::scalar_f32(3.f)}), {1}));
  return r;
}
GRAD_CASES("Max") {
  auto r = binary_cases("Max");
  Tensor a = randn({2, 3}, 32);
  r.push_back(grad_case("Max ties (gradient split in half)", "Max", {a, a.clone()}));
  return r;
}
GRAD_CASES("Min") {
  auto r = binary_cases("Min");
  Tensor a = randn({2, 3}, 33);
  r.push_back(grad_case("Min ties (gradient split in half)", "Min", {a, a.clone()}));
  return r;
}
GRAD_CASES("Sum") {
  return {grad_case("Sum of one", "Sum", {randn({2, 3}, 40)}),
          grad_case("Sum broadcast (2,3,4) (3,1) scalar", "Sum",
                    {randn({2, 3, 4}, 41), randn({3, 1}, 42), Tensor::scalar_f32(0.3f)})};
}
GRAD_CASES("Where") {
  return {grad_case("Where same shapes", "Where",
                    {bools({2, 3}, {1, 0, 0, 1, 1, 0}), randn({2, 3}, 50), randn({2, 3}, 51)}),
          grad_case("Where broadcast cond (2,1,4) x (3,4) y scalar", "Where",
                    {bools({2, 1, 4}, {1, 0, 1, 1, 0, 0, 1, 0}), randn({3, 4}, 52), Tensor::scalar_f32(0.5f)})};
}

// ---- unary ----
GRAD_CASES("Sqrt") { return {grad_case("Sqrt", "Sqrt", {positive({3, 4}, 60)})}; }
GRAD_CASES("Erf") { return {grad_case("Erf", "Erf", {randn({3, 4}, 61)})}; }
GRAD_CASES("Relu") { return {grad_case("Relu", "Relu", {off_zero({3, 4}, 62)})}; }
GRAD_CASES("Sigmoid") { return {grad_case("Sigmoid", "Sigmoid", {randn({3, 4}, 63, 2.f)})}; }
GRAD_CASES("Tanh") { return {grad_case("Tanh", "Tanh", {randn({3, 4}, 64, 1.5f)})}; }
GRAD_CASES("Exp") { return {grad_case("Exp", "Exp", {randn({3, 4}, 65)})}; }
GRAD_CASES("Log") { return {grad_case("Log", "Log", {positive({3, 4}, 66)})}; }
GRAD_CASES("Neg") { return {grad_case("Neg", "Neg", {randn({3, 4}, 67)})}; }
GRAD_CASES("Abs") { return {grad_case("Abs", "Abs", {off_zero({3, 4}, 68)})}; }
GRAD_CASES("Reciprocal") { return {grad_case("Reciprocal", "Reciprocal", {off_zero({3, 4}, 69, 0.5f)})}; }
GRAD_CASES("Sin") { return {grad_case("Sin", "Sin", {randn({3, 4}, 70, 2.f)})}; }
GRAD_CASES("Cos") { return {grad_case("Cos", "Cos", {randn({3, 4}, 71, 2.f)})}; }
GRAD_CASES("Softplus") {
  Tensor big = Tensor::from_f32({4}, {19.f, 21.f, 25.f, -3.f});  // above 20 the forward is x
  return {grad_case("Softplus", "Softplus", {randn({3, 4}, 72, 3.f)}),
          grad_case("Softplus large inputs", "Softplus", {big})};
}
GRAD_CASES("LeakyRelu") {
  return {grad_case("LeakyRelu default alpha", "LeakyRelu", {off_zero({3, 4}, 73)}),
          grad_case("LeakyRelu alpha 0.2", "LeakyRelu", {off_zero({3, 4}, 74)}, {{"alpha", attr_f(0.2f)}})};
}
GRAD_CASES("Clip") {
  // x on the 0.2 grid, bounds 0.1 off it: gradients reach min and max too
  Tensor x = grid({4, 5}, 75), lo = Tensor::scalar_f32(-0.3f), hi = Tensor::scalar_f32(0.5f);
  return {grad_case("Clip min max", "Clip", {x, lo, hi}), grad_case("Clip min only", "Clip", {x, lo}),
          grad_case("Clip max only", "Clip", {x, Tensor(), hi}), grad_case("Clip no bounds", "Clip", {x})};
}

// ---- casts and copies ----
GRAD_CASES("Cast") {
  return {grad_case("Cast float32 -> float32", "Cast", {randn({2, 3}, 80)}, {{"to", attr_i(1)}}),
          grad_case("Cast float32 -> float64 (no float32 output gradient)", "Cast", {randn({2, 3}, 81)},
                    {{"to", attr_i(11)}}),
          grad_case("Cast float32 -> int64 (no gradient)", "Cast", {randn({2, 3}, 82)}, {{"to", attr_i(7)}})};
}
GRAD_CASES("CastLike") {
  return {grad_case("CastLike float32 target", "CastLike", {randn({2, 3}, 83), randn({1}, 84)}),
          grad_case("CastLike int64 target (no gradient)", "CastLike", {randn({2, 3}, 85), ints({1})})};
}
GRAD_CASES("Identity") { return {grad_case("Identity", "Identity", {randn({2, 3}, 90)})}; }
GRAD_CASES("Reshape") {
  return {grad_case("Reshape -1", "Reshape", {randn({2, 3, 4}, 91), ints({4, -1})}),
          grad_case("Reshape 0 copies a dim", "Reshape", {randn({2, 3, 4}, 92), ints({0, 12})})};
}
GRAD_CASES("Squeeze") {
  return {grad_case("Squeeze axes 1 -1", "Squeeze", {randn({2, 1, 3, 1}, 93), ints({1, -1})}),
          grad_case("Squeeze all ones", "Squeeze", {randn({2, 1, 3, 1}, 94)})};
}
GRAD_CASES("Unsqueeze") {
  return {grad_case("Unsqueeze 0 -1", "Unsqueeze", {randn({2, 3}, 95), ints({0, -1})})};
}
GRAD_CASES("Flatten") {
  return {grad_case("Flatten default axis", "Flatten", {randn({2, 3, 4}, 96)}),
          grad_case("Flatten axis -1", "Flatten", {randn({2, 3, 4}, 97)}, {{"axis", attr_i(-1)}}),
          grad_case("Flatten axis 0", "Flatten", {randn({2, 3, 4}, 98)}, {{"axis", attr_i(0)}})};
}

// ---- shape ops ----
GRAD_CASES("Concat") {
  return {grad_case("Concat axis 1 of three", "Concat", {randn({2, 1, 3}, 100), randn({2, 3, 3}, 101), randn({2, 2, 3}, 102)},
                    {{"axis", attr_i(1)}}),
          grad_case("Concat axis -1", "Concat", {randn({2, 3, 2}, 103), randn({2, 3, 1}, 104)}, {{"axis", attr_i(-1)}})};
}
GRAD_CASES("Expand") {
  return {grad_case("Expand (3,1) -> (2,3,4)", "Expand", {randn({3, 1}, 110), ints({2, 3, 4})}),
          grad_case("Expand scalar -> (2,2)", "Expand", {Tensor::scalar_f32(0.7f), ints({2, 2})}),
          grad_case("Expand (1,4) by (3,1)", "Expand", {randn({1, 4}, 111), ints({3, 1})})};
}
GRAD_CASES("Tile") {
  return {grad_case("Tile (2,3) x (2,1)", "Tile", {randn({2, 3}, 112), ints({2, 1})}),
          grad_case("Tile (1,2,3) x (2,2,2)", "Tile", {randn({1, 2, 3}, 113), ints({2, 2, 2})})};
}

// ---- data ops ----
GRAD_CASES("Split") {
  return {multi_out("Split uneven sizes input", "Split", 2, {randn({2, 4, 3}, 120), ints({1, 3})}, {{"axis", attr_i(1)}}),
          multi_out("Split num_outputs 3 of 5 (2,2,1)", "Split", 3, {randn({5, 2}, 121)},
                    {{"axis", attr_i(0)}, {"num_outputs", attr_i(3)}}),
          multi_out("Split even axis -1", "Split", 2, {randn({2, 3, 4}, 122)}, {{"axis", attr_i(-1)}}),
          multi_out("Split sizes attribute (opset < 13)", "Split", 2, {randn({3, 2}, 123)},
                    {{"split", attr_ints({2, 1})}})};
}
GRAD_CASES("Slice") {
  Tensor x = randn({4, 5, 6}, 130);
  return {grad_case("Slice negative steps on axes 0 and 2", "Slice",
                    {x, ints({3, -1}), ints({0, -100}), ints({0, 2}), ints({-1, -2})}),
          grad_case("Slice step 2 to INT64_MAX on axis -1", "Slice", {x, ints({1}), ints({kMax}), ints({-1}), ints({2})}),
          grad_case("Slice full flip (INT64_MIN end)", "Slice", {x, ints({-1}), ints({kMin}), ints({1}), ints({-1})}),
          grad_case("Slice without axes and steps, clamped starts", "Slice", {x, ints({-100, 1}), ints({2, 3})}),
          grad_case("Slice three axes mixed steps", "Slice",
                    {x, ints({0, 4, 1}), ints({4, 0, 6}), ints({0, 1, 2}), ints({3, -3, 2})})};
}
// PlaneGather (engine/passes/fuse.h fuse_plane_gathers): a map with runs, a reversed row and
// repeated elements (padding copies, whose gradients sum), over 2 x 3 planes, lead reshaped.
GRAD_CASES("PlaneGather") {
  Tensor map(DType::I32, {3, 5});
  const int32_t m[15] = {3, 4, 5, 0, 1, 11, 10, 9, 8, 7, 0, 0, 6, 6, 2};  // a 3 x 4 plane
  std::copy(m, m + 15, map.data<int32_t>());
  GradCase c = grad_case("PlaneGather runs, reversal, repeats", "PlaneGather", {randn({2, 3, 3, 4}, 150), map},
                         {{"lead", attr_ints({6})}});
  return {c};
}
GRAD_CASES("Gather") {
  return {grad_case("Gather axis 0 repeated and negative indices", "Gather", {randn({4, 3}, 140), ints({0, 2, 0, -1})}),
          grad_case("Gather axis 1 2-D indices", "Gather", {randn({2, 5, 3}, 141), ints({2, 2}, {4, -5, 1, 4})},
                    {{"axis", attr_i(1)}}),
          grad_case("Gather scalar index axis -1", "Gather", {randn({2, 3, 4}, 142), ints({}, {-1})}, {{"axis", attr_i(-1)}}),
          grad_case("Gather int32 indices", "Gather", {randn({3, 4}, 143), ints32({3}, {1, 1, 2})}, {{"axis", attr_i(1)}})};
}
GRAD_CASES("ScatterND") {
  // CREDIT's gen1 TracerFixer exports y[:, i] = where(y[:, i] < t, t, y[:, i]) as a ScatterND
  return {grad_case("ScatterND channel slice", "ScatterND", {randn({2, 3, 4}, 160), ints({1, 2}, {0, 1}), randn({1, 4}, 161)}),
          grad_case("ScatterND rows", "ScatterND", {randn({3, 4}, 162), ints({2, 1}, {2, -3}), randn({2, 4}, 163)}),
          grad_case("ScatterND elements", "ScatterND", {randn({2, 3}, 164), ints({2, 2}, {1, 2, 0, 0}), randn({2}, 165)})};
}

GRAD_CASES("GatherND") {
  return {grad_case("GatherND pairs", "GatherND", {randn({2, 3, 4}, 150), ints({2, 2}, {0, 1, 1, -1})}),
          grad_case("GatherND repeated rows", "GatherND", {randn({2, 3, 4}, 151), ints({3, 1}, {1, 1, 0})}),
          grad_case("GatherND batch_dims 1", "GatherND", {randn({2, 3, 4}, 152), ints({2, 2, 1}, {2, 0, 1, 1})},
                    {{"batch_dims", attr_i(1)}})};
}
GRAD_CASES("Transpose") {
  return {grad_case("Transpose (2,0,1)", "Transpose", {randn({2, 3, 4}, 160)}, {{"perm", attr_ints({2, 0, 1})}}),
          grad_case("Transpose default perm", "Transpose", {randn({2, 3, 4}, 161)}),
          grad_case("Transpose NCHW -> NHWC", "Transpose", {randn({1, 2, 3, 4}, 162)}, {{"perm", attr_ints({0, 2, 3, 1})}})};
}
GRAD_CASES("Pad") {
  Tensor x = randn({1, 2, 4, 5}, 170);
  auto m = [](const char* mode) { return std::map<std::string, Attr>{{"mode", attr_s(mode)}}; };
  return {grad_case("Pad constant with value", "Pad", {x, ints({0, 0, 1, 2, 0, 0, 2, 1}), Tensor::scalar_f32(0.7f)}, m("constant")),
          grad_case("Pad constant crop and pad", "Pad", {x, ints({0, 0, -1, 2, 0, 0, 1, -2})}),
          grad_case("Pad reflect", "Pad", {x, ints({0, 0, 2, 1, 0, 0, 1, 3})}, m("reflect")),
          grad_case("Pad reflect after crop", "Pad", {x, ints({0, 0, -1, 2, 0, 0, 1, -1})}, m("reflect")),
          grad_case("Pad edge", "Pad", {x, ints({0, 0, 3, 1, 0, 0, 1, 4})}, m("edge")),
          grad_case("Pad wrap wider than the axis", "Pad", {x, ints({0, 0, 1, 6, 0, 0, 2, 2})}, m("wrap")),
          grad_case("Pad reflect axes input (opset 18)", "Pad", {x, ints({1, 2, 2, 1}), Tensor(), ints({-1, 2})}, m("reflect")),
          grad_case("Pad wrap axes input with value", "Pad", {x, ints({2, 1}), Tensor::scalar_f32(1.f), ints({3})}, m("wrap")),
          grad_case("Pad pads attribute (opset < 11)", "Pad", {x},
                    {{"pads", attr_ints({0, 0, 1, 1, 0, 0, 1, 1})}, {"value", attr_f(0.5f)}})};
}
GRAD_CASES("DepthToSpace") {
  return {grad_case("DepthToSpace DCR", "DepthToSpace", {randn({1, 8, 2, 3}, 180)}, {{"blocksize", attr_i(2)}}),
          grad_case("DepthToSpace CRD", "DepthToSpace", {randn({1, 8, 2, 3}, 181)},
                    {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}}),
          grad_case("DepthToSpace CRD blocksize 3", "DepthToSpace", {randn({2, 18, 2, 2}, 182)},
                    {{"blocksize", attr_i(3)}, {"mode", attr_s("CRD")}})};
}
GRAD_CASES("Resize") {
  auto a = [](const char* mode, const char* coord) {
    return std::map<std::string, Attr>{{"mode", attr_s(mode)}, {"coordinate_transformation_mode", attr_s(coord)}};
  };
  Tensor x = randn({1, 2, 3, 4}, 190), big = randn({1, 2, 6, 8}, 191);
  Tensor up2 = floats({1, 1, 2, 2}), down2 = floats({1, 1, 0.5f, 0.5f});
  // inputs X, roi, scales, sizes; scales (float32) is held constant
  auto scaled = [](const std::string& label, Tensor t, Tensor s, std::map<std::string, Attr> at) {
    return fixed(grad_case(label, "Resize", {t, Tensor(), s, Tensor()}, std::move(at)), {2});
  };
  auto sized = [](const std::string& label, Tensor t, std::vector<int64_t> s, std::map<std::string, Attr> at) {
    return grad_case(label, "Resize", {t, Tensor(), Tensor(), ints(s)}, std::move(at));
  };
  auto axes_attr = a("linear", "half_pixel");
  axes_attr["axes"] = attr_ints({2, 3});
  auto excl = a("cubic", "half_pixel");
  excl["exclude_outside"] = attr_i(1);
  auto floor_nearest = a("nearest", "asymmetric");
  floor_nearest["nearest_mode"] = attr_s("floor");
  return {scaled("Resize bilinear half_pixel up x2", x, up2, a("linear", "half_pixel")),
          scaled("Resize bilinear half_pixel down x0.5", big, down2, a("linear", "half_pixel")),
          sized("Resize bilinear align_corners up to 5x7", x, {1, 2, 5, 7}, a("linear", "align_corners")),
          sized("Resize bilinear align_corners down to 4x3", big, {1, 2, 4, 3}, a("linear", "align_corners")),
          sized("Resize bilinear pytorch_half_pixel up, width 1", x, {1, 2, 7, 1}, a("linear", "pytorch_half_pixel")),
          scaled("Resize bilinear pytorch_half_pixel down x0.5", big, down2, a("linear", "pytorch_half_pixel")),
          scaled("Resize bilinear asymmetric up x2", x, up2, a("linear", "asymmetric")),
          scaled("Resize bilinear axes attribute", x, floats({2, 2}), axes_attr),
          fixed(grad_case("Resize bilinear empty roi and scales tensors", "Resize",
                          {x, Tensor(DType::F32, {0}), up2, Tensor()}, a("linear", "half_pixel")),
                {1, 2}),
          scaled("Resize nearest default modes up (2,3)", x, floats({1, 1, 2, 3}), a("nearest", "half_pixel")),
          scaled("Resize nearest asymmetric floor up x2", x, up2, floor_nearest),
          scaled("Resize nearest asymmetric floor down x0.5", big, down2, floor_nearest),
          scaled("Resize cubic half_pixel up x2", x, up2, a("cubic", "half_pixel")),
          scaled("Resize cubic exclude_outside", x, up2, excl)};
}

namespace {

const std::set<std::string> kPointwiseOps = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Where", "Sqrt", "Erf", "Relu", "Sigmoid", "Tanh",
    "Exp", "Log", "Neg", "Abs", "Reciprocal", "Sin", "Cos", "Softplus", "LeakyRelu", "Clip", "Cast", "CastLike",
    "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Expand", "Tile", "Split", "Slice",
    "Gather", "GatherND", "Transpose", "Pad", "DepthToSpace", "Resize"};

// Runs op's backward on its forward tensors; input gradients start as NaN (the contract:
// uninitialized, fully overwritten).
std::vector<Tensor> backward_of(const Node& n, const std::vector<Tensor>& x, const std::vector<const Tensor*>& gout,
                                const std::vector<bool>& want) {
  std::vector<const Tensor*> pin;
  for (auto& t : x) pin.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outs = run_node(n, pin);
  std::vector<const Tensor*> pout;
  for (auto& o : outs) pout.push_back(&o);
  std::vector<Tensor> g(x.size());
  std::vector<Tensor*> gin;
  for (size_t i = 0; i < x.size(); ++i) {
    if (want[i]) {
      g[i] = Tensor(DType::F32, x[i].shape);
      for (int64_t e = 0; e < g[i].numel(); ++e) g[i].data<float>()[e] = NAN;
    }
    gin.push_back(want[i] ? &g[i] : nullptr);
  }
  backward_kernel(n.op)(n, pin, pout, gout, gin);
  return g;
}

TEST(GradPointwise, EveryOpHasBackwardAndCase) {
  register_cpu_kernels();
  for (const std::string& op : kPointwiseOps) {
    EXPECT_TRUE(op_known(op)) << op;
    EXPECT_NE(backward_kernel(op), nullptr) << op;
    EXPECT_TRUE(grad_case_registry().count(op)) << op;
  }
}

// Every case of these ops, with input gradients prefilled with NaN: all overwritten.
TEST(GradPointwise, InputGradientsAreFullyOverwritten) {
  register_cpu_kernels();
  for (auto& [op, make] : grad_case_registry()) {
    if (!kPointwiseOps.count(op)) continue;
    for (const GradCase& c : make()) {
      std::vector<bool> want;
      for (auto& t : c.inputs) want.push_back(t.defined() && t.dtype == DType::F32);
      std::vector<const Tensor*> pin;
      for (auto& t : c.inputs) pin.push_back(t.defined() ? &t : nullptr);
      std::vector<Tensor> outs = run_node(c.node, pin);
      std::vector<Tensor> r;
      std::vector<const Tensor*> gout;
      for (size_t k = 0; k < outs.size(); ++k) r.push_back(randn(outs[k].shape, 7 + (unsigned)k));
      for (size_t k = 0; k < outs.size(); ++k) gout.push_back(outs[k].dtype == DType::F32 ? &r[k] : nullptr);
      std::vector<Tensor> g = backward_of(c.node, c.inputs, gout, want);
      for (size_t i = 0; i < g.size(); ++i)
        for (int64_t e = 0; e < (want[i] ? g[i].numel() : 0); ++e)
          ASSERT_TRUE(std::isfinite(g[i].data<float>()[e])) << c.label << ": input " << i << " element " << e;
    }
  }
}

// No output gradient at all: every input gradient is zero.
TEST(GradPointwise, AbsentOutputGradientGivesZeros) {
  Node n = make_node("Mul", 2);
  std::vector<Tensor> g = backward_of(n, {randn({2, 3}, 1), randn({3}, 2)}, {nullptr}, {true, true});
  for (auto& t : g)
    for (int64_t e = 0; e < t.numel(); ++e) EXPECT_EQ(t.data<float>()[e], 0.f);
}

// Split with the middle output unread: its slice of the input gradient is zero, the others
// are the output gradients (hand computation).
TEST(GradPointwise, SplitWithAnUnreadOutput) {
  Node n = make_node("Split", 2, 3, {{"axis", attr_i(1)}});
  Tensor x = randn({2, 6}, 3);
  Tensor g0 = randn({2, 1}, 4), g2 = randn({2, 2}, 5);
  std::vector<Tensor> g = backward_of(n, {x, ints({1, 3, 2})}, {&g0, nullptr, &g2}, {true, false});
  std::vector<float> expect = {g0.data<float>()[0], 0, 0, 0, g2.data<float>()[0], g2.data<float>()[1],
                               g0.data<float>()[1], 0, 0, 0, g2.data<float>()[2], g2.data<float>()[3]};
  expect_close(g[0], Tensor::from_f32({2, 6}, expect), 0, 0);
}

// Gather with repeated indices adds up every gathered copy (hand computation).
TEST(GradPointwise, GatherRepeatedIndicesAdd) {
  Node n = make_node("Gather", 2);
  Tensor gout = Tensor::from_f32({4, 2}, {1, 2, 10, 20, 100, 200, 1000, 2000});
  std::vector<Tensor> g = backward_of(n, {randn({3, 2}, 6), ints({2, 0, 2, -1})}, {&gout}, {true, false});
  expect_close(g[0], Tensor::from_f32({3, 2}, {10, 20, 0, 0, 1101, 2202}), 0, 0);
}

// Pad constant: the constant value's gradient is the sum over the padded positions.
TEST(GradPointwise, PadConstantValueGetsBorderSum) {
  Node n = make_node("Pad", 3);
  Tensor gout = Tensor::from_f32({1, 5}, {1, 2, 3, 4, 5});
  std::vector<Tensor> g = backward_of(n, {randn({1, 2}, 7), ints({0, 2, 0, 1}), Tensor::scalar_f32(9)}, {&gout},
                                      {true, false, true});
  expect_close(g[0], Tensor::from_f32({1, 2}, {3, 4}), 0, 0);
  EXPECT_EQ(g[2].data<float>()[0], 1 + 2 + 5);
}

}  // namespace
}  // namespace wxe::test
