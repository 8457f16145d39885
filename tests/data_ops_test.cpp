// Reference kernels of the data-movement ops against hand-computed ONNX semantics.
#include <cstdint>
#include <cstring>
#include <map>
#include <limits>

#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_f32(std::move(s), v); }
Tensor i64(std::vector<int64_t> v) { return Tensor::from_i64(v); }
Tensor i64s(Shape s, std::vector<int64_t> v) { return Tensor::from_i64(v).reshaped(std::move(s)); }
Tensor i32(Shape s, std::vector<int32_t> v) {
  Tensor t(DType::I32, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}
Tensor iota(Shape s) {
  Tensor t(DType::F32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (float)i;
  return t;
}
Tensor run1(const Node& n, const std::vector<const Tensor*>& in) { return run_node(n, in)[0]; }

// ------------------------------------------------------------------ Slice

TEST(DataOpsSlice, ReverseLastAxisLikeExporter) {
  // starts -1, ends -INT64_MAX, axes -1, steps -1: full reversal of a row
  Tensor x = f32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor s = i64({-1}), e = i64({-kMax}), a = i64({-1}), st = i64({-1});
  Tensor y = run1(make_node("Slice", 5), {&x, &s, &e, &a, &st});
  expect_close(y, f32({2, 4}, {4, 3, 2, 1, 8, 7, 6, 5}));
}

TEST(DataOpsSlice, ReverseInt64PadsTensorAxis0) {
  // the exporter's F.pad pattern: a (4,2) int64 pads tensor reversed along axis 0
  Tensor x = i64s({4, 2}, {1, 1, 2, 2, 0, 0, 3, 4});
  Tensor s = i64({-1}), e = i64({-kMax}), a = i64({0}), st = i64({-1});
  Tensor y = run1(make_node("Slice", 5), {&x, &s, &e, &a, &st});
  ASSERT_EQ(y.dtype, DType::I64);
  ASSERT_EQ(shape_str(y.shape), "(4, 2)");
  std::vector<int64_t> want{3, 4, 0, 0, 2, 2, 1, 1};
  EXPECT_EQ(y.to_i64(), want);
}

TEST(DataOpsSlice, NegativeStepWithClamping) {
  Tensor x = iota({10});
  Tensor s = i64({100}), e = i64({-100}), a = i64({0}), st = i64({-2});
  expect_close(run1(make_node("Slice", 5), {&x, &s, &e, &a, &st}), f32({5}, {9, 7, 5, 3, 1}));
  // end is exclusive: 8, 5, 2 (stop before 1)
  Tensor s2 = i64({8}), e2 = i64({1}), st2 = i64({-3});
  expect_close(run1(make_node("Slice", 5), {&x, &s2, &e2, &a, &st2}), f32({3}, {8, 5, 2}));
  // INT64_MIN end with negative step: down to index 0 inclusive
  Tensor s3 = i64({3}), e3 = i64({kMin}), st3 = i64({-1});
  expect_close(run1(make_node("Slice", 5), {&x, &s3, &e3, &a, &st3}), f32({4}, {3, 2, 1, 0}));
  // start below the range with a negative step: the spec clamps it to 0 (numpy would
  // give an empty slice; onnxruntime follows the spec)
  Tensor s4 = i64({-20}), e4 = i64({kMin});
  expect_close(run1(make_node("Slice", 5), {&x, &s4, &e4, &a, &st3}), f32({1}, {0}));
  // end above the start with a negative step: empty
  Tensor s5 = i64({2}), e5 = i64({5});
  EXPECT_EQ(run1(make_node("Slice", 5), {&x, &s5, &e5, &a, &st3}).numel(), 0);
}

TEST(DataOpsSlice, Int64MaxEndAndNegativeStartsLikeUnpadding) {
  Tensor x = iota({2, 5});
  Tensor s = i64({-2}), e = i64({kMax}), a = i64({1});
  expect_close(run1(make_node("Slice", 4), {&x, &s, &e, &a}), f32({2, 2}, {3, 4, 8, 9}));
  // starts 1, ends -1 on axis 1 (the [16:-16] unpadding pattern), explicit step 1
  Tensor s2 = i64({1}), e2 = i64({-1}), st = i64({1});
  expect_close(run1(make_node("Slice", 5), {&x, &s2, &e2, &a, &st}),
               f32({2, 3}, {1, 2, 3, 6, 7, 8}));
}

TEST(DataOpsSlice, MultiAxisDefaultAxesAndStridedInt32) {
  Tensor x = i32({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor s = i64({0, 1}), e = i64({2, 4});
  Tensor y = run1(make_node("Slice", 3), {&x, &s, &e});  // axes, steps omitted
  ASSERT_EQ(y.dtype, DType::I32);
  expect_close(y, f32({2, 3}, {1, 2, 3, 5, 6, 7}));
  Tensor a = i64({1, 0}), st = i64({2, 1});  // axes out of order
  Tensor s2 = i64({1, 0}), e2 = i64({4, 2});
  expect_close(run1(make_node("Slice", 5), {&x, &s2, &e2, &a, &st}), f32({2, 2}, {1, 3, 5, 7}));
}

TEST(DataOpsSlice, RejectsBadInput) {
  Tensor x = iota({2, 3});
  Tensor s = i64({0}), e = i64({2}), a0 = i64({0}), zero = i64({0});
  EXPECT_THROW(run_node(make_node("Slice", 5), {&x, &s, &e, &a0, &zero}), Error);  // step 0
  Tensor a5 = i64({5});
  EXPECT_THROW(run_node(make_node("Slice", 4), {&x, &s, &e, &a5}), Error);  // axis range
  Tensor s2 = i64({0, 0}), e2 = i64({1, 1}), aa = i64({1, -1});
  EXPECT_THROW(run_node(make_node("Slice", 4), {&x, &s2, &e2, &aa}), Error);  // repeated axis
  EXPECT_THROW(run_node(make_node("Slice", 3), {&x, &s2, &e}), Error);  // length mismatch
}

// ------------------------------------------------------------------ Gather

TEST(DataOpsGather, NegativeIndicesAxis0) {
  Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor idx = i64({-1, 0, -2});
  expect_close(run1(make_node("Gather", 2), {&x, &idx}), f32({3, 2}, {5, 6, 1, 2, 3, 4}));
}

TEST(DataOpsGather, ScalarInt32IndexReducesRank) {
  Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor idx = i32({}, {1});
  Tensor y = run1(make_node("Gather", 2, 1, {{"axis", attr_i(1)}}), {&x, &idx});
  expect_close(y, f32({3}, {2, 4, 6}));
  Tensor idx0 = i64s({}, {-1});  // scalar on axis 0 of a shape vector (Shape -> Gather)
  Tensor shp = i64({1, 7, 64, 96});
  Tensor y0 = run1(make_node("Gather", 2), {&shp, &idx0});
  EXPECT_EQ(shape_str(y0.shape), "()");
  EXPECT_EQ(y0.to_i64()[0], 96);
}

TEST(DataOpsGather, TwoDimensionalIndicesLikeRelativePositionTable) {
  Tensor table = f32({3, 2}, {10, 11, 20, 21, 30, 31});
  Tensor idx = i64s({2, 2}, {0, 2, 1, 1});
  expect_close(run1(make_node("Gather", 2), {&table, &idx}),
               f32({2, 2, 2}, {10, 11, 30, 31, 20, 21, 20, 21}));
  Tensor one = i64s({1, 1}, {0});
  EXPECT_EQ(shape_str(run1(make_node("Gather", 2), {&table, &one}).shape), "(1, 1, 2)");
}

TEST(DataOpsGather, RejectsOutOfRange) {
  Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor bad = i64({3}), bad2 = i64({-4});
  EXPECT_THROW(run_node(make_node("Gather", 2), {&x, &bad}), Error);
  EXPECT_THROW(run_node(make_node("Gather", 2), {&x, &bad2}), Error);
  Tensor ok = i64({0});
  EXPECT_THROW(run_node(make_node("Gather", 2, 1, {{"axis", attr_i(2)}}), {&x, &ok}), Error);
  Tensor fidx = f32({1}, {0});
  EXPECT_THROW(run_node(make_node("Gather", 2), {&x, &fidx}), Error);
}

// ------------------------------------------------------------------ GatherND

TEST(DataOpsGatherND, RelativePositionLookupLikeDynamo) {
  // dynamo export: a flattened bias table (25) indexed by a (4, 4, 1) int64 table
  Tensor table = iota({5});
  Tensor idx = i64s({2, 2, 1}, {4, 3, -1, 0});
  expect_close(run1(make_node("GatherND", 2), {&table, &idx}), f32({2, 2}, {4, 3, 4, 0}));
}

TEST(DataOpsGatherND, TuplesAndSlicesAndBatchDims) {
  Tensor x = iota({2, 2, 3});
  Tensor pairs = i64s({2, 2}, {0, 1, 1, 0});  // x[0, 1, :], x[1, 0, :]
  expect_close(run1(make_node("GatherND", 2), {&x, &pairs}), f32({2, 3}, {3, 4, 5, 6, 7, 8}));
  Tensor full = i64s({1, 3}, {1, 1, 2});  // x[1, 1, 2]
  expect_close(run1(make_node("GatherND", 2), {&x, &full}), f32({1}, {11}));
  // batch_dims 1: batch 0 takes row 1, batch 1 takes row 0
  Tensor rows = i64s({2, 1}, {1, 0});
  expect_close(run1(make_node("GatherND", 2, 1, {{"batch_dims", attr_i(1)}}), {&x, &rows}),
               f32({2, 3}, {3, 4, 5, 6, 7, 8}));
  Tensor bad = i64s({1, 1}, {2});
  EXPECT_THROW(run_node(make_node("GatherND", 2), {&x, &bad}), Error);
  Tensor too_long = i64s({1, 4}, {0, 0, 0, 0});
  EXPECT_THROW(run_node(make_node("GatherND", 2), {&x, &too_long}), Error);
}

// ScatterND: data with the named slices replaced (rows, single elements, negative indices); a
// mis-shaped updates tensor or a reduction other than none is an error.
TEST(DataOpsScatterND, ReplacesTheNamedSlices) {
  Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor rows = i64s({2, 1}, {2, -3}), up = f32({2, 2}, {10, 11, 12, 13});
  expect_close(run1(make_node("ScatterND", 3), {&x, &rows, &up}), f32({3, 2}, {12, 13, 3, 4, 10, 11}));
  Tensor elems = i64s({2, 2}, {1, 0, 0, 1}), vals = f32({2}, {-1, -2});
  expect_close(run1(make_node("ScatterND", 3), {&x, &elems, &vals}), f32({3, 2}, {1, -2, -1, 4, 5, 6}));
  Tensor bad = f32({2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_THROW(run_node(make_node("ScatterND", 3), {&x, &rows, &bad}), Error);
  EXPECT_THROW(run_node(make_node("ScatterND", 3, 1, {{"reduction", attr_s("add")}}), {&x, &rows, &up}), Error);
  Tensor far = i64s({1, 1}, {3});
  Tensor one = f32({1, 2}, {0, 0});
  EXPECT_THROW(run_node(make_node("ScatterND", 3), {&x, &far, &one}), Error);
}

// ------------------------------------------------------------------ Transpose

TEST(DataOpsTranspose, DefaultReversesAxes) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_close(run1(make_node("Transpose", 1), {&x}), f32({3, 2}, {1, 4, 2, 5, 3, 6}));
}

TEST(DataOpsTranspose, SixDimWindowPermMatchesLoops) {
  // perm of the windowed attention: [0, 3, 5, 1, 2, 4]
  Shape s{2, 3, 2, 4, 3, 2};
  Tensor x = randn(s, 7);
  std::vector<int64_t> perm{0, 3, 5, 1, 2, 4};
  Tensor y = run1(make_node("Transpose", 1, 1, {{"perm", attr_ints(perm)}}), {&x});
  ASSERT_EQ(shape_str(y.shape), "(2, 4, 2, 3, 2, 3)");
  auto xs = strides_of(s), ys = strides_of(y.shape);
  int64_t i[6];
  for (i[0] = 0; i[0] < s[0]; ++i[0])
    for (i[1] = 0; i[1] < s[1]; ++i[1])
      for (i[2] = 0; i[2] < s[2]; ++i[2])
        for (i[3] = 0; i[3] < s[3]; ++i[3])
          for (i[4] = 0; i[4] < s[4]; ++i[4])
            for (i[5] = 0; i[5] < s[5]; ++i[5]) {
              int64_t xo = 0, yo = 0;
              for (int d = 0; d < 6; ++d) {
                xo += i[d] * xs[d];
                yo += i[perm[d]] * ys[d];
              }
              ASSERT_EQ(y.data<float>()[yo], x.data<float>()[xo]);
            }
}

TEST(DataOpsTranspose, LargerThanOneTaskMatchesLoops) {
  // enough rows for several parallel tasks and merged dims
  Shape s{3, 50, 70, 4};
  Tensor x = iota(s);
  Tensor y = run1(make_node("Transpose", 1, 1, {{"perm", attr_ints({2, 0, 3, 1})}}), {&x});
  ASSERT_EQ(shape_str(y.shape), "(70, 3, 4, 50)");
  for (int64_t c = 0; c < 70; ++c)
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t d = 0; d < 4; ++d)
        for (int64_t b = 0; b < 50; ++b)
          ASSERT_EQ(y.data<float>()[((c * 3 + a) * 4 + d) * 50 + b],
                    x.data<float>()[((a * 50 + b) * 70 + c) * 4 + d]);
  // (1536, 96, 4, 4) -> channels 32..63 (the fused qkv split): merged into long rows
  Tensor q = iota({6, 9, 4, 4});
  Tensor st = i64({3}), en = i64({6}), ax = i64({1});
  Tensor k = run1(make_node("Slice", 4), {&q, &st, &en, &ax});
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t i = 0; i < 48; ++i)
      ASSERT_EQ(k.data<float>()[n * 48 + i], q.data<float>()[n * 144 + 48 + i]);
}

TEST(DataOpsTranspose, RejectsBadPerm) {
  Tensor x = iota({2, 3});
  EXPECT_THROW(run_node(make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 0})}}), {&x}), Error);
  EXPECT_THROW(run_node(make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 1, 2})}}), {&x}),
               Error);
}

