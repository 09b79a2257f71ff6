// Interface between the SwiGLU primitive (swiglu.cc) and its SIMD kernels
// (swiglu_kernels.cc, one variant per instruction set). Free of
// standard-library includes for the same reason as qmm_kernels.h: the kernels
// are compiled for instruction sets the host may lack.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mlxrt/src/mlx/qmm_kernels.h"

namespace mlxrt::swiglu {

using qmm::Isa;

// out[i] = (g[i] * sigmoid(g[i])) * u[i] for i in [0, n), with MLX's CPU
// sigmoid reproduced operation for operation (see swiglu_kernels.cc), so the
// result is bit-identical to MLX's `multiply(multiply(g, sigmoid(g)), u)` in
// f32 on its CPU backend. `out` may alias `g` or `u`.
struct Kernels {
  Isa isa;
  void (*run)(const float* g, const float* u, float* out, size_t n);
};

// Per-instruction-set entry points; null when not compiled for this target.
const Kernels* kernels_avx512();
const Kernels* kernels_avx2();
const Kernels* kernels_portable();

}  // namespace mlxrt::swiglu
