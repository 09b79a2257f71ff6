// Interface between the TurboQuant KV attention primitive (tqsdpa.cc) and its
// SIMD kernels (tqsdpa_impl.h, compiled per instruction set inside
// qsdpa_kernels.cc next to the affine kernels whose vector helpers, mask and
// softmax steps they share). Free of standard-library includes (see
// qmm_kernels.h).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mlxrt/src/mlx/qsdpa_kernels.h"

namespace mlxrt::qsdpa {

// One plane of a TurboQuant cache (src/cache/turbo.rs): per (b, h), T rows of
// `row` bytes, rows contiguous inside a (b, h).
struct Bytes {
  const uint8_t* data;
  int64_t bh[2];  // bytes between consecutive b, h
  int64_t row;

  const uint8_t* at(int b, int h, int t) const { return data + b * bh[0] + h * bh[1] + t * row; }
};

// TurboQuant attention in the rotated value domain: keys int8 (8 bits) or
// `key_bits` LSB-first packed unsigned indices with f16 scale and zero per
// 32 coordinates (k = (q + z) * s); values `value_bits` packed codebook
// indices with an f16 RMS scale per 32 (y = book[q] * r). The output is
// sum_t p_t y_t (not un-rotated).
struct TurboProblem {
  // Shape, mask and its data as the affine kernels read them (q and the
  // planes there are unused).
  Problem base;
  // Queries times the scale, [B][H][M][D] dense.
  const float* q;
  Bytes k_idx, k_scale, k_zero, v_idx, v_scale;
  int D, Dv, key_bits, value_bits;
  // Centroids of the value codebook (2^value_bits of them, zero-padded).
  float book[16];
};

// Query rows per chunk call at most, over all variants (scratch layout).
constexpr int kTurboRowsMax = 8;

// Scratch floats a chunk call needs: scores, then the chunk's key scales,
// key zeros and value scales as f32.
constexpr size_t turbo_scratch_floats(int D, int Dv) {
  return static_cast<size_t>(kTurboRowsMax) * kChunk +
         static_cast<size_t>(kChunk) * (2 * (D / 32) + Dv / 32);
}

struct TurboKernels {
  Isa isa;
  int rows;  // query rows per chunk call at most (<= kTurboRowsMax)
  // As Kernels::chunk (values in natural order).
  void (*chunk)(const TurboProblem& p, int b, int h, int m0, int rows, int t0, int t1,
                float* scratch, float* acc, float* mx, float* sum);
};

// Key and value widths the kernels take.
inline bool turbo_kernel_bits(int key_bits, int value_bits) {
  return (key_bits == 8 || (key_bits >= 2 && key_bits <= 4)) && value_bits >= 1 &&
         value_bits <= 4;
}

const TurboKernels* turbo_kernels_avx512();
const TurboKernels* turbo_kernels_avx2();
const TurboKernels* turbo_kernels_portable();

}  // namespace mlxrt::qsdpa