// ------------------------------------------------------------------ Pad

Node pad_node(const std::string& mode, int nin = 3) {
  return make_node("Pad", nin, 1, {{"mode", attr_s(mode)}});
}

TEST(DataOpsPad, ConstantWithValue) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({0, 2, 0, 1});
  Tensor v = Tensor::scalar_f32(9);
  expect_close(run1(pad_node("constant"), {&x, &pads, &v}),
               f32({2, 6}, {9, 9, 1, 2, 3, 9, 9, 9, 4, 5, 6, 9}));
}

TEST(DataOpsPad, ConstantLikeExporterFPad) {
  // torch F.pad(x, (1, 1, 1, 1)) exported: pads [0, 0, 1, 1, 0, 0, 1, 1], value 0
  Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor pads = i64({0, 0, 1, 1, 0, 0, 1, 1});
  Tensor v = Tensor::scalar_f32(0);
  expect_close(run1(pad_node("constant"), {&x, &pads, &v}),
               f32({1, 1, 4, 4}, {0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0}));
}

TEST(DataOpsPad, Reflect) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({1, 2, 1, 1});
  expect_close(run1(pad_node("reflect", 2), {&x, &pads}),
               f32({4, 6}, {6, 5, 4, 5, 6, 5,  //
                            3, 2, 1, 2, 3, 2,  //
                            6, 5, 4, 5, 6, 5,  //
                            3, 2, 1, 2, 3, 2}));
  // wider than the axis: keeps reflecting (numpy semantics)
  Tensor r = f32({3}, {1, 2, 3});
  Tensor wide = i64({5, 4});
  expect_close(run1(pad_node("reflect", 2), {&r, &wide}),
               f32({12}, {2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3}));
}

