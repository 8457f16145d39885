#include "engine/ir/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace wxe;

TEST(Tensor, HalfRoundTripIsExactForRepresentableValues) {
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(half_to_float(float_to_half(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(1e6f))));
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 lies halfway between two bf16 values: ties to even gives 1.0
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
}

TEST(Tensor, ConvertKeepsLargeInt64) {
  Tensor t = Tensor::from_i64({INT64_MAX, -5, 3});
  EXPECT_EQ(t.to_i64()[0], INT64_MAX);
  Tensor f = t.to_f32();
  EXPECT_EQ(f.data<float>()[1], -5.f);
}

// The host tensor memory counters (engine/ir/tensor.h) that `bench --train` splits its peak with.
TEST(Tensor, HostBytesCountLiveAndPeakStorage) {
  const size_t base = host_bytes_live();
  reset_host_peak();
  {
    Tensor a(DType::F32, {1000, 1000});
    Tensor view = a.reshaped({1000000});  // same storage: counted once
    EXPECT_EQ(host_bytes_live(), base + 4000000);
    { Tensor b(DType::F64, {1000}); }
    EXPECT_EQ(host_bytes_peak(), base + 4008000);
  }
  EXPECT_EQ(host_bytes_live(), base);
  EXPECT_EQ(host_bytes_peak(), base + 4008000);
  reset_host_peak();
  EXPECT_EQ(host_bytes_peak(), base);
}
