// The TurboQuant KV attention kernel (tqsdpa_kernels.h), written once with
// GCC vector extensions over qsdpa_impl.h's vector struct `V` and compiled
// once per instruction set: qsdpa_kernels.cc includes it right after
// qsdpa_impl.h inside each variant's section (same QS_NS / QS_FN / QS_ISA),
// so it reuses that variant's V, `apply_mask` and `exp_row`.
//
// Shape of one chunk (rows m of one (b, kv head), keys [t0, t1)):
//  0. the chunk's f16 key scales, zeros and value scales to f32 (exact);
//  1. scores: each key row decoded in registers, W coordinates at a time, as
//     (q + z) * s (turbo.rs's decode, bit for bit) and multiplied into MR
//     accumulators, summed horizontally once per key;
//  2. mask, per row max, exp(s - max) in place and the sum (qsdpa's steps);
//  3. values: for each 2W-slice of the (rotated) value dimension, every
//     value row's indices are unpacked in registers, looked up in the
//     codebook (a register permute) and added into MR x 2 accumulators with
//     weight p[m][t] * r[t] (the RMS scale of the slice's group).
// Everything accumulates in f32.

#define TQ_UNROLL _Pragma("GCC unroll 32")

namespace mlxrt::qsdpa::QS_NS {
namespace {

typedef int32_t TI __attribute__((vector_size(sizeof(T))));
typedef uint32_t TU __attribute__((vector_size(sizeof(T))));
typedef uint16_t TH __attribute__((vector_size(2 * W)));

// f16 bits -> f32, exact for finite values: the magnitude's bits shifted
// into f32 position are the value times 2^-112 (normal and subnormal alike).
QS_FN inline float half1(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h & 0x7fff) << 13;
  float f;
  __builtin_memcpy(&f, &u, 4);
  f *= 0x1p112f;
  __builtin_memcpy(&u, &f, 4);
  u |= static_cast<uint32_t>(h & 0x8000) << 16;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

QS_FN void halves_to_f32(const uint8_t* src, int n, float* out) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + W <= n; i += W) {
    TH v;
    __builtin_memcpy(&v, h + i, sizeof(v));
    const TU u = __builtin_convertvector(v, TU);
    const T mag = (T)((u & 0x7fff) << 13);
    V::store(out + i, (T)((TU)(mag * V::set1(0x1p112f)) | ((u & 0x8000) << 16)));
  }
  for (; i < n; ++i) out[i] = half1(h[i]);
}

// Indices [p0, p0 + W) of a row of B-bit LSB-first indices (B <= 4: every
// 8 indices are one B-byte little-endian word); p0 a multiple of min(W, 8).
template <int B>
QS_FN inline TI indices(const uint8_t* row, int p0) {
  constexpr int NW = W >= 8 ? W / 8 : 1;
  TU w = {};
  TQ_UNROLL
  for (int j = 0; j < NW; ++j) {
    // Byte by byte in registers (a B-byte memcpy goes through the stack
    // and stalls store forwarding).
    const uint8_t* p = row + (p0 / 8 + j) * B;
    uint32_t x = 0;
    TQ_UNROLL
    for (int i = 0; i < B; ++i) x |= static_cast<uint32_t>(p[i]) << (8 * i);
    w[j] = x >> (B * (p0 % 8));
  }
  TI sel, sh;
  TQ_UNROLL
  for (int i = 0; i < W; ++i) {
    sel[i] = i / 8;
    sh[i] = B * (i % 8);
  }
  return (TI)((__builtin_shuffle(w, sel) >> (TU)sh) & ((1u << B) - 1));
}

// The codebook in registers: first W and next W centroids.
struct Book {
  T lo, hi;
  const float* all;
};

template <int B>
QS_FN inline T centroids(const Book& bk, TI idx) {
  if constexpr ((1 << B) <= W) {
    return __builtin_shuffle(bk.lo, idx);
  } else if constexpr ((1 << B) <= 2 * W) {
    return __builtin_shuffle(bk.lo, bk.hi, idx);
  } else {
    T r;
    TQ_UNROLL
    for (int i = 0; i < W; ++i) r[i] = bk.all[idx[i]];
    return r;
  }
}

// W decoded key coordinates from d (one 32-group: scale s, zero z).
template <int KB>
QS_FN inline T key(const uint8_t* row, int d, T z, T s) {
  T x;
  if constexpr (KB == 8) {
    // int8 as the unsigned byte's value, minus 256 from 128 up (exact): GCC
    // turned a conversion of an int8 vector into 16 scalar sign extensions.
    const T u = V::unpack8(row + d);
    const TI neg = u >= V::set1(128.0f);
    x = u - (T)(neg & (TI)V::set1(256.0f));
  } else {
    x = __builtin_convertvector(indices<KB>(row, d), T);
  }
  return (x + z) * s;
}