TEST(DataOpsPad, Edge) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({0, 2, 1, 1});
  expect_close(run1(pad_node("edge", 2), {&x, &pads}),
               f32({3, 6}, {1, 1, 1, 2, 3, 3, 4, 4, 4, 5, 6, 6, 4, 4, 4, 5, 6, 6}));
}

TEST(DataOpsPad, Wrap) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({1, 2, 0, 1});
  expect_close(run1(pad_node("wrap", 2), {&x, &pads}),
               f32({3, 6}, {5, 6, 4, 5, 6, 4, 2, 3, 1, 2, 3, 1, 5, 6, 4, 5, 6, 4}));
}

TEST(DataOpsPad, WrapLongitudeLikeDynamo5D) {
  // dynamo export of the circular longitude pad: (1,7,1,64,64) -> (1,7,1,64,96) with pads
  // [0,0,0,0,16, 0,0,0,0,16]; here W 4 -> 8 with 2 on each side
  Tensor x = f32({1, 1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor pads = i64({0, 0, 0, 0, 2, 0, 0, 0, 0, 2});
  expect_close(run1(pad_node("wrap", 2), {&x, &pads}),
               f32({1, 1, 1, 2, 8}, {3, 4, 1, 2, 3, 4, 1, 2, 7, 8, 5, 6, 7, 8, 5, 6}));
}

TEST(DataOpsPad, NegativePadsCropThenPad) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({0, -1, 0, 2});
  expect_close(run1(pad_node("constant", 2), {&x, &pads}),
               f32({2, 4}, {2, 3, 0, 0, 5, 6, 0, 0}));
  Tensor pads2 = i64({0, -1, 0, 1});  // reflect about the cropped tensor [2, 3]
  expect_close(run1(pad_node("reflect", 2), {&x, &pads2}), f32({2, 3}, {2, 3, 2, 5, 6, 5}));
  Tensor crop = i64({-1, 0, 0, -1});
  expect_close(run1(pad_node("edge", 2), {&x, &crop}), f32({1, 2}, {4, 5}));
}

TEST(DataOpsPad, AxesInputAndInt64Data) {
  Tensor x = i64s({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = i64({1, 1});
  Tensor axes = i64({-1});
  Tensor y = run1(make_node("Pad", 4, 1, {{"mode", attr_s("constant")}}),
                  {&x, &pads, nullptr, &axes});
  ASSERT_EQ(y.dtype, DType::I64);
  std::vector<int64_t> want{0, 1, 2, 3, 0, 0, 4, 5, 6, 0};
  EXPECT_EQ(y.to_i64(), want);
  EXPECT_EQ(shape_str(y.shape), "(2, 5)");
}

TEST(DataOpsPad, RejectsBadInput) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor three = i64({1, 1, 1});
  EXPECT_THROW(run_node(pad_node("constant", 2), {&x, &three}), Error);  // pads length
  Tensor pads = i64({0, 1, 0, 1});
  EXPECT_THROW(run_node(pad_node("mirror", 2), {&x, &pads}), Error);  // unknown mode
  Tensor neg = i64({0, -2, 0, -2});
  EXPECT_THROW(run_node(pad_node("constant", 2), {&x, &neg}), Error);  // negative size
  Tensor all = i64({0, -3, 0, 1});
  EXPECT_THROW(run_node(pad_node("reflect", 2), {&x, &all}), Error);  // nothing to reflect
}

// ------------------------------------------------------------------ DepthToSpace

TEST(DataOpsDepthToSpace, DcrAndCrdWrittenOut) {
  Tensor x = iota({1, 8, 1, 2});  // x[c][0][w] = 2c + w
  Tensor dcr = run1(make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}}), {&x});
  expect_close(dcr, f32({1, 2, 2, 4}, {0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15}));
  Tensor crd = run1(make_node("DepthToSpace", 1, 1,
                              {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}}),
                    {&x});
  expect_close(crd, f32({1, 2, 2, 4}, {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15}));
}

