// Portable variant of the quantized-matmul kernel (see qmm_impl.h), built on
// GCC/Clang vector extensions: SSE2 code on any x86-64, NEON on aarch64,
// plain scalar code elsewhere. The fallback when no better variant applies.
#include "mlxrt/src/mlx/qmm_kernels.h"

#define QMM_FN
#define QMM_Q8_FN
#define QMM_NS portable
#define QMM_ISA Isa::Portable

namespace mlxrt::qmm::portable {
namespace {

typedef float v4f __attribute__((vector_size(16)));

// IEEE binary16 -> binary32 without F16C (subnormals, inf and NaN kept).
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

struct V {
  using T = v4f;
  static constexpr int W = 4;
  static constexpr int MR_DIRECT = 2;
  static constexpr int NR_WIDE = 4;  // no wide decode tile
  // The GEMM path from 3 rows on: with W = 4 lanes, re-dequantizing weights for
  // every 2-row group cost more than a panel (measured on Zen 4 against
  // the dot-product panels that preceded the GEMM path).
  static constexpr int DIRECT_ROWS = 2;
  // Two halves of 3 rows: 3 x 2 accumulators for each of two lane classes
  // + 2 weight vectors + 1 broadcast of x (16 registers).
  static constexpr int MR_GEMM = 6;

  static inline T zero() { return T{0, 0, 0, 0}; }
  static inline T load(const float* p) {
    T v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
  }
  static inline void store(float* p, T v) { __builtin_memcpy(p, &v, sizeof(v)); }
  static inline T set1(float s) { return T{s, s, s, s}; }
  static inline T fma(T a, T b, T c) { return a * b + c; }
  static inline T mul(T a, T b) { return a * b; }
  static inline T add(T a, T b) { return a + b; }
  static inline void transpose(T (&v)[4]) {
    T t[4];
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) t[c][r] = v[r][c];
    for (int c = 0; c < 4; ++c) v[c] = t[c];
  }
  static inline T load_n(const float* p, int n) {
    T v = zero();
    for (int i = 0; i < n; ++i) v[i] = p[i];
    return v;
  }
  // Halving tree, as the x86 variants (the GEMM path folds its passes so).
  static inline float hsum(T v) { return (v[0] + v[2]) + (v[1] + v[3]); }
  struct Tab4 {
    T s, b;
  };
  static inline Tab4 table4(T s, T b) { return {s, b}; }
  // Low nibbles are the even k of a block, high nibbles the odd k.
  static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    lo = T{float(p[0] & 15), float(p[1] & 15), float(p[2] & 15), float(p[3] & 15)};
    hi = T{float(p[0] >> 4), float(p[1] >> 4), float(p[2] >> 4), float(p[3] >> 4)};
    lo = fma(lo, tab.s, tab.b);
    hi = fma(hi, tab.s, tab.b);
  }
  static inline T unpack8(const uint8_t* p) {
    return T{float(p[0]), float(p[1]), float(p[2]), float(p[3])};
  }
  static inline void convert_halves(const uint16_t* src, int n, bool bf16, float* dst) {
    for (int i = 0; i < n; ++i) {
      if (bf16) {
        uint32_t u = static_cast<uint32_t>(src[i]) << 16;
        __builtin_memcpy(dst + i, &u, 4);
      } else {
        dst[i] = half_to_float(src[i]);
      }
    }
  }

  // Int8 activations: a chunk is one block, its integer dot product in
  // lane 0 (the other lanes 0).
  static constexpr int Q8_BLOCKS = 1;
  static constexpr int Q8_MR = 2;
  struct W8 {
    uint8_t q[32];
  };
  template <int BITS, bool>
  static inline W8 q8_load(const uint8_t* p) {
    W8 w;
    if constexpr (BITS == 4) {
      for (int i = 0; i < 16; ++i) {
        w.q[i] = p[i] & 15;
        w.q[16 + i] = p[i] >> 4;
      }
    } else {
      __builtin_memcpy(w.q, p, 32);
    }
    return w;
  }
  template <int BITS>
  static inline T q8_dot(const W8& w, const int8_t* x, const int32_t*) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += static_cast<int32_t>(w.q[i]) * x[i];
    return T{static_cast<float>(s), 0, 0, 0};
  }
  template <int, bool>
  static inline T q8_wscale(const float* s, int g) { return set1(s[g]); }
};

}  // namespace
}  // namespace mlxrt::qmm::portable

#include "mlxrt/src/mlx/qmm_impl.h"

namespace mlxrt::qmm {
const Kernels* kernels_portable() { return &portable::kKernels; }
}  // namespace mlxrt::qmm
