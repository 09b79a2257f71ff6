// AVX-512 variant of the quantized-matmul kernel (see qmm_impl.h). Compiled
// for every x86-64 build; only called when the CPU reports AVX-512.
#include "mlxrt/src/mlx/qmm_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized and (in
// _mm512_reduce_max_ps) -Wuninitialized: their _mm*_undefined_*
// placeholders, once inlined into the kernels.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define QMM_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
// VNNI (vpdpbusd) only in the int8-activation kernel; qmm.cc calls it only
// when the CPU has it.
#define QMM_Q8_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
// The column-interleaved int8 GEMM (qmm_impl.h) exists for this variant.
#define QMM_Q8_GEMM 1
// So do the split-nibble int8 dot tiles for 4-bit weights (qmm_impl.h).
#define QMM_Q8_SPLIT 1
#define QMM_NS avx512
#define QMM_ISA Isa::Avx512

namespace mlxrt::qmm::avx512 {
namespace {

struct V {
  using T = __m512;
  static constexpr int W = 16;
  // 4 x 4 accumulators. 6 x 4 fit the 32 registers too, but those tiles ran
  // ~1.4x slower per row (Zen 5, in cache, 4-bit, K = 576 and 1536: M = 32
  // as 8 tiles of 4 rows took 0.83x the time of 6 tiles of 5 or 6).
  static constexpr int MR_DIRECT = 4;
  // Decode (one or two rows of x) runs tiles of 8 weight rows.
  static constexpr int NR_WIDE = 8;
  // Batched decode at M = 32 runs ~11% faster direct than through the
  // batch-invariant GEMM path (Zen 5, Q4_0 and Q4_1, alternated; 64 rows no
  // better than 32). MLXRT_QMM_DIRECT_ROWS overrides it for tuning.
  static constexpr int DIRECT_ROWS = 32;
  // Run as two halves of 7 rows: 7 x 2 accumulators per lane class, two
  // classes at once, + 2 weight vectors + 1 broadcast of x.
  static constexpr int MR_GEMM = 14;

