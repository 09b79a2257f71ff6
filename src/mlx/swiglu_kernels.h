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

// An empty asm that "modifies" v: the compiler must materialize the rounded
// value, so it cannot fuse the operation that produced v with the next one (e.g.
// contract a*b+c into an FMA). Shared by the kernels that repeat MLX's
// separately rounded f32 arithmetic bit for bit.
template <class T>
inline void opaque(T& v) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  __asm__("" : "+m"(v));
#endif
}

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
