// The quantized-KV attention kernel, written once over a small vector
// abstraction and compiled once per instruction set (like qmm_impl.h). Not a
// normal header: qsdpa_kernels.cc includes it after defining
//   QS_NS   the namespace of this variant, QS_FN its function attributes,
//   QS_ISA  its `Isa` value,
// and, inside mlxrt::qsdpa::QS_NS, a struct `V` with:
//   T, W                      the vector type and its f32 lanes
//   MR                        query rows per register tile at most
//   zero, load, store, set1, fma(a, b, c) = a * b + c, max, hsum, hmax
//   exp(a)                    e^a (relative error ~1e-7; 0 below -88)
//   Tab4, table4(s, b), dequant4(p, tab, lo, hi), unpack8(p): as in qmm_impl.h
//
// Shape of one chunk (rows m of one (b, kv head), keys [t0, t1)):
//  1. scores: each key row is dequantized in registers, one packed block at a
//     time, and multiplied into MR accumulators (one per query row), summed
//     horizontally (per key, or per four keys up to 4 rows):
//     s[m][t] = q_m . k_t (q already scaled);
//  2. the mask, then per row max, exp(s - max) in place and their sum;
//  3. values: for each 2-vector slice of the value dimension, every value row
//     of the chunk is dequantized and added into MR x 2 accumulators with
//     weight p[m][t]; the chunk's rows stay in L1/L2 across slices.
// Dequantized values are fma(q, scale, bias) in f32 like MLX's kernels;
// everything accumulates in f32. Internal linkage, no standard library.

#define QS_UNROLL _Pragma("GCC unroll 32")

