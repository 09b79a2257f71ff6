// AVX2 + FMA variant of the quantized-matmul kernel (see qmm_impl.h).
// Compiled for every x86-64 build; only called when the CPU reports AVX2,
// FMA and F16C.
#include "mlxrt/src/mlx/qmm_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define QMM_FN __attribute__((target("avx2,fma,f16c")))
#define QMM_Q8_FN QMM_FN
// The split-nibble int8 dot tiles for 4-bit weights (qmm_impl.h).
#define QMM_Q8_SPLIT 1
#define QMM_NS avx2
#define QMM_ISA Isa::Avx2

namespace mlxrt::qmm::avx2 {
namespace {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

struct V {
  using T = __m256;
  static constexpr int W = 8;
  // 16 registers: 2 x 4 accumulators leave room for weights, x and scales.
  static constexpr int MR_DIRECT = 2;
  static constexpr int NR_WIDE = 4;  // no wide decode tile (16 registers)
  // Batched decode through direct tiles against the batch-invariant GEMM
  // path (Zen 5, Q4_1, alternated): 2x as fast at M = 4, 1.5x at 8, 1.2x
  // at 16, equal at 32.
  static constexpr int DIRECT_ROWS = 16;
  // Two halves of 3 rows: 3 x 2 accumulators for each of two lane classes
  // + 2 weight vectors + 1 broadcast of x.
  static constexpr int MR_GEMM = 6;

  QMM_FN static inline T zero() { return _mm256_setzero_ps(); }
  QMM_FN static inline T load(const float* p) { return _mm256_loadu_ps(p); }
  QMM_FN static inline void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  QMM_FN static inline T set1(float s) { return _mm256_set1_ps(s); }
  QMM_FN static inline T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  QMM_FN static inline T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  QMM_FN static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
  // 4 x 4 transposes inside each 128-bit half, then the halves swapped.
  QMM_FN static inline void transpose(T (&v)[8]) {
    T a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
      a[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
      a[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
      b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xee);
      b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
      b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_permute2f128_ps(b[j], b[4 + j], 0x20);
      v[4 + j] = _mm256_permute2f128_ps(b[j], b[4 + j], 0x31);
    }
  }
  // The first n (< W) floats at p, the other lanes 0 (nothing read past n).
  QMM_FN static inline T load_n(const float* p, int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
  }
  QMM_FN static inline float hsum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  QMM_FN static inline __m256i bytes(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  struct Tab4 {
    T s, b;
  };
  QMM_FN static inline Tab4 table4(T s, T b) { return {s, b}; }
  // Low nibbles are the even k of a block, high nibbles the odd k.
  QMM_FN static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    __m256i b = bytes(p);
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), tab.s,
                         tab.b);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), tab.s, tab.b);
  }
  QMM_FN static inline T unpack8(const uint8_t* p) { return _mm256_cvtepi32_ps(bytes(p)); }
  QMM_FN static inline void convert_halves(const uint16_t* src, int n, bool bf16, float* dst) {
    int i = 0;
    for (; i + W <= n; i += W) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      T v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                 : _mm256_cvtph_ps(h);
      _mm256_storeu_ps(dst + i, v);
    }
    for (; i < n; ++i) dst[i] = bf16 ? bf16_to_float(src[i]) : _cvtsh_ss(src[i]);
  }

  // Int8 activations, 8-bit weights: a chunk is one block of 32 bytes, all
  // 8 lanes. vpmaddubsw (u8 x s8 pairs -> s16, saturating) then vpmaddwd by
  // 1. q up to 255 could saturate (2 * 255 * 127), so the weights are taken
  // as q - 128 (|q - 128| <= 128 unsigned, the sign moved onto xq: pairs at
  // most 2 * 128 * 127 < 32767) and 128 * sum(xq) is added back. (4-bit
  // weights take the split-nibble chunks, q8s_* below.)
  static constexpr int Q8_BLOCKS = 1;
  static constexpr int Q8_MR = 2;
  struct W8 {
    __m256i a;  // unsigned bytes: |q - 128|
    __m256i s;  // q - 128 as signed bytes (its sign goes onto xq)
  };
  template <int BITS, bool>
  QMM_FN static inline W8 q8_load(const uint8_t* p) {
    static_assert(BITS == 8, "4-bit weights run q8s_load");
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i s = _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
    return {_mm256_abs_epi8(s), s};
  }
  template <int BITS>
  QMM_FN static inline T q8_dot(const W8& w, const int8_t* x, const int32_t* xqsum) {
    static_assert(BITS == 8, "4-bit weights run q8s_dot");
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i p = _mm256_maddubs_epi16(w.a, _mm256_sign_epi8(xv, w.s));
    // 128 * sum(xq) over the block, spread over the 8 lanes.
    const __m256i fix = _mm256_set1_epi32(16 * *xqsum);
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), fix));
  }
  template <int, bool>
  QMM_FN static inline T q8_wscale(const float* s, int g) { return _mm256_set1_ps(s[g]); }

  // Split-nibble chunks (4-bit weights; x in the Q8Split layout): two
  // blocks, one per 128-bit lane. A block's two nibbles go to two vectors
  // in the same lanes; their `vpmaddubsw` pairs are added as int16 (at
  // most 2 * 2 * 15 * 127, no saturation) before one `vpmaddwd`, so the
  // conversion, scaling and FMA run once per 64 values (per 32 above).
  static constexpr int Q8S_BLOCKS = 2;
  struct Nibbles {
    __m256i lo, hi;
  };
  // `n` = 1: the second block is zero (never read).
  QMM_FN static inline Nibbles q8s_load(const uint8_t* p, int n) {
    const __m256i raw =
        n == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
               : _mm256_set_m128i(_mm_setzero_si128(),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i m = _mm256_set1_epi8(0x0f);
    return {_mm256_and_si256(raw, m), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m)};
  }
  // x: the chunk's 32 even-k bytes, then its 32 odd-k bytes.
  QMM_FN static inline T q8s_dot(const Nibbles& w, const int8_t* x) {
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, xe), _mm256_maddubs_epi16(w.hi, xo));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  // Lanes 4L..4L+3: the scale of block L (n blocks).
  template <int GROUP>
  QMM_FN static inline T q8s_wscale(const float* s, int g, int n) {
    if constexpr (GROUP == 32) {
      return _mm256_set_m128(_mm_set1_ps(n == 2 ? s[g + 1] : 0.0f), _mm_set1_ps(s[g]));
    } else {
      return _mm256_set1_ps(s[g]);
    }
  }
};

}  // namespace
}  // namespace mlxrt::qmm::avx2

#include "mlxrt/src/mlx/qmm_impl.h"

namespace mlxrt::qmm {
const Kernels* kernels_avx2() { return &avx2::kKernels; }
}  // namespace mlxrt::qmm

#else
namespace mlxrt::qmm {
const Kernels* kernels_avx2() { return nullptr; }
}  // namespace mlxrt::qmm
#endif
