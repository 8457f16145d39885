// Backward kernels of backward_pointwise.cpp and backward_movement.cpp with an explicit choice
// of path, for tests that compare the fast path with the reference (the oracle).
#pragma once
#include <string>

#include "engine/ir/ops.h"

namespace wxe::cpu {

// The backward kernel of op on the given path: Add, Sub, Mul, Div, Pow, Max, Min, Erf,
// Transpose and Concat have a fast one (the registered kernel) and a reference one; for the
// other ops both are the registered kernel. Call after register_cpu_kernels().
BackwardFn pointwise_backward_kernel(const std::string& op, KernelKind kind);

}  // namespace wxe::cpu
