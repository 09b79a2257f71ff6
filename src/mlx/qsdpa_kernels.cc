// Quantized-KV attention kernels (qsdpa_impl.h, and the TurboQuant ones of
// tqsdpa_impl.h, which share their helpers), one variant per instruction
// set: AVX-512, AVX2 + FMA, and portable (GCC vector extensions: SSE2 on
// x86-64, NEON on aarch64). Selected at run time like the quantized matmul's.
// No standard-library includes (see qsdpa_kernels.h).
#include "mlxrt/src/mlx/qsdpa_kernels.h"
#include "mlxrt/src/mlx/tqsdpa_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized (their
// _mm*_undefined_* placeholders) once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// exp(a) = 2^i * P(f), a * log2(e) = i + f, |f| <= 1/2: MLX's CPU exp
// (Cephes polynomial, mlx/backend/cpu/simd/math.h) with round-to-nearest i.
// Inputs are clamped to [-88, 88] and results below -88 flushed to 0.
#define QS_EXP_CONSTANTS                                      \
  constexpr float kLog2e = 1.442695f;                         \
  constexpr float kP[7] = {1.535336188319500e-4f, 1.339887440266574e-3f, \
                           9.618437357674640e-3f, 5.550332471162809e-2f, \
                           2.402264791363012e-1f, 6.931472028550421e-1f, 1.0f};

// ---------------------------------------------------------------------------
// Portable

#define QS_FN
#define QS_NS portable
#define QS_ISA Isa::Portable

namespace mlxrt::qsdpa::portable {
namespace {

typedef float v4f __attribute__((vector_size(16)));

struct V {
  using T = v4f;
  static constexpr int W = 4;
  static constexpr int MR = 4;

  static inline T zero() { return T{0, 0, 0, 0}; }
  static inline T load(const float* p) {
    T v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
  }
  static inline T load(const uint16_t* p) {
    return T{half_to_float(p[0]), half_to_float(p[1]), half_to_float(p[2]), half_to_float(p[3])};
  }
  static inline void store(float* p, T v) { __builtin_memcpy(p, &v, sizeof(v)); }
  static inline T set1(float s) { return T{s, s, s, s}; }
  static inline T fma(T a, T b, T c) { return a * b + c; }
  static inline T add(T a, T b) { return a + b; }
  static inline T sub(T a, T b) { return a - b; }
  static inline T max(T a, T b) { return a > b ? a : b; }
  static inline float hsum(T v) { return (v[0] + v[1]) + (v[2] + v[3]); }
  // hsum of four vectors, into out[0..4).
  static inline void hsum4(const T (&a)[4], float* out) {
    for (int j = 0; j < 4; ++j) out[j] = hsum(a[j]);
  }
  static inline float hmax(T v) {
    const float a = v[0] > v[1] ? v[0] : v[1], b = v[2] > v[3] ? v[2] : v[3];
    return a > b ? a : b;
  }
  static inline T exp(T a) {
    T r;
    for (int i = 0; i < 4; ++i) r[i] = a[i] < -88.0f ? 0.0f : __builtin_expf(a[i]);
    return r;
  }
  struct Tab4 {
    T s, b;
  };
  static inline Tab4 table4(T s, T b) { return {s, b}; }
  static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    lo = T{float(p[0] & 15), float(p[1] & 15), float(p[2] & 15), float(p[3] & 15)};
    hi = T{float(p[0] >> 4), float(p[1] >> 4), float(p[2] >> 4), float(p[3] >> 4)};
    lo = fma(lo, tab.s, tab.b);
    hi = fma(hi, tab.s, tab.b);
  }
  static inline T unpack8(const uint8_t* p) {
    return T{float(p[0]), float(p[1]), float(p[2]), float(p[3])};
  }
};

}  // namespace
}  // namespace mlxrt::qsdpa::portable

#include "mlxrt/src/mlx/qsdpa_impl.h"
#include "mlxrt/src/mlx/tqsdpa_impl.h"
#include "mlxrt/src/mlx/fattn_impl.h"  // the float kernel, same vectors
#undef QS_FN
#undef QS_NS
#undef QS_ISA

#if defined(__x86_64__)

// ---------------------------------------------------------------------------
// AVX2 + FMA

#define QS_FN __attribute__((target("avx2,fma,f16c")))
#define QS_NS avx2
#define QS_ISA Isa::Avx2

namespace mlxrt::qsdpa::avx2 {
namespace {

QS_EXP_CONSTANTS

struct V {
  using T = __m256;
  static constexpr int W = 8;
  // 16 registers: 4 x 2 value accumulators + 2 values + a broadcast.
  static constexpr int MR = 4;

