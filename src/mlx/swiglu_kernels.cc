// SwiGLU kernels: out = (g * sigmoid(g)) * u in f32, one variant per
// instruction set (AVX-512, AVX2+FMA, portable scalar), selected at run time
// like the quantized-matmul kernels (see qmm.cc).
//
// Numerics. MLX's CPU wheel computes sigmoid with its own exp
// (mlx/backend/cpu/simd/math.h, Cephes polynomial, about 2 ulp from the true
// exp) one element at a time, calling libm's fmaf for each fused step. The
// kernels below do the same operations in the same order with vector
// instructions, so every result is bit-identical to MLX's
//   multiply(multiply(g, sigmoid(g)), u):
//   exp(a):  x = a * 1.442695f; i = floor(x + 0.5) (MLX adds 0.5 in double,
//            i.e. without rounding the sum; computed here as floor(x) + 1
//            when x >= floor(x) + 0.5, which is exact for |x| < 2^22, and
//            larger |x| only occur where the result is replaced below);
//            f = x - i; p = Horner in f with fma (hardware FMA rounds like
//            fmaf); result = 2^i * p; NaN -> a, a > 88 -> inf, a < -88 -> 0.
//   sigmoid(g): y = 1 / (1 + exp(|g|)); g < 0 ? y : 1 - y.
// Hardware FMA and libm's fmaf round identically, and division is correctly
// rounded in both. GCC contracts a*b+c into an FMA by default in C++; the
// `opaque` barriers below keep the two places where that could happen
// (x - i and 1 + result) as separately rounded operations. The tests compare
// bits against MLX's ops on millions of inputs (and an ignored test on all
// 2^32 gate values: no difference for any variant).
//
// No standard-library includes (see swiglu_kernels.h).
#include "mlxrt/src/mlx/swiglu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (their
// _mm*_undefined_* placeholders) once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mlxrt::swiglu {
namespace {

// MLX's constants, verbatim.
constexpr float kLog2e = 1.442695f;
constexpr float kP0 = 1.535336188319500e-4f;
constexpr float kP1 = 1.339887440266574e-3f;
constexpr float kP2 = 9.618437357674640e-3f;
constexpr float kP3 = 5.550332471162809e-2f;
constexpr float kP4 = 2.402264791363012e-1f;
constexpr float kP5 = 6.931472028550421e-1f;
constexpr float kP6 = 1.000000000000000f;

// ---------------------------------------------------------------------------
// Scalar: the portable variant, and reference for the vector tails.

inline float exp_scalar(float a) {
  if (a != a) return a;
  if (a > 88.0f) return __builtin_inff();
  if (a < -88.0f) return 0.0f;
  float x = a * kLog2e;
  opaque(x);
  const float i = static_cast<float>(__builtin_floor(static_cast<double>(x) + 0.5));
  const float f = x - i;
  float p = kP0;
  p = __builtin_fmaf(p, f, kP1);
  p = __builtin_fmaf(p, f, kP2);
  p = __builtin_fmaf(p, f, kP3);
  p = __builtin_fmaf(p, f, kP4);
  p = __builtin_fmaf(p, f, kP5);
  p = __builtin_fmaf(p, f, kP6);
  // |x| <= 127 here, so i + 127 is in [0, 254].
  const int32_t bits = (static_cast<int32_t>(i) + 127) << 23;
  float two_i;
  __builtin_memcpy(&two_i, &bits, 4);
  float r = two_i * p;
  opaque(r);
  return r;
}

inline float swiglu_scalar(float g, float u) {
  const float y = 1.0f / (1.0f + exp_scalar(__builtin_fabsf(g)));
  const float s = g < 0.0f ? y : 1.0f - y;
  return (g * s) * u;
}

void run_portable(const float* g, const float* u, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = swiglu_scalar(g[i], u[i]);
}

const Kernels kPortable{Isa::Portable, &run_portable};

#if defined(__x86_64__)

// ---------------------------------------------------------------------------
// AVX-512 (16 lanes; tails with masked loads and stores)

#define SWIGLU_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))

SWIGLU_AVX512 inline __m512 exp_avx512(__m512 a) {
  __m512 x = _mm512_mul_ps(a, _mm512_set1_ps(kLog2e));
  __asm__("" : "+v"(x));
  const __m512 fl = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(x, _mm512_add_ps(fl, _mm512_set1_ps(0.5f)), _CMP_GE_OQ);
  const __m512 i = _mm512_mask_add_ps(fl, up, fl, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(x, i);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP6));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(i), _mm512_set1_epi32(127)), 23);
  __m512 r = _mm512_mul_ps(_mm512_castsi512_ps(bits), p);
  __asm__("" : "+v"(r));
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, _mm512_set1_ps(88.0f), _CMP_GT_OQ),
                         _mm512_set1_ps(__builtin_inff()));
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, _mm512_set1_ps(-88.0f), _CMP_LT_OQ),
                         _mm512_setzero_ps());
  return r;
}

SWIGLU_AVX512 inline __m512 swiglu_avx512(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 y = _mm512_div_ps(one, _mm512_add_ps(one, exp_avx512(_mm512_abs_ps(g))));
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 s = _mm512_mask_mov_ps(_mm512_sub_ps(one, y), neg, y);
  return _mm512_mul_ps(_mm512_mul_ps(g, s), u);
}

SWIGLU_AVX512 void run_avx512(const float* g, const float* u, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, swiglu_avx512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, swiglu_avx512(_mm512_maskz_loadu_ps(m, g + i),
                                                    _mm512_maskz_loadu_ps(m, u + i)));
  }
}

const Kernels kAvx512{Isa::Avx512, &run_avx512};

// ---------------------------------------------------------------------------
// AVX2 + FMA (8 lanes; scalar tail)

#define SWIGLU_AVX2 __attribute__((target("avx2,fma")))

SWIGLU_AVX2 inline __m256 exp_avx2(__m256 a) {
  __m256 x = _mm256_mul_ps(a, _mm256_set1_ps(kLog2e));
  __asm__("" : "+x"(x));
  const __m256 fl = _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(x, _mm256_add_ps(fl, _mm256_set1_ps(0.5f)), _CMP_GE_OQ);
  const __m256 i = _mm256_add_ps(fl, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
  const __m256 f = _mm256_sub_ps(x, i);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP6));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(i), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(_mm256_castsi256_ps(bits), p);
  __asm__("" : "+x"(r));
  r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_inff()),
                       _mm256_cmp_ps(a, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  r = _mm256_blendv_ps(r, _mm256_setzero_ps(),
                       _mm256_cmp_ps(a, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
  return r;
}

SWIGLU_AVX2 inline __m256 swiglu_avx2(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 abs_g = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
  const __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, exp_avx2(abs_g)));
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 s = _mm256_blendv_ps(_mm256_sub_ps(one, y), y, neg);
  return _mm256_mul_ps(_mm256_mul_ps(g, s), u);
}

SWIGLU_AVX2 void run_avx2(const float* g, const float* u, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu_avx2(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) out[i] = swiglu_scalar(g[i], u[i]);
}

const Kernels kAvx2{Isa::Avx2, &run_avx2};

#endif  // __x86_64__

}  // namespace

const Kernels* kernels_portable() { return &kPortable; }
#if defined(__x86_64__)
const Kernels* kernels_avx512() { return &kAvx512; }
const Kernels* kernels_avx2() { return &kAvx2; }
#else
const Kernels* kernels_avx512() { return nullptr; }
const Kernels* kernels_avx2() { return nullptr; }
#endif

}  // namespace mlxrt::swiglu
