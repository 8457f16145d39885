// Device-side reduction shared by the .cu files (CUDA code only: not for cuda_util.h, which
// host compilers read too).
#pragma once
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

// The sum of every thread's s over a block of kThreads threads, in a fixed order (a tree over
// thread indices): deterministic. Every thread gets the total; all threads must call it.
__device__ inline double block_sum(double s) {
  __shared__ double acc[kThreads];
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
  const double total = acc[0];
  __syncthreads();
  return total;
}

}  // namespace wxe::cuda
