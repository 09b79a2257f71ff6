// Interface between the quantized-KV attention primitive (qsdpa.cc) and its
// SIMD kernels (qsdpa_impl.h, instantiated per instruction set by
// qsdpa_kernels.cc). Free of standard-library includes for the same reason as
// qmm_kernels.h: the kernels are compiled for instruction sets the host may
// lack.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mlxrt/src/mlx/qmm_kernels.h"

namespace mlxrt::qsdpa {

using qmm::Isa;

// One affine-quantized K or V cache (MLX's layout): per (b, h), T rows of
// `dim` values packed little-end-first into uint32 words, and T rows of
// dim / group f32 scales and biases; rows are contiguous inside a (b, h).
struct Plane {
  const uint8_t* w;
  const float* scales;
  const float* biases;
  int64_t w_bh[2];  // bytes between consecutive b, h
  int64_t s_bh[2];  // floats between consecutive b, h (scales)
  int64_t b_bh[2];  // (biases)
  int dim;

  const uint8_t* w_at(int b, int h) const { return w + b * w_bh[0] + h * w_bh[1]; }
  const float* s_at(int b, int h) const { return scales + b * s_bh[0] + h * s_bh[1]; }
  const float* b_at(int b, int h) const { return biases + b * b_bh[0] + h * b_bh[1]; }
};

enum class MaskKind : uint8_t { None = 0, Causal = 1, Bool = 2, Additive = 3 };

// Attention of M = rep * L query rows per (b, kv head) over T keys. Row m of
// kv head h is query head h * rep + m / L at position l = m % L.
struct Problem {
  // Queries times `scale`, [B][H][M][D] dense; for 4-bit keys permuted in
  // each block of 2 * lanes values like the quantized matmul's x (even d
  // first, then odd d: the order a vector unpacks low and high nibbles).
  const float* q;
  Plane k, v;
  int B, H, M, L, T;
  int group, bits;
  MaskKind mask;
  // Bool: uint8 (0 = masked); Additive: f32. Element strides for
  // (b, h, l, t); the head stride is 0 when the mask has one head.
  const void* mask_data;
  int64_t mask_stride[4];

  // Causal: keys a row sees at most (0 = no window; the last `window`
  // positions up to its own).
  int window = 0;
  // Float kernel, optional: the keys transposed, [B][H][k.dim][kt_len]
  // (kt_len >= T + 2 * lanes, zero past T).
  const float* keys_t = nullptr;
  int64_t kt_len = 0;
  // The output as [B, L, H * rep, v.dim] instead of [B, H * rep, L, v.dim].
  bool heads_last = false;

  // Last visible key of row m under the causal mask (may be < 0).
  int causal_last(int m) const { return T - L + m % L; }
  // First visible key of row m under the causal mask (>= 0).
  int causal_first(int m) const {
    const int f = window > 0 ? causal_last(m) - window + 1 : 0;
    return f > 0 ? f : 0;
  }
};

// Keys per chunk (flash-decoding split of T) at most.
constexpr int kChunk = 256;

struct Kernels {
  Isa isa;
  int lanes;  // f32 lanes of one vector
  int rows;   // query rows per block at most (register tile height)
  // Partial attention of rows [m0, m0 + rows) of head (b, h) over keys
  // [t0, t1) (t1 - t0 <= kChunk): acc[rows][v.dim] = sum_t exp(s_t - mx) *
  // V_t (V in the kernel's value order: 4-bit values permuted as q is),
  // mx[rows] = max_t s_t, sum[rows] = sum_t exp(s_t - mx), with s_t the
  // masked score. `scratch` holds `scratch_floats()` floats.
  void (*chunk)(const Problem& p, int b, int h, int m0, int rows, int t0, int t1,
                float* scratch, float* acc, float* mx, float* sum);
};

// An IEEE binary16 value (a KV cache stored as f16) as f32, exactly:
// subnormals, infinities and NaNs included.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize the mantissa.
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

// Per-thread scratch a kernel needs.
constexpr size_t kScratchFloats = 16 * kChunk;

const Kernels* kernels_avx512();
const Kernels* kernels_avx2();
const Kernels* kernels_portable();

}  // namespace mlxrt::qsdpa
