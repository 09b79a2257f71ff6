// The float attention kernel (fattn.cc), compiled once per instruction set
// next to the quantized-KV one: qsdpa_kernels.cc includes this right after
// each qsdpa_impl.h, inside whose namespace it reuses the vector type `V`,
// the mask (`apply_mask`) and the vectorized softmax row (`exp_row`).
//
// One chunk (rows m of one (b, kv head), keys [t0, t1)) as the quantized
// kernel does it, with keys and values read as rows of `E` (float, or
// uint16_t holding f16 bits: a cache stored as f16, widened on load):
//  1. scores: with transposed keys (prefill), an MR x 2W register tile per
//     2W keys; else (decode: few rows, keys read once) MR dot products
//     q_m . k_t per key in registers (q already scaled), up to 4 rows for
//     four keys at a time with one horizontal sum per row and group;
//  2. the mask (causal and window bounds computed, never read), per row max,
//     exp(s - max) in place and their sum;
//  3. values: per slice of 2 vectors of the value dimension, every value row
//     of the chunk added into MR x 2 accumulators with weight p[m][t].

#define QS_UNROLL _Pragma("GCC unroll 32")

namespace mlxrt::qsdpa::QS_NS {
namespace {

// Decode reads each key and value row once, straight from DRAM, one short
// stream per (row, head); the hardware prefetchers do not keep ahead of it
// (the loads stalled two thirds of the kernel's cycles at batch 32). Into L2
// (prefetcht1), as the quantized matmul's decode tiles do (qmm_impl.h,
// kPrefetchLocality): more misses in flight than L1 keeps. The distance is
// ~4 KiB of rows, at least 8 rows: 8 rows of 64 f16 values (1 KiB) arrived
// late (Zen 4, f16 cache: decode after a 4,096-token prompt 1.09x with 32
// rows; f32 caches were level at 8 and 16; docs/cpu-kernels.md 1e). A chunk
// requests its own first rows as it starts and nothing past its last row
// (at short contexts those bytes would be a tenth of the reads).
constexpr int kPrefetchBytes = 4096;
template <typename E>
QS_FN inline int prefetch_distance(int D) {
  const int rows = kPrefetchBytes / (D * static_cast<int>(sizeof(E)));
  return rows > 8 ? rows : 8;
}
template <typename E>
QS_FN inline void prefetch_row(const E* r, int D) {
  const char* c = reinterpret_cast<const char*>(r);
  for (size_t i = 0; i < D * sizeof(E); i += 64) __builtin_prefetch(c + i, 0, 2);
}
// Rows [t0, min(t1, t0 + ahead)) of `rows` (D elements each): a chunk's head.
// (always_inline: GCC drops a call to a function that only prefetches.)
template <typename E>
QS_FN __attribute__((always_inline)) inline void prefetch_head(const E* rows, int D, int t0,
                                                               int t1, int ahead) {
  const int end = t1 < t0 + ahead ? t1 : t0 + ahead;
  for (int t = t0; t < end; ++t) prefetch_row(rows + static_cast<size_t>(t) * D, D);
}

// s[m][t - t0] = q_m . k_t for MR rows (S rows kChunk apart). Up to 4 rows
// (decode: the query heads of one KV head) four keys run side by side and
// one `hsum4` per row sums their accumulators: a horizontal sum per row and
// key cost more than the key's multiply-adds (the scores took 1.6x the
// values' time over the same bytes; see docs/cpu-kernels.md 1e). A group
// past t1 repeats key t1 - 1 and writes up to 3 scores past the chunk's end
// (the rows have kChunk room, a multiple of 4; nothing reads them). Each
// score is summed in the same order wherever its key falls in a group.
static_assert(kChunk % 4 == 0, "float_scores writes whole groups of 4 scores");

template <int MR, typename E>
QS_FN void float_scores(const Problem& p, const float* q, int b, int h, int t0, int t1,
                        float* S) {
  const int D = p.k.dim;
  const E* k = reinterpret_cast<const E*>(p.k.w_at(b, h));
  const int ahead = prefetch_distance<E>(D);
  prefetch_head(k, D, t0, t1, ahead);
  if constexpr (MR <= 4) {
    for (int t = t0; t < t1; t += 4) {
      const E* kr[4];
      QS_UNROLL
      for (int j = 0; j < 4; ++j) {
        kr[j] = k + static_cast<size_t>(t + j < t1 ? t + j : t1 - 1) * D;
        if (t + j + ahead < t1) prefetch_row(kr[j] + static_cast<size_t>(ahead) * D, D);
      }
      T acc[MR][4];
      QS_UNROLL
      for (int m = 0; m < MR; ++m)
        QS_UNROLL
        for (int j = 0; j < 4; ++j) acc[m][j] = V::zero();
      for (int i = 0; i < D; i += W) {
        T kv[4];
        QS_UNROLL
        for (int j = 0; j < 4; ++j) kv[j] = V::load(kr[j] + i);
        QS_UNROLL
        for (int m = 0; m < MR; ++m) {
          const T qm = V::load(q + m * D + i);
          QS_UNROLL
          for (int j = 0; j < 4; ++j) acc[m][j] = V::fma(qm, kv[j], acc[m][j]);
        }
      }
      QS_UNROLL
      for (int m = 0; m < MR; ++m) V::hsum4(acc[m], S + m * kChunk + (t - t0));
    }
    return;
  }
  for (int t = t0; t < t1; ++t) {
    const E* kr = k + static_cast<size_t>(t) * D;
    if (t + ahead < t1) prefetch_row(kr + static_cast<size_t>(ahead) * D, D);
    T acc[MR];
    QS_UNROLL
    for (int m = 0; m < MR; ++m) acc[m] = V::zero();
    for (int i = 0; i < D; i += W) {
      const T kv = V::load(kr + i);
      QS_UNROLL
      for (int m = 0; m < MR; ++m) acc[m] = V::fma(V::load(q + m * D + i), kv, acc[m]);
    }
    QS_UNROLL
    for (int m = 0; m < MR; ++m) S[m * kChunk + (t - t0)] = V::hsum(acc[m]);
  }
}

// The same from transposed keys, 2W keys at a time: per d, MR broadcasts
// of q[m][d] times two key vectors (a register tile like a matmul's, no
// horizontal sums). Writes up to 2W - 1 scores past t1 (the rows have
// kChunk room, a multiple of 2W; exp_row and values never read them).
template <int MR>
QS_FN void float_scores_t(const Problem& p, const float* q, int b, int h, int t0, int t1,
                          float* S) {
  const int D = p.k.dim;
  const int64_t n = p.kt_len;
  const float* kt = p.keys_t + (static_cast<size_t>(b) * p.H + h) * D * n;
  for (int t = t0; t < t1; t += 2 * W) {
    T a[MR][2];
    QS_UNROLL
    for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = V::zero();
    const float* kd = kt + t;
    for (int d = 0; d < D; ++d, kd += n) {
      const T k0 = V::load(kd), k1 = V::load(kd + W);
      QS_UNROLL
      for (int m = 0; m < MR; ++m) {
        const T qm = V::set1(q[m * D + d]);
        a[m][0] = V::fma(qm, k0, a[m][0]);
        a[m][1] = V::fma(qm, k1, a[m][1]);
      }
    }
    QS_UNROLL
    for (int m = 0; m < MR; ++m) {
      V::store(S + m * kChunk + (t - t0), a[m][0]);
      V::store(S + m * kChunk + (t - t0) + W, a[m][1]);
    }
  }
}

// acc[m][d0, d0 + NV * W) = sum_t P[m][t - t0] * V_t[d0, ...) for MR rows.
template <int MR, int NV, typename E>
QS_FN void float_values_slice(const E* v, int D, int d0, int t0, int t1, const float* P,
                              float* acc) {
  T a[MR][NV];
  QS_UNROLL
  for (int m = 0; m < MR; ++m)
    QS_UNROLL
    for (int j = 0; j < NV; ++j) a[m][j] = V::zero();
  // The first slice fetches whole rows ahead; later slices find them in cache.
  const int ahead = prefetch_distance<E>(D);
  if (d0 == 0) prefetch_head(v, D, t0, t1, ahead);
  for (int t = t0; t < t1; ++t) {
    const E* vr = v + static_cast<size_t>(t) * D + d0;
    if (d0 == 0 && t + ahead < t1) prefetch_row(vr + static_cast<size_t>(ahead) * D, D);
    T vv[NV];
    QS_UNROLL
    for (int j = 0; j < NV; ++j) vv[j] = V::load(vr + j * W);
    QS_UNROLL
    for (int m = 0; m < MR; ++m) {
      const T pm = V::set1(P[m * kChunk + (t - t0)]);
      QS_UNROLL
      for (int j = 0; j < NV; ++j) a[m][j] = V::fma(pm, vv[j], a[m][j]);
    }
  }
  QS_UNROLL
  for (int m = 0; m < MR; ++m)
    QS_UNROLL
    for (int j = 0; j < NV; ++j) V::store(acc + m * D + d0 + j * W, a[m][j]);
}

template <int MR, typename E>
QS_FN void float_values(const Problem& p, int b, int h, int t0, int t1, const float* P,
                        float* acc) {
  const int D = p.v.dim;
  const E* v = reinterpret_cast<const E*>(p.v.w_at(b, h));
  int d0 = 0;
  for (; d0 + 2 * W <= D; d0 += 2 * W) float_values_slice<MR, 2>(v, D, d0, t0, t1, P, acc);
  if (d0 < D) float_values_slice<MR, 1>(v, D, d0, t0, t1, P, acc);
}

template <int MR, typename E>
QS_FN void float_chunk_rows(const Problem& p, int b, int h, int m0, int t0, int t1, float* S,
                            float* acc, float* mx, float* sum) {
  const float* q = p.q + (static_cast<size_t>(b * p.H + h) * p.M + m0) * p.k.dim;
  if (p.keys_t) {
    float_scores_t<MR>(p, q, b, h, t0, t1, S);
  } else {
    float_scores<MR, E>(p, q, b, h, t0, t1, S);
  }
  for (int m = 0; m < MR; ++m) {
    float* s = S + m * kChunk;
    apply_mask(p, b, h, m0 + m, t0, t1 - t0, s);
    mx[m] = exp_row(s, t1 - t0, sum[m]);
  }
  float_values<MR, E>(p, b, h, t0, t1, S, acc);
}

// Runtime row count -> compile-time tile height.
template <typename E, int MR = V::MR>
QS_FN void float_rows(const Problem& p, int b, int h, int m0, int rows, int t0, int t1,
                      float* S, float* acc, float* mx, float* sum) {
  if constexpr (MR > 1) {
    if (rows < MR) return float_rows<E, MR - 1>(p, b, h, m0, rows, t0, t1, S, acc, mx, sum);
  }
  float_chunk_rows<MR, E>(p, b, h, m0, t0, t1, S, acc, mx, sum);
}

template <typename E>
QS_FN void float_chunk(const Problem& p, int b, int h, int m0, int rows, int t0, int t1,
                       float* scratch, float* acc, float* mx, float* sum) {
  float_rows<E>(p, b, h, m0, rows, t0, t1, scratch, acc, mx, sum);
}

const Kernels kFloatKernels{QS_ISA, W, V::MR, &float_chunk<float>};
const Kernels kHalfKernels{QS_ISA, W, V::MR, &float_chunk<uint16_t>};

}  // namespace
}  // namespace mlxrt::qsdpa::QS_NS

namespace mlxrt::fattn::QS_NS {
const qsdpa::Kernels* kernels(bool f16) {
  return f16 ? &qsdpa::QS_NS::kHalfKernels : &qsdpa::QS_NS::kFloatKernels;
}
}  // namespace mlxrt::fattn::QS_NS

#undef QS_UNROLL