TEST(DataOpsDepthToSpace, CrdIsPixelShuffle) {
  // torch.pixel_shuffle: out[n, c, h*r+i, w*r+j] = in[n, c*r*r + i*r + j, h, w]
  const int64_t r = 2, N = 2, C = 3, H = 2, W = 3;
  Tensor x = randn({N, C * r * r, H, W}, 3);
  Tensor y = run1(make_node("DepthToSpace", 1, 1,
                            {{"blocksize", attr_i(r)}, {"mode", attr_s("CRD")}}),
                  {&x});
  ASSERT_EQ(shape_str(y.shape), "(2, 3, 4, 6)");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H * r; ++h)
        for (int64_t w = 0; w < W * r; ++w) {
          int64_t ic = c * r * r + (h % r) * r + (w % r);
          float want = x.data<float>()[((n * C * r * r + ic) * H + h / r) * W + w / r];
          ASSERT_EQ(y.data<float>()[((n * C + c) * H * r + h) * W * r + w], want);
        }
}

TEST(DataOpsDepthToSpace, RejectsBadInput) {
  Tensor x = iota({1, 6, 1, 2});
  EXPECT_THROW(run_node(make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}}), {&x}), Error);
  Tensor y = iota({1, 8, 1, 2});
  EXPECT_THROW(run_node(make_node("DepthToSpace", 1, 1,
                                  {{"blocksize", attr_i(2)}, {"mode", attr_s("XYZ")}}),
                        {&y}),
               Error);
  Tensor z = iota({8, 1, 2});
  EXPECT_THROW(run_node(make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}}), {&z}), Error);
}