  QMM_FN static inline T zero() { return _mm512_setzero_ps(); }
  QMM_FN static inline T load(const float* p) { return _mm512_loadu_ps(p); }
  QMM_FN static inline void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  QMM_FN static inline T set1(float s) { return _mm512_set1_ps(s); }
  QMM_FN static inline T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  QMM_FN static inline T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  QMM_FN static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
  // 4 x 4 transposes inside each 128-bit lane, then the lanes moved.
  QMM_FN static inline void transpose(T (&v)[16]) {
    T a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
      a[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
      a[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      b[i] = _mm512_shuffle_ps(a[i], a[i + 2], 0x44);
      b[i + 1] = _mm512_shuffle_ps(a[i], a[i + 2], 0xee);
      b[i + 2] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0x44);
      b[i + 3] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0xee);
    }
    // b[4i + j], lane L: column 4L + j of rows 4i..4i+3.
    for (int j = 0; j < 4; ++j) {
      const T p0 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x44);
      const T p1 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xee);
      const T q0 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x44);
      const T q1 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xee);
      v[j] = _mm512_shuffle_f32x4(p0, q0, 0x88);
      v[4 + j] = _mm512_shuffle_f32x4(p0, q0, 0xdd);
      v[8 + j] = _mm512_shuffle_f32x4(p1, q1, 0x88);
      v[12 + j] = _mm512_shuffle_f32x4(p1, q1, 0xdd);
    }
  }
  // The first n (< W) floats at p, the other lanes 0 (nothing read past n).
  QMM_FN static inline T load_n(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  }
  // (GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized.)
  QMM_FN static inline float hsum(T v) {
    __m512 h = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    __m256 h8 = _mm512_castps512_ps256(h);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 4-bit values dequantize through a 16-entry table s * [0..15] + b and
  // vpermps, which uses only the low 4 bits of each index: one permute per
  // vector instead of a mask, a conversion and an FMA. The table entries are
  // the same fma(q, s, b) values the arithmetic would give.
  struct Tab4 {
    T t;
  };
  QMM_FN static inline Tab4 table4(T s, T b) {
    const T iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return {_mm512_fmadd_ps(iota, s, b)};
  }
  QMM_FN static inline void dequant4(const uint8_t* p, const Tab4& tab, T& lo, T& hi) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(b, tab.t);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), tab.t);
  }
  QMM_FN static inline T unpack8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  QMM_FN static inline T from_halves(__m256i h, bool bf16) {
    if (!bf16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  QMM_FN static inline T load_halves(const uint16_t* src, bool bf16) {
    return from_halves(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), bf16);
  }
  QMM_FN static inline void convert_halves(const uint16_t* src, int n, bool bf16, float* dst) {
    int i = 0;
    for (; i + W <= n; i += W)
      _mm512_storeu_ps(dst + i, from_halves(_mm256_loadu_si256(
                                                reinterpret_cast<const __m256i*>(src + i)),
                                            bf16));
    if (i < n) {  // a masked load never reads past the array; `dst` has room
      const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_storeu_ps(dst + i, from_halves(_mm256_maskz_loadu_epi16(mask, src + i), bf16));
    }
  }

  // Int8 activations, 8-bit weights: a chunk is two blocks of 32, one zmm
  // of bytes; lanes 0-7 hold block 0, 8-15 block 1. (4-bit weights take
  // the split-nibble chunks, q8s_* below.)
  static constexpr int Q8_BLOCKS = 2;
  // 6 x 4 accumulators; the rest hold weights, scales and products.
  static constexpr int Q8_MR = 6;
  template <int BITS, bool HALF>
  QMM_Q8_FN static inline __m512i q8_load(const uint8_t* p) {
    static_assert(BITS == 8, "4-bit weights run q8s_load");
    if constexpr (HALF) {
      return _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    } else {
      return _mm512_loadu_si512(p);
    }
  }
  // u8 x s8 -> s32 with no intermediate saturation.
  template <int BITS>
  QMM_Q8_FN static inline T q8_dot(__m512i w, const int8_t* x, const int32_t*) {
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x)));
  }
  // The int8 GEMM (see qmm_impl.h): 4 rows of x x 32 columns, int32 and
  // f32 accumulators for each.
  static constexpr int Q8G_MR = 4;
  using I = __m512i;
  QMM_Q8_FN static inline I q8g_zero() { return _mm512_setzero_si512(); }
  QMM_Q8_FN static inline I q8g_load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  QMM_Q8_FN static inline I q8g_dot(I acc, I w, int32_t x4) {
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4));
  }
  QMM_Q8_FN static inline I q8g_add(I a, I b) { return _mm512_add_epi32(a, b); }
  QMM_Q8_FN static inline T q8g_float(I a) { return _mm512_cvtepi32_ps(a); }
  QMM_Q8_FN static inline void q8g_store(uint8_t* p, I v) { _mm512_storeu_si512(p, v); }
  // out[t] lane j = 32-bit word t of the 16 bytes at src[j] + off: the
  // panel's quads of 16 columns, one column per lane, by a 16 x 4 word
  // transpose (lanes of 128 bits hold columns c, 4 + c, 8 + c, 12 + c).
  QMM_Q8_FN static inline void q8g_words16(const uint8_t* const* src, size_t off, I (&out)[4]) {
    auto at = [&](int j) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[j] + off));
    };
    I y[4];
    for (int c = 0; c < 4; ++c) {
      const I v = _mm512_inserti32x4(_mm512_castsi128_si512(at(c)), at(4 + c), 1);
      y[c] = _mm512_inserti32x4(_mm512_inserti32x4(v, at(8 + c), 2), at(12 + c), 3);
    }
    const I t0 = _mm512_unpacklo_epi32(y[0], y[1]), t1 = _mm512_unpackhi_epi32(y[0], y[1]);
    const I t2 = _mm512_unpacklo_epi32(y[2], y[3]), t3 = _mm512_unpackhi_epi32(y[2], y[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
  }
  // Each byte's low / high nibble.
  QMM_Q8_FN static inline I q8g_low4(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
  QMM_Q8_FN static inline I q8g_high4(I v) { return q8g_low4(_mm512_srli_epi32(v, 4)); }
  // 16 floats, lane j from base[idx[j]].
  QMM_Q8_FN static inline T q8g_gather(const float* base, const int32_t* idx) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(idx), base, 4);
  }
  // x's quantization for the int8 path, 16 values at a time: the same
  // operations per value as qmm.cc's portable code (IEEE division,
  // multiply, truncation, exact remainder), so the same bytes. Scalar, it
  // took about as long as the int8 GEMM itself.
  QMM_FN static inline __m512i q8_quantize16(__m512 v, float id) {
    const __m512 f = _mm512_mul_ps(v, _mm512_set1_ps(id));
    const __m512 t = _mm512_roundscale_ps(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 rest = _mm512_sub_ps(f, t);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i q = _mm512_cvttps_epi32(t);
    q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(rest, _mm512_set1_ps(0.5f), _CMP_GE_OQ), q,
                              one);
    return _mm512_mask_sub_epi32(q, _mm512_cmp_ps_mask(rest, _mm512_set1_ps(-0.5f), _CMP_LE_OQ),
                                 q, one);
  }
  QMM_FN static int32_t q8_quantize_block(const float* x, bool nibble_order, int8_t* dst,
                                          float* d_out) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512i lo = q8_quantize16(a, id), hi = q8_quantize16(b, id);
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi));
    if (nibble_order) {
      const __m512i even =
          _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
      const __m512i e = _mm512_permutex2var_epi32(lo, even, hi);
      hi = _mm512_permutex2var_epi32(lo, odd, hi);
      lo = e;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(hi));
    *d_out = d;
    return sum;
  }
  // Split-nibble chunks (4-bit weights; x in the Q8Split layout): four
  // blocks, one per 128-bit lane. A block's two nibbles go to two vectors
  // in the same lanes, so both `vpdpbusd` add into one int32 lane per 4
  // values of a block and the conversion, scaling and FMA run once per
  // 128 values (per 64 in the chunks above).
  static constexpr int Q8S_BLOCKS = 4;
  struct Nibbles {
    __m512i lo, hi;
  };
  // `n` < 4 blocks: the rest of the chunk is zero (masked, never read).
  QMM_Q8_FN static inline Nibbles q8s_load(const uint8_t* p, int n) {
    const __mmask16 blocks = static_cast<__mmask16>((1u << (4 * n)) - 1);
    const __m512i raw = n == 4 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(blocks, p);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    return {_mm512_and_si512(raw, low4), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4)};
  }
  // x: the chunk's 64 even-k bytes, then its 64 odd-k bytes.
  QMM_Q8_FN static inline T q8s_dot(const Nibbles& w, const int8_t* x) {
    const __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.lo, _mm512_loadu_si512(x));
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(acc, w.hi, _mm512_loadu_si512(x + 64)));
  }
  // Lanes 4L..4L+3: the scale of block L, s[g + L * 32 / GROUP] (n blocks).
  template <int GROUP>
  QMM_Q8_FN static inline T q8s_wscale(const float* s, int g, int n) {
    if constexpr (GROUP == 128) {
      return _mm512_set1_ps(s[g]);
    } else {
      constexpr int per = GROUP / 32;  // blocks per group
      const int groups = (n + per - 1) / per;
      const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << groups) - 1), s + g);
      const __m512i idx =
          per == 1 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                   : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
      return _mm512_permutexvar_ps(idx, v);
    }
  }
  template <int GROUP, bool HALF>
  QMM_Q8_FN static inline T q8_wscale(const float* s, int g) {
    if constexpr (GROUP == 32 && !HALF) {
      return _mm512_insertf32x8(_mm512_set1_ps(s[g]), _mm256_set1_ps(s[g + 1]), 1);
    } else {
      return _mm512_set1_ps(s[g]);
    }
  }
};

}  // namespace
}  // namespace mlxrt::qmm::avx512

#include "mlxrt/src/mlx/qmm_impl.h"

namespace mlxrt::qmm {
const Kernels* kernels_avx512() { return &avx512::kKernels; }
}  // namespace mlxrt::qmm

#else
namespace mlxrt::qmm {
const Kernels* kernels_avx512() { return nullptr; }
}  // namespace mlxrt::qmm
#endif