  QS_FN static inline T zero() { return _mm256_setzero_ps(); }
  QS_FN static inline T load(const float* p) { return _mm256_loadu_ps(p); }
  QS_FN static inline T load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  QS_FN static inline void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  QS_FN static inline T set1(float s) { return _mm256_set1_ps(s); }
  QS_FN static inline T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  QS_FN static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
  QS_FN static inline T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  QS_FN static inline T max(T a, T b) { return _mm256_max_ps(a, b); }
  QS_FN static inline float hsum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // hsum of four vectors, into out[0..4): lanes i and i + 2 of each 128-bit
  // half, then those pairs, then the halves (the same order for each).
  QS_FN static inline void hsum4(const T (&a)[4], float* out) {
    const T s01 = _mm256_add_ps(_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    const T s23 = _mm256_add_ps(_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    const T s = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
  QS_FN static inline float hmax(T v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  QS_FN static inline T exp(T a) {
    const T under = _mm256_cmp_ps(a, _mm256_set1_ps(-88.0f), _CMP_LT_OQ);
    T x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-88.0f), a));
    x = _mm256_mul_ps(x, _mm256_set1_ps(kLog2e));
    const T i = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const T f = _mm256_sub_ps(x, i);
    T p = _mm256_set1_ps(kP[0]);
    for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP[k]));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    const T r = _mm256_mul_ps(_mm256_castsi256_ps(e), p);
    return _mm256_andnot_ps(under, r);
  }
  QS_FN static inline __m256i bytes(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  struct Tab4 {
    T s, b;
  };
  QS_FN static inline Tab4 table4(T s, T b) { return {s, b}; }
  QS_FN static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    __m256i b = bytes(p);
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), tab.s,
                         tab.b);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), tab.s, tab.b);
  }
  QS_FN static inline T unpack8(const uint8_t* p) { return _mm256_cvtepi32_ps(bytes(p)); }
};

}  // namespace
}  // namespace mlxrt::qsdpa::avx2

#include "mlxrt/src/mlx/qsdpa_impl.h"
#include "mlxrt/src/mlx/tqsdpa_impl.h"
#include "mlxrt/src/mlx/fattn_impl.h"  // the float kernel, same vectors
#undef QS_FN
#undef QS_NS
#undef QS_ISA

// ---------------------------------------------------------------------------
// AVX-512

#define QS_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define QS_NS avx512
#define QS_ISA Isa::Avx512

namespace mlxrt::qsdpa::avx512 {
namespace {

QS_EXP_CONSTANTS

struct V {
  using T = __m512;
  static constexpr int W = 16;
  // 8 x 2 value accumulators + 2 values + a broadcast of 32 registers.
  static constexpr int MR = 8;

  QS_FN static inline T zero() { return _mm512_setzero_ps(); }
  QS_FN static inline T load(const float* p) { return _mm512_loadu_ps(p); }
  QS_FN static inline T load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  QS_FN static inline void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  QS_FN static inline T set1(float s) { return _mm512_set1_ps(s); }
  QS_FN static inline T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  QS_FN static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
  QS_FN static inline T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  QS_FN static inline T max(T a, T b) { return _mm512_max_ps(a, b); }
  QS_FN static inline __m256 fold(T v, bool take_max) {
    const T swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm512_castps512_ps256(take_max ? _mm512_max_ps(v, swapped) : _mm512_add_ps(v, swapped));
  }
  QS_FN static inline float hsum(T v) {
    const __m256 h8 = fold(v, false);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // hsum of four vectors, into out[0..4): lanes i and i + 2 of each 128-bit
  // quarter, then those pairs, then the quarters as halves (`fold`) and the
  // halves' halves (the same order for each).
  QS_FN static inline void hsum4(const T (&a)[4], float* out) {
    const T s01 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const T s23 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m256 h = fold(_mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2))),
                          false);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
  QS_FN static inline float hmax(T v) {
    const __m256 h8 = fold(v, true);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  QS_FN static inline T exp(T a) {
    const __mmask16 under = _mm512_cmp_ps_mask(a, _mm512_set1_ps(-88.0f), _CMP_LT_OQ);
    T x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), a));
    x = _mm512_mul_ps(x, _mm512_set1_ps(kLog2e));
    const T i = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const T f = _mm512_sub_ps(x, i);
    T p = _mm512_set1_ps(kP[0]);
    for (int k = 1; k < 7; ++k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP[k]));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(i), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), _mm512_castsi512_ps(e), p);
  }
  // 4-bit values through a 16-entry table s * [0..15] + b (see qmm_avx512.cc).
  struct Tab4 {
    T t;
  };
  QS_FN static inline Tab4 table4(T s, T b) {
    const T iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return {_mm512_fmadd_ps(iota, s, b)};
  }
  QS_FN static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(b, tab.t);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), tab.t);
  }
  QS_FN static inline T unpack8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};

}  // namespace
}  // namespace mlxrt::qsdpa::avx512

#include "mlxrt/src/mlx/qsdpa_impl.h"
#include "mlxrt/src/mlx/tqsdpa_impl.h"
#include "mlxrt/src/mlx/fattn_impl.h"  // the float kernel, same vectors

#endif  // __x86_64__

namespace mlxrt::qsdpa {
const Kernels* kernels_portable() { return &portable::kKernels; }
const TurboKernels* turbo_kernels_portable() { return &portable::kTurboKernels; }
#if defined(__x86_64__)
const Kernels* kernels_avx2() { return &avx2::kKernels; }
const Kernels* kernels_avx512() { return &avx512::kKernels; }
const TurboKernels* turbo_kernels_avx2() { return &avx2::kTurboKernels; }
const TurboKernels* turbo_kernels_avx512() { return &avx512::kTurboKernels; }
#else
const Kernels* kernels_avx2() { return nullptr; }
const Kernels* kernels_avx512() { return nullptr; }
const TurboKernels* turbo_kernels_avx2() { return nullptr; }
const TurboKernels* turbo_kernels_avx512() { return nullptr; }
#endif
}  // namespace mlxrt::qsdpa