// s[m][t - t0] = q_m . k_t for MR rows (S rows kChunk apart).
template <int KB, int MR>
QS_FN void turbo_scores(const TurboProblem& p, const float* q, int b, int h, int t0, int t1,
                        const float* ks, const float* kz, float* S) {
  const int D = p.D, G = D / 32;
  for (int t = t0; t < t1; ++t) {
    const uint8_t* row = p.k_idx.at(b, h, t);
    const float* s = ks + (t - t0) * G;
    const float* z = kz + (t - t0) * G;
    T acc[MR];
    TQ_UNROLL
    for (int m = 0; m < MR; ++m) acc[m] = V::zero();
    for (int g = 0; g < G; ++g) {
      const T sv = V::set1(s[g]), zv = V::set1(z[g]);
      TQ_UNROLL
      for (int i = 0; i < 32 / W; ++i) {
        const int d = g * 32 + i * W;
        const T k = key<KB>(row, d, zv, sv);
        TQ_UNROLL
        for (int m = 0; m < MR; ++m) acc[m] = V::fma(V::load(q + m * D + d), k, acc[m]);
      }
    }
    TQ_UNROLL
    for (int m = 0; m < MR; ++m) S[m * kChunk + (t - t0)] = V::hsum(acc[m]);
  }
}

// acc[m][:] = sum_t P[m][t - t0] * r_t * book[idx_t] for MR rows.
template <int VB, int MR>
QS_FN void turbo_values(const TurboProblem& p, int b, int h, int t0, int t1, const float* P,
                        const float* vs, float* acc) {
  const int D = p.Dv, G = D / 32;
  const Book bk{V::load(p.book), V::load(p.book + (W < 16 ? W : 0)), p.book};
  // Slices of 2W coordinates, inside one 32-group (2W <= 32).
  for (int d0 = 0; d0 < D; d0 += 2 * W) {
    const int g = d0 / 32;
    T a[MR][2];
    TQ_UNROLL
    for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = V::zero();
    for (int t = t0; t < t1; ++t) {
      const uint8_t* row = p.v_idx.at(b, h, t);
      const T c0 = centroids<VB>(bk, indices<VB>(row, d0));
      const T c1 = centroids<VB>(bk, indices<VB>(row, d0 + W));
      const float r = vs[(t - t0) * G + g];
      TQ_UNROLL
      for (int m = 0; m < MR; ++m) {
        const T w = V::set1(P[m * kChunk + (t - t0)] * r);
        a[m][0] = V::fma(w, c0, a[m][0]);
        a[m][1] = V::fma(w, c1, a[m][1]);
      }
    }
    TQ_UNROLL
    for (int m = 0; m < MR; ++m) {
      V::store(acc + m * D + d0, a[m][0]);
      V::store(acc + m * D + d0 + W, a[m][1]);
    }
  }
}

template <int MR>
QS_FN void turbo_tile(const TurboProblem& p, int b, int h, int m0, int t0, int t1, float* S,
                      const float* ks, const float* kz, const float* vs, float* acc, float* mx,
                      float* sum) {
  const float* q = p.q + (static_cast<size_t>(b * p.base.H + h) * p.base.M + m0) * p.D;
  switch (p.key_bits) {
    case 8: turbo_scores<8, MR>(p, q, b, h, t0, t1, ks, kz, S); break;
    case 4: turbo_scores<4, MR>(p, q, b, h, t0, t1, ks, kz, S); break;
    case 3: turbo_scores<3, MR>(p, q, b, h, t0, t1, ks, kz, S); break;
    default: turbo_scores<2, MR>(p, q, b, h, t0, t1, ks, kz, S); break;
  }
  for (int m = 0; m < MR; ++m) {
    float* s = S + m * kChunk;
    apply_mask(p.base, b, h, m0 + m, t0, t1 - t0, s);
    mx[m] = exp_row(s, t1 - t0, sum[m]);
  }
  switch (p.value_bits) {
    case 4: turbo_values<4, MR>(p, b, h, t0, t1, S, vs, acc); break;
    case 3: turbo_values<3, MR>(p, b, h, t0, t1, S, vs, acc); break;
    case 2: turbo_values<2, MR>(p, b, h, t0, t1, S, vs, acc); break;
    default: turbo_values<1, MR>(p, b, h, t0, t1, S, vs, acc); break;
  }
}

// Runtime row count -> compile-time tile height.
template <int MR = V::MR>
QS_FN void turbo_rows(const TurboProblem& p, int b, int h, int m0, int rows, int t0, int t1,
                      float* S, const float* ks, const float* kz, const float* vs, float* acc,
                      float* mx, float* sum) {
  if constexpr (MR > 1) {
    if (rows < MR) return turbo_rows<MR - 1>(p, b, h, m0, rows, t0, t1, S, ks, kz, vs, acc, mx, sum);
  }
  turbo_tile<MR>(p, b, h, m0, t0, t1, S, ks, kz, vs, acc, mx, sum);
}

QS_FN void turbo_chunk(const TurboProblem& p, int b, int h, int m0, int rows, int t0, int t1,
                       float* scratch, float* acc, float* mx, float* sum) {
  const int n = t1 - t0, gk = p.D / 32, gv = p.Dv / 32;
  float* S = scratch;
  float* ks = S + kTurboRowsMax * kChunk;
  float* kz = ks + kChunk * gk;
  float* vs = kz + kChunk * gk;
  halves_to_f32(p.k_scale.at(b, h, t0), n * gk, ks);
  halves_to_f32(p.k_zero.at(b, h, t0), n * gk, kz);
  halves_to_f32(p.v_scale.at(b, h, t0), n * gv, vs);
  turbo_rows(p, b, h, m0, rows, t0, t1, S, ks, kz, vs, acc, mx, sum);
}

static_assert(V::MR <= kTurboRowsMax, "scratch holds kTurboRowsMax score rows");
const TurboKernels kTurboKernels{QS_ISA, V::MR, &turbo_chunk};

}  // namespace
}  // namespace mlxrt::qsdpa::QS_NS

#undef TQ_UNROLL
