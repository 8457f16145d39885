// WXE_HD marks a function that runs on the host and in CUDA kernels: element, index and
// reduction math shared by the CPU and CUDA backends, which the CPU tests exercise on the host.
// A macro only: the engine stays free of device code.
#pragma once

#ifdef __CUDACC__
#define WXE_HD __host__ __device__ inline
#else
#define WXE_HD inline
#endif