// ------------------------------------------------------------------ Resize

Node resize_node(const std::string& mode, const std::string& coord,
                 std::map<std::string, Attr> extra = {}) {
  extra["mode"] = attr_s(mode);
  extra["coordinate_transformation_mode"] = attr_s(coord);
  return make_node("Resize", 4, 1, std::move(extra));
}

// What the CREDIT export writes for F.interpolate(mode="bilinear", align_corners=False).
Node credit_resize() {
  return resize_node("linear", "half_pixel",
                     {{"cubic_coeff_a", attr_f(-0.75f)}, {"nearest_mode", attr_s("floor")}});
}

const Tensor kImg = f32({1, 1, 2, 2}, {1, 2, 3, 4});
const Tensor kUp2 = f32({1, 1, 4, 4}, {1.0, 1.25, 1.75, 2.0,  //
                                       1.5, 1.75, 2.25, 2.5,  //
                                       2.5, 2.75, 3.25, 3.5,  //
                                       3.0, 3.25, 3.75, 4.0});

// The fast kernel (only the last two axes resized: a row blend, then each column's taps, in
// float32) against the reference on CREDIT's cases and the ones it hands back to the reference
// (channels resized too, int64 nearest).
TEST(DataOpsResize, FastKernelMatchesReference) {
  struct Case {
    const char* what;
    Shape x, sizes;
    std::map<std::string, Attr> a;
    DType t;
  };
  const std::map<std::string, Attr> credit = {{"mode", attr_s("linear")}, {"coordinate_transformation_mode", attr_s("half_pixel")}};
  const std::vector<Case> cases = {
      {"CREDIT's bilinear 2x up", {1, 5, 16, 40}, {1, 5, 32, 80}, credit, DType::F32},
      {"CREDIT's bilinear back to the grid", {2, 3, 64, 96}, {2, 3, 45, 90}, credit, DType::F32},
      {"cubic, align_corners", {1, 2, 9, 7}, {1, 2, 13, 11},
       {{"mode", attr_s("cubic")}, {"coordinate_transformation_mode", attr_s("align_corners")}}, DType::F32},
      {"nearest 3-D", {4, 6, 8}, {4, 12, 5}, {{"mode", attr_s("nearest")}}, DType::F32},
      {"linear over the channels too", {1, 5, 4, 6}, {1, 3, 8, 6}, credit, DType::F32},
      {"nearest int64", {1, 2, 3, 4}, {1, 2, 6, 8}, {{"mode", attr_s("nearest")}}, DType::I64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Tensor x = c.t == DType::F32 ? randn(c.x, 120) : Tensor::from_i64(std::vector<int64_t>(numel(c.x), 7)).reshaped(c.x);
    Tensor sizes = Tensor::from_i64(c.sizes);
    Node n = make_node("Resize", 4, 1, c.a);
    Tensor ref = run_node(n, {&x, nullptr, nullptr, &sizes})[0];
    Tensor fast = run_node(n, {&x, nullptr, nullptr, &sizes}, KernelKind::Fast)[0];
    ASSERT_EQ(fast.shape, ref.shape);
    if (c.t == DType::F32) {
      EXPECT_LT(max_abs_diff(fast, ref), 1e-5);
    } else {
      EXPECT_EQ(std::memcmp(fast.raw(), ref.raw(), ref.nbytes()), 0);
    }
  }
}

TEST(DataOpsResize, LinearHalfPixel2xWithScales) {
  Tensor scales = f32({4}, {1, 1, 2, 2});
  expect_close(run1(credit_resize(), {&kImg, nullptr, &scales, nullptr}), kUp2);
  Tensor empty_roi = f32({0}, {});  // an empty roi is the same as none
  expect_close(run1(credit_resize(), {&kImg, &empty_roi, &scales, nullptr}), kUp2);
}

TEST(DataOpsResize, LinearHalfPixel2xWithSizesLikeCredit) {
  Tensor sizes = i64({1, 1, 4, 4});
  expect_close(run1(credit_resize(), {&kImg, nullptr, nullptr, &sizes}), kUp2);
  Tensor empty_scales = f32({0}, {});
  expect_close(run1(credit_resize(), {&kImg, nullptr, &empty_scales, &sizes}), kUp2);
}

TEST(DataOpsResize, LinearBatchAndChannelsAreIndependent) {
  // N=2, C=2 copies of the image scaled by (n+1)*(c+1): output scales the same way
  Tensor x(DType::F32, {2, 2, 2, 2});
  Tensor want(DType::F32, {2, 2, 4, 4});
  for (int64_t nc = 0; nc < 4; ++nc) {
    float k = (float)((nc / 2 + 1) * (nc % 2 + 1));
    for (int i = 0; i < 4; ++i) x.data<float>()[nc * 4 + i] = k * kImg.data<float>()[i];
    for (int i = 0; i < 16; ++i) want.data<float>()[nc * 16 + i] = k * kUp2.data<float>()[i];
  }
  Tensor sizes = i64({2, 2, 4, 4});
  expect_close(run1(credit_resize(), {&x, nullptr, nullptr, &sizes}), want);
  // sizes equal to the input shape: identity
  Tensor same = i64({2, 2, 2, 2});
  expect_close(run1(credit_resize(), {&x, nullptr, nullptr, &same}), x);
}

TEST(DataOpsResize, LinearNonIntegerSizes) {
  // (2,3) -> (3,5): H scale 1.5 (source rows -1/6, 0.5, 7/6), W scale 5/3
  // (source cols -0.2, 0.4, 1.0, 1.6, 2.2)
  Tensor x = f32({1, 1, 2, 3}, {1, 2, 4, 3, 6, 8});
  Tensor sizes = i64({1, 1, 3, 5});
  expect_close(run1(credit_resize(), {&x, nullptr, nullptr, &sizes}),
               f32({1, 1, 3, 5}, {1, 1.4f, 2, 3.2f, 4,  //
                                  2, 2.8f, 4, 5.2f, 6,  //
                                  3, 4.2f, 6, 7.2f, 8}));
}

TEST(DataOpsResize, NonIntegerScaleUsesGivenScaleNotSizeRatio) {
  Tensor x = f32({1, 1, 1, 3}, {0, 6, 12});
  // scales 1.5: output floor(4.5) = 4 columns at (o + 0.5) / 1.5 - 0.5 = -1/6, 0.5, 7/6, 11/6
  Tensor scales = f32({4}, {1, 1, 1, 1.5f});
  expect_close(run1(credit_resize(), {&x, nullptr, &scales, nullptr}),
               f32({1, 1, 1, 4}, {0, 3, 7, 11}));
  // sizes 4: scale 4/3, source columns -0.125, 0.625, 1.375, 2.125
  Tensor sizes = i64({1, 1, 1, 4});
  expect_close(run1(credit_resize(), {&x, nullptr, nullptr, &sizes}),
               f32({1, 1, 1, 4}, {0, 3.75f, 8.25f, 12}));
  // 2x2 with scale 1.5 -> 3x3
  Tensor s2 = f32({4}, {1, 1, 1.5f, 1.5f});
  expect_close(run1(credit_resize(), {&kImg, nullptr, &s2, nullptr}),
               f32({1, 1, 3, 3}, {1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
}

TEST(DataOpsResize, PytorchHalfPixelDiffersOnlyForLengthOne) {
  Tensor x = f32({1, 1, 1, 4}, {1, 2, 3, 4});
  Tensor one = i64({1, 1, 1, 1});
  expect_close(run1(resize_node("linear", "pytorch_half_pixel"), {&x, nullptr, nullptr, &one}),
               f32({1, 1, 1, 1}, {1}));
  // half_pixel: (0 + 0.5) / 0.25 - 0.5 = 1.5
  expect_close(run1(resize_node("linear", "half_pixel"), {&x, nullptr, nullptr, &one}),
               f32({1, 1, 1, 1}, {2.5f}));
  Tensor scales = f32({4}, {1, 1, 2, 2});
  expect_close(run1(resize_node("linear", "pytorch_half_pixel"), {&kImg, nullptr, &scales, nullptr}),
               kUp2);
}

TEST(DataOpsResize, AlignCornersAndAsymmetric) {
  Tensor sizes = i64({1, 1, 4, 4});
  // source coordinates 0, 1/3, 2/3, 1
  expect_close(run1(resize_node("linear", "align_corners"), {&kImg, nullptr, nullptr, &sizes}),
               f32({1, 1, 4, 4}, {1, 4.f / 3, 5.f / 3, 2,            //
                                  5.f / 3, 2, 7.f / 3, 8.f / 3,      //
                                  7.f / 3, 8.f / 3, 3, 10.f / 3,     //
                                  3, 10.f / 3, 11.f / 3, 4}));
  // source coordinates 0, 0.5, 1, 1.5 (clamped to 1)
  Tensor x = f32({1, 1, 1, 2}, {1, 2});
  Tensor s4 = i64({1, 1, 1, 4});
  expect_close(run1(resize_node("linear", "asymmetric"), {&x, nullptr, nullptr, &s4}),
               f32({1, 1, 1, 4}, {1, 1.5f, 2, 2}));
}

TEST(DataOpsResize, NearestModes) {
  auto run = [](const Tensor& x, const Tensor& scales, const std::string& nm,
                const std::string& coord = "asymmetric") {
    return run1(resize_node("nearest", coord, {{"nearest_mode", attr_s(nm)}}),
                {&x, nullptr, &scales, nullptr});
  };
  // ties: asymmetric 2x of 3 -> source 0, 0.5, 1, 1.5, 2, 2.5
  Tensor x = f32({1, 3}, {10, 20, 30});
  Tensor up = f32({2}, {1, 2});
  expect_close(run(x, up, "round_prefer_floor"), f32({1, 6}, {10, 10, 20, 20, 30, 30}));
  expect_close(run(x, up, "round_prefer_ceil"), f32({1, 6}, {10, 20, 20, 30, 30, 30}));
  expect_close(run(x, up, "floor"), f32({1, 6}, {10, 10, 20, 20, 30, 30}));
  expect_close(run(x, up, "ceil"), f32({1, 6}, {10, 20, 20, 30, 30, 30}));
  // non-ties: asymmetric 0.6 of 5 -> source 0, 1.667, 3.333
  Tensor y = f32({1, 5}, {0, 1, 2, 3, 4});
  Tensor down = f32({2}, {1, 0.6f});
  expect_close(run(y, down, "floor"), f32({1, 3}, {0, 1, 3}));
  expect_close(run(y, down, "round_prefer_floor"), f32({1, 3}, {0, 2, 3}));
  expect_close(run(y, down, "round_prefer_ceil"), f32({1, 3}, {0, 2, 3}));
  expect_close(run(y, down, "ceil"), f32({1, 3}, {0, 2, 4}));
  // default nearest (round_prefer_floor, half_pixel): 2x of [1, 2] -> -0.25, 0.25, 0.75, 1.25
  Tensor z = f32({1, 2}, {1, 2});
  expect_close(run1(make_node("Resize", 3), {&z, nullptr, &up}), f32({1, 4}, {1, 1, 2, 2}));
  // nearest is dtype-generic
  Tensor zi = i64s({1, 2}, {7, 9});
  Tensor yi = run1(make_node("Resize", 3), {&zi, nullptr, &up});
  EXPECT_EQ(yi.dtype, DType::I64);
  std::vector<int64_t> want{7, 7, 9, 9};
  EXPECT_EQ(yi.to_i64(), want);
}

TEST(DataOpsResize, Cubic) {
  // 4 -> 8 half_pixel, A = -0.75. Output 3 reads x at 1.25: taps 0..3 with weights
  // (-0.10546875, 0.87890625, 0.26171875, -0.03515625). Output 0 reads -0.25: taps -2..1
  // clamped, weights (-0.03515625, 0.26171875, 0.87890625, -0.10546875).
  Tensor x = f32({1, 4}, {1, 2, 4, 8});
  Tensor sizes = i64({1, 8});
  Tensor y = run1(resize_node("cubic", "half_pixel"), {&x, nullptr, nullptr, &sizes});
  EXPECT_NEAR(y.data<float>()[3], 2.41796875, 1e-5);
  EXPECT_NEAR(y.data<float>()[0], 0.89453125, 1e-5);
  Tensor ye = run1(resize_node("cubic", "half_pixel", {{"exclude_outside", attr_i(1)}}),
                   {&x, nullptr, nullptr, &sizes});
  EXPECT_NEAR(ye.data<float>()[3], 2.41796875, 1e-5);
  EXPECT_NEAR(ye.data<float>()[0], (0.87890625 - 2 * 0.10546875) / (0.87890625 - 0.10546875),
              1e-5);
}

TEST(DataOpsResize, AxesAttributeLimitsScales) {
  Tensor sizes = i64({4, 4});
  Node n = credit_resize();
  n.attrs["axes"] = attr_ints({-2, -1});
  expect_close(run1(n, {&kImg, nullptr, nullptr, &sizes}), kUp2);
}

TEST(DataOpsResize, RejectsUnsupported) {
  Tensor sizes = i64({1, 1, 4, 4});
  Tensor scales = f32({4}, {1, 1, 2, 2});
  EXPECT_THROW(run_node(resize_node("linear", "half_pixel", {{"antialias", attr_i(1)}}),
                        {&kImg, nullptr, nullptr, &sizes}),
               Error);
  EXPECT_THROW(run_node(resize_node("area", "half_pixel"), {&kImg, nullptr, nullptr, &sizes}),
               Error);
  EXPECT_THROW(run_node(resize_node("linear", "tf_crop_and_resize"),
                        {&kImg, nullptr, nullptr, &sizes}),
               Error);
  EXPECT_THROW(run_node(credit_resize(), {&kImg, nullptr, &scales, &sizes}), Error);  // both
  EXPECT_THROW(run_node(credit_resize(), {&kImg, nullptr, nullptr, nullptr}), Error);  // none
  Tensor short_scales = f32({2}, {2, 2});
  EXPECT_THROW(run_node(credit_resize(), {&kImg, nullptr, &short_scales, nullptr}), Error);
  Tensor xi = i64s({1, 1, 2, 2}, {1, 2, 3, 4});
  EXPECT_THROW(run_node(credit_resize(), {&xi, nullptr, nullptr, &sizes}), Error);  // not f32
}

// ------------------------------------------------------------------ Split, Tile, Flatten

TEST(DataOpsSplit, SplitInputAttrAndEqual) {
  Tensor x = iota({2, 6});
  Tensor split = i64({1, 2, 3});
  auto y = run_node(make_node("Split", 2, 3, {{"axis", attr_i(-1)}}), {&x, &split});
  ASSERT_EQ(y.size(), 3u);
  expect_close(y[0], f32({2, 1}, {0, 6}));
  expect_close(y[1], f32({2, 2}, {1, 2, 7, 8}));
  expect_close(y[2], f32({2, 3}, {3, 4, 5, 9, 10, 11}));
  auto z = run_node(make_node("Split", 1, 2, {{"axis", attr_i(1)}, {"split", attr_ints({4, 2})}}),
                    {&x});
  expect_close(z[0], f32({2, 4}, {0, 1, 2, 3, 6, 7, 8, 9}));
  expect_close(z[1], f32({2, 2}, {4, 5, 10, 11}));
  auto e = run_node(make_node("Split", 1, 2), {&x});  // axis 0, equal halves
  expect_close(e[0], f32({1, 6}, {0, 1, 2, 3, 4, 5}));
  expect_close(e[1], f32({1, 6}, {6, 7, 8, 9, 10, 11}));
}

TEST(DataOpsSplit, NumOutputsLastChunkSmaller) {
  Tensor x = iota({7});
  auto y = run_node(make_node("Split", 1, 3, {{"num_outputs", attr_i(3)}}), {&x});
  expect_close(y[0], f32({3}, {0, 1, 2}));
  expect_close(y[1], f32({3}, {3, 4, 5}));
  expect_close(y[2], f32({1}, {6}));
}

TEST(DataOpsSplit, RejectsBadInput) {
  Tensor x = iota({7});
  EXPECT_THROW(run_node(make_node("Split", 1, 3), {&x}), Error);  // uneven without num_outputs
  Tensor split = i64({3, 3});
  EXPECT_THROW(run_node(make_node("Split", 2, 2), {&x, &split}), Error);  // sum 6 != 7
  EXPECT_THROW(run_node(make_node("Split", 1, 2, {{"num_outputs", attr_i(3)}}), {&x}), Error);
}

TEST(DataOpsTile, RepeatsWrittenOut) {
  Tensor x = f32({2, 2}, {1, 2, 3, 4});
  Tensor rep = i64({2, 3});
  expect_close(run1(make_node("Tile", 2), {&x, &rep}),
               f32({4, 6}, {1, 2, 1, 2, 1, 2,  //
                            3, 4, 3, 4, 3, 4,  //
                            1, 2, 1, 2, 1, 2,  //
                            3, 4, 3, 4, 3, 4}));
  Tensor bad = i64({2});
  EXPECT_THROW(run_node(make_node("Tile", 2), {&x, &bad}), Error);
}

TEST(DataOpsFlatten, Axes) {
  Tensor x = iota({2, 3, 4});
  auto shape_for = [&](int64_t axis) {
    return shape_str(run1(make_node("Flatten", 1, 1, {{"axis", attr_i(axis)}}), {&x}).shape);
  };
  EXPECT_EQ(shape_for(0), "(1, 24)");
  EXPECT_EQ(shape_for(2), "(6, 4)");
  EXPECT_EQ(shape_for(-1), "(6, 4)");
  EXPECT_EQ(shape_for(3), "(24, 1)");
  EXPECT_EQ(shape_str(run1(make_node("Flatten", 1), {&x}).shape), "(2, 12)");
  expect_close(run1(make_node("Flatten", 1), {&x}), iota({2, 12}));
  EXPECT_THROW(shape_for(4), Error);
}

}  // namespace
