// Static-batch exports run any batch (load/model.h run_any_batch): rows in runs of the traced
// batch, the last run padded; each output row equals the model run on that row alone.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/io/npy.h"
#include "importers/onnx/onnx_import.h"
#include "tests/test_util.h"
#include "load/model.h"

namespace wxe::test {
namespace {

// rows r0.. of t (n of them)
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n) {
  Shape s = t.shape;
  s[0] = n;
  Tensor r(t.dtype, s);
  const size_t row = t.nbytes() / t.shape[0];
  std::memcpy(r.raw(), (const uint8_t*)t.raw() + r0 * row, n * row);
  return r;
}

Tensor stack_rows(const std::vector<Tensor>& parts) {
  Shape s = parts[0].shape;
  s[0] = 0;
  for (auto& p : parts) s[0] += p.shape[0];
  Tensor r(parts[0].dtype, s);
  size_t off = 0;
  for (auto& p : parts) {
    std::memcpy((uint8_t*)r.raw() + off, p.raw(), p.nbytes());
    off += p.nbytes();
  }
  return r;
}

// The model prepared for `x` (any batch) and run with run_any_batch.
Tensor run_model(const std::string& model, const std::string& input, const Tensor& x, int64_t* traced) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path(model));
  std::map<std::string, Tensor> in = {{input, x}};
  *traced = traced_batch(g, in);
  prepare_model(g, specs_at_batch(in, *traced), {});
  Executor ex(g);
  return run_any_batch(ex, in, *traced)[0];
}

TEST(AnyBatch, StaticBatchOneRunsThreeRows) {
  register_cpu_kernels();
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));  // (1, ...): traced at batch 1
  Tensor x3 = stack_rows({x, randn(x.shape, 5), randn(x.shape, 6, 0.5f)});
  Graph g = import_onnx(data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx"));
  std::map<std::string, Tensor> in = {{"x", x3}};
  const int64_t traced = traced_batch(g, in);
  EXPECT_EQ(traced, 1);
  prepare_model(g, specs_at_batch(in, traced), {});
  Executor ex(g);
  Tensor y3 = run_any_batch(ex, in, traced)[0];
  ASSERT_EQ(y3.shape[0], 3);
  // row 0 against PyTorch; every row against the model run on that row alone
  expect_close(rows_of(y3, 0, 1), read_npy(data_path("tests/data/crossformer_tiny_y.npy")), 1e-4);
  for (int64_t r = 0; r < 3; ++r)
    EXPECT_EQ(max_abs_diff(rows_of(y3, r, 1), ex.run({{"x", rows_of(x3, r, 1)}})[0]), 0) << "row " << r;
}

TEST(AnyBatch, StaticBatchTwoRunsOneAndThreeRowsPadded) {
  Tensor x = read_npy(data_path("tests/data/nextgen_block_x.npy"));  // (2, 32, 8, 8), traced at 2
  Tensor y = read_npy(data_path("tests/data/nextgen_block_y.npy"));
  int64_t traced = 0;
  Tensor y1 = run_model("tests/data/nextgen_block.onnx", "x", rows_of(x, 1, 1), &traced);
  EXPECT_EQ(traced, 2);
  expect_close(y1, rows_of(y, 1, 1), 1e-5);
  Tensor x3 = stack_rows({x, rows_of(x, 0, 1)});
  Tensor y3 = run_model("tests/data/nextgen_block.onnx", "x", x3, &traced);
  ASSERT_EQ(y3.shape[0], 3);
  expect_close(rows_of(y3, 0, 2), y, 1e-5);
  expect_close(rows_of(y3, 2, 1), rows_of(y, 0, 1), 1e-5);
}

TEST(AnyBatch, OtherMismatchesAreNotBatchRebinds) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path("tests/data/nextgen_block.onnx"));
  EXPECT_EQ(traced_batch(g, {{"x", Tensor(DType::F32, {2, 32, 8, 8})}}), 0);
  EXPECT_EQ(traced_batch(g, {{"x", Tensor(DType::F32, {4, 32, 8, 9})}}), 0);  // bind_inputs reports it
  EXPECT_EQ(traced_batch(g, {{"x", Tensor(DType::F32, {4, 32, 8, 8})}}), 2);
}

}  // namespace
}  // namespace wxe::test