namespace mlxrt::qsdpa::QS_NS {
namespace {

using T = V::T;
constexpr int W = V::W;
// mx.finfo(mx.float32).min: what a false bool mask entry makes of a score.
constexpr float kMinF32 = -3.40282347e+38f;

// Values one W-byte packed block holds: 2W at 4 bits (low nibbles = even
// values), W at 8 bits.
template <int BITS>
constexpr int kBlock = BITS == 4 ? 2 * W : W;

QS_FN inline int log2_i(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// Dequantizes one packed block (kBlock<BITS> values of one group).
template <int BITS>
QS_FN inline void dequant(const uint8_t* p, float s, float b, T* out) {
  if constexpr (BITS == 4) {
    V::dequant4(p, V::table4(V::set1(s), V::set1(b)), out[0], out[1]);
  } else {
    out[0] = V::fma(V::unpack8(p), V::set1(s), V::set1(b));
  }
}

// s[m][t - t0] = q_m . k_t for MR rows (S rows kChunk apart). Up to 4 rows
// (decode: the query heads of one KV head) four keys run side by side with
// one `hsum4` per row, as the float kernel's scores do (fattn_impl.h, where
// the horizontal sums cost more than a key's multiply-adds); a group past t1
// repeats key t1 - 1 and writes up to 3 scores past the chunk's end, into
// the rows' kChunk room.
template <int BITS, int MR>
QS_FN void scores(const Problem& p, const float* q, int b, int h, int t0, int t1, float* S) {
  constexpr int NV = BITS == 4 ? 2 : 1;
  const int D = p.k.dim, blocks = D / kBlock<BITS>, gpr = D / p.group;
  const int gshift = log2_i(p.group);
  const size_t rb = static_cast<size_t>(D) * BITS / 8;
  const uint8_t* w = p.k.w_at(b, h);
  const float* sc = p.k.s_at(b, h);
  const float* bi = p.k.b_at(b, h);
  if constexpr (MR <= 4) {
    for (int t = t0; t < t1; t += 4) {
      int tj[4];
      QS_UNROLL
      for (int j = 0; j < 4; ++j) tj[j] = t + j < t1 ? t + j : t1 - 1;
      T acc[MR][4];
      QS_UNROLL
      for (int m = 0; m < MR; ++m)
        QS_UNROLL
        for (int j = 0; j < 4; ++j) acc[m][j] = V::zero();
      for (int i = 0; i < blocks; ++i) {
        const int g = (i * kBlock<BITS>) >> gshift;
        QS_UNROLL
        for (int j = 0; j < 4; ++j) {
          const size_t r = static_cast<size_t>(tj[j]);
          T wv[NV];
          dequant<BITS>(w + r * rb + i * W, sc[r * gpr + g], bi[r * gpr + g], wv);
          QS_UNROLL
          for (int v = 0; v < NV; ++v)
            QS_UNROLL
            for (int m = 0; m < MR; ++m)
              acc[m][j] = V::fma(V::load(q + m * D + i * kBlock<BITS> + v * W), wv[v], acc[m][j]);
        }
      }
      QS_UNROLL
      for (int m = 0; m < MR; ++m) V::hsum4(acc[m], S + m * kChunk + (t - t0));
    }
    return;
  }
  for (int t = t0; t < t1; ++t) {
    const uint8_t* wr = w + t * rb;
    const float* sr = sc + static_cast<size_t>(t) * gpr;
    const float* br = bi + static_cast<size_t>(t) * gpr;
    T acc[MR];
    QS_UNROLL
    for (int m = 0; m < MR; ++m) acc[m] = V::zero();
    for (int i = 0; i < blocks; ++i) {
      const int g = (i * kBlock<BITS>) >> gshift;
      T wv[NV];
      dequant<BITS>(wr + i * W, sr[g], br[g], wv);
      QS_UNROLL
      for (int v = 0; v < NV; ++v)
        QS_UNROLL
        for (int m = 0; m < MR; ++m)
          acc[m] = V::fma(V::load(q + m * D + i * kBlock<BITS> + v * W), wv[v], acc[m]);
    }
    QS_UNROLL
    for (int m = 0; m < MR; ++m) S[m * kChunk + (t - t0)] = V::hsum(acc[m]);
  }
}

// Applies row m's mask to its n scores from key t0.
QS_FN void apply_mask(const Problem& p, int b, int h, int m, int t0, int n, float* s) {
  switch (p.mask) {
    case MaskKind::None: return;
    case MaskKind::Causal: {
      const int first = p.causal_last(m) + 1 - t0;  // first masked, relative
      for (int j = first < 0 ? 0 : first; j < n; ++j) s[j] = kMinF32;
      for (int j = 0, e = p.causal_first(m) - t0; j < e && j < n; ++j) s[j] = kMinF32;
      return;
    }
    case MaskKind::Bool:
    case MaskKind::Additive: {
      const int64_t* st = p.mask_stride;
      const int64_t off = b * st[0] + h * st[1] + (m % p.L) * st[2] + t0 * st[3];
      if (p.mask == MaskKind::Bool) {
        const uint8_t* mk = static_cast<const uint8_t*>(p.mask_data) + off;
        for (int j = 0; j < n; ++j)
          if (!mk[j * st[3]]) s[j] = kMinF32;
      } else {
        const float* mk = static_cast<const float*>(p.mask_data) + off;
        for (int j = 0; j < n; ++j) s[j] += mk[j * st[3]];
      }
      return;
    }
  }
}

// In place: s[j] = exp(s[j] - max) over n scores (padded with -inf to whole
// vectors; the row has kChunk room). Returns the max; `sum` gets the sum.
QS_FN float exp_row(float* s, int n, float& sum) {
  const int padded = (n + W - 1) / W * W;
  for (int j = n; j < padded; ++j) s[j] = -__builtin_inff();
  T mv = V::load(s);
  for (int j = W; j < padded; j += W) mv = V::max(mv, V::load(s + j));
  const float mx = V::hmax(mv);
  const T mvec = V::set1(mx);
  T acc = V::zero();
  for (int j = 0; j < padded; j += W) {
    const T e = V::exp(V::sub(V::load(s + j), mvec));
    V::store(s + j, e);
    acc = V::add(acc, e);
  }
  sum = V::hsum(acc);
  return mx;
}

// acc[m][:] = sum_t P[m][t - t0] * dequant(V_t) for MR rows.
template <int BITS, int MR>
QS_FN void values(const Problem& p, int b, int h, int t0, int t1, const float* P, float* acc) {
  const int D = p.v.dim, gpr = D / p.group;
  const int gshift = log2_i(p.group);
  const size_t rb = static_cast<size_t>(D) * BITS / 8;
  const uint8_t* w = p.v.w_at(b, h);
  const float* sc = p.v.s_at(b, h);
  const float* bi = p.v.b_at(b, h);
  // Slices of 2W values: one 4-bit block, or two 8-bit blocks (of one group:
  // 2W <= 32 <= group).
  for (int d0 = 0; d0 < D; d0 += 2 * W) {
    const int g = d0 >> gshift;
    const uint8_t* wd = w + static_cast<size_t>(d0) * BITS / 8;
    T a[MR][2];
    QS_UNROLL
    for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = V::zero();
    for (int t = t0; t < t1; ++t) {
      const uint8_t* wr = wd + t * rb;
      const float s = sc[static_cast<size_t>(t) * gpr + g];
      const float bb = bi[static_cast<size_t>(t) * gpr + g];
      T vv[2];
      if constexpr (BITS == 4) {
        dequant<4>(wr, s, bb, vv);
      } else {
        dequant<8>(wr, s, bb, vv);
        dequant<8>(wr + W, s, bb, vv + 1);
      }
      QS_UNROLL
      for (int m = 0; m < MR; ++m) {
        const T pm = V::set1(P[m * kChunk + (t - t0)]);
        a[m][0] = V::fma(pm, vv[0], a[m][0]);
        a[m][1] = V::fma(pm, vv[1], a[m][1]);
      }
    }
    QS_UNROLL
    for (int m = 0; m < MR; ++m) {
      V::store(acc + m * D + d0, a[m][0]);
      V::store(acc + m * D + d0 + W, a[m][1]);
    }
  }
}

template <int BITS, int MR>
QS_FN void chunk_rows(const Problem& p, int b, int h, int m0, int t0, int t1, float* S,
                      float* acc, float* mx, float* sum) {
  const float* q = p.q + (static_cast<size_t>(b * p.H + h) * p.M + m0) * p.k.dim;
  scores<BITS, MR>(p, q, b, h, t0, t1, S);
  for (int m = 0; m < MR; ++m) {
    float* s = S + m * kChunk;
    apply_mask(p, b, h, m0 + m, t0, t1 - t0, s);
    mx[m] = exp_row(s, t1 - t0, sum[m]);
  }
  values<BITS, MR>(p, b, h, t0, t1, S, acc);
}

// Runtime row count -> compile-time tile height.
template <int BITS, int MR = V::MR>
QS_FN void rows_dispatch(const Problem& p, int b, int h, int m0, int rows, int t0, int t1,
                         float* S, float* acc, float* mx, float* sum) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return rows_dispatch<BITS, MR - 1>(p, b, h, m0, rows, t0, t1, S, acc, mx, sum);
  }
  chunk_rows<BITS, MR>(p, b, h, m0, t0, t1, S, acc, mx, sum);
}

QS_FN void chunk(const Problem& p, int b, int h, int m0, int rows, int t0, int t1,
                 float* scratch, float* acc, float* mx, float* sum) {
  if (p.bits == 4) {
    rows_dispatch<4>(p, b, h, m0, rows, t0, t1, scratch, acc, mx, sum);
  } else {
    rows_dispatch<8>(p, b, h, m0, rows, t0, t1, scratch, acc, mx, sum);
  }
}

const Kernels kKernels{QS_ISA, W, V::MR, &chunk};

}  // namespace
}  // namespace mlxrt::qsdpa::QS_NS

#undef QS_UNROLL
