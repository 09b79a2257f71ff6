// The quantized-matmul kernel, written once over a small vector abstraction
// and compiled once per instruction set. Not a normal header: a kernel file
// includes it after defining
//   QMM_NS   the namespace of this variant (avx512, avx2, portable)
//   QMM_FN   attributes of every kernel function (its `target`)
//   QMM_ISA  the `Isa` value of this variant
//   QMM_Q8_FN  attributes of the int8-activation kernel (may add VNNI)
// and, inside mlxrt::qmm::QMM_NS, a struct `V` with:
//   T                         the vector type, W f32 lanes
//   MR_DIRECT, MR_GEMM        rows of x per register tile (see below)
//   NR_WIDE                   weight rows per decode tile (kPanelRows or 8)
//   DIRECT_ROWS               up to this M the direct path is used
//   zero, load, store, set1, add, fma(a, b, c) = a * b + c, hsum
//   transpose(v)              v[W] as a W x W matrix, transposed in place
//   Tab4, table4(s, b)        per-(row, group) state for 4-bit dequantization
//   dequant4(p, tab, lo, hi)  W bytes of 4-bit data -> s * q + b for the low
//                             nibbles (even k) and the high nibbles (odd k)
//   unpack8(p)                W bytes of 8-bit data as floats
//   convert_halves(src, n, bf16, dst)  n f16 (or bfloat16) values to f32
//                             (may write up to 16 floats past dst + n)
//   Q8_BLOCKS, Q8_MR, q8_*    the int8-activation path (see run_q8 below);
//                             Q8S_BLOCKS, q8s_* where the file defines QMM_Q8_SPLIT
//
// Shape of the computation. The k order inside a block of 2W values is free
// because the caller permutes x the way nibbles unpack.
//  - Few rows of x (M <= DIRECT_ROWS: decode, batched decode): a register
//    tile holds MR rows of x times NR = kPanelRows rows of w (NR_WIDE for
//    one or two rows of x, see kWideRows) as MR*NR vector accumulators
//    that run along k, summed horizontally once per k-block;
//    weights are dequantized in registers, in the layout MLX stores, and
//    used at once. With more rows than one tile holds, the rows are split
//    into near-equal groups that run one after the other on the same weight
//    tile, whose packed weights then come from L1; the loop streams w from
//    memory once. (Re-dequantizing per group costs less than a panel's
//    stores and loads at these M.)
//  - More rows (prefill): a GEMM in the BLAS shape. Per k-block, NC = 2W
//    weight rows are dequantized and transposed into a panel [k][NC] (in
//    L2), and every tile of MR_GEMM rows of x runs against it as outer
//    products: per k, one broadcast of x per row times two weight vectors,
//    MR_GEMM x 2 accumulators, nothing summed across lanes. Each x value
//    feeds 2W multiply-adds and each weight MR_GEMM, so the loop is
//    FMA-bound rather than bound by loads of x from L2.
// Both paths give every output the same bits (batch invariance: a row's
// result does not depend on the rows computed with it, so a request decodes
// the same tokens alone and in a batch). The direct path's lane l sums the
// k of its block with k % W == l in k order, and V::hsum adds the W lane
// sums as a tree that halves the lanes (l + l+W/2, then + W/4, ...). The
// GEMM path stores each k-block "class-major" (panel and x tiles: the k
// with k % W == l together, in k order) and runs W passes, one per lane
// class, each a sequence of multiply-adds into fresh accumulators; the
// passes go in bit-reversed class order, so that folding their results like
// a binary counter (a stack of log2 W tiles) is exactly hsum's tree. Both
// use the same k-blocks (kBlockK).
// Either way the dequantized weight is fma(q, scale, bias) in f32, the value
// MLX's own kernel uses, and products are accumulated in f32.
// Everything here has internal linkage and no standard-library code (see
// qmm_kernels.h for why).

// Register tiles are arrays indexed by compile-time loops; they stay in
// registers only if those loops are fully unrolled (GCC's -O2 does not).
#define QMM_UNROLL _Pragma("GCC unroll 32")

namespace mlxrt::qmm::QMM_NS {
namespace {

using T = V::T;
constexpr int W = V::W;
constexpr int NR = kPanelRows;
// Chunks of the output are multiples of the widest tile (Kernels::tile_n),
// so narrow tiles must divide it.
static_assert(V::NR_WIDE % NR == 0, "a wide tile is whole narrow tiles");
// Decode of one or two rows with rows of w of at most kWideMaxK values runs
// tiles of V::NR_WIDE weight rows: twice the independent accumulator chains,
// and per-tile work spread over twice the rows. Longer rows stay at NR: with
// 8 rows of 1536 values in flight the loads from DRAM were slower (Zen 5,
// one thread: 576 -> 1536 ~10% and the 8-bit LM head ~7% faster wide,
// 1536 -> 576 ~5% slower).
constexpr int kWideRows = 2;
constexpr int kWideMaxK = 1024;

QMM_FN inline int min_i(int a, int b) { return a < b ? a : b; }



// A weight format: bits per value and group size, fixed at compile time so
// the per-group loops unroll. A block is the W bytes one vector load of
// packed weights covers: NV vectors of W values.
template <int BITS_, int GROUP_>
struct Q {
  static constexpr int BITS = BITS_, GROUP = GROUP_;
  static constexpr int NV = BITS == 4 ? 2 : 1;
  static constexpr int BLOCK = NV * W;  // values per block
  static constexpr int BLOCKS = GROUP / BLOCK;
  static_assert(GROUP % BLOCK == 0, "group must hold whole blocks");
};

// Scales (or biases) [off, off + n) as f32: the array itself when it is f32,
// else converted into `buf` with vector loads (one scalar conversion per
// group would cost as much as the group's arithmetic at group size 32).
template <ScaleType ST>
QMM_FN inline const float* scales_f32(const void* base, size_t off, int n, float* buf) {
  if constexpr (ST == ScaleType::F32) {
    return static_cast<const float*>(base) + off;
  } else {
    V::convert_halves(static_cast<const uint16_t*>(base) + off, n, ST == ScaleType::BF16, buf);
    return buf;
  }
}

// Groups in one k-block at the smallest group size, plus room for a whole
// vector past the end (convert_halves may store one).
constexpr int kMaxGroups = kBlockK / 32 + 16;

// A symmetric format's (Problem::biases null) implied bias per group, in
// units of its scale: -2^(BITS-1).
template <int BITS>
constexpr float kImpliedZero = -static_cast<float>(1 << (BITS - 1));

// Biases [off, off + n) as f32 (see scales_f32), or without stored biases
// (a symmetric format: Problem::biases null) the implied -2^(BITS-1) * s
// for the scales `s` of the same groups, written into `buf`. A power-of-two
// multiple of a float is exact, so these are the values a stored copy holds.
// Vector multiplies: a scalar loop here cost decode ~15% (it runs per tile).
template <int BITS, ScaleType ST>
QMM_FN inline const float* biases_f32(const void* base, size_t off, int n, const float* s,
                                      float* buf) {
  if (base) return scales_f32<ST>(base, off, n, buf);
  constexpr float zero = kImpliedZero<BITS>;
  const T z = V::set1(zero);
  int i = 0;
  for (; i + W <= n; i += W) V::store(buf + i, V::mul(V::load(s + i), z));
  for (; i < n; ++i) buf[i] = zero * s[i];
  return buf;
}

// Per-(row, group) dequantization state, prepared once per group.
template <class QF>
struct GroupTab;
template <int G>
struct GroupTab<Q<4, G>> {
  V::Tab4 tab;
  QMM_FN GroupTab(float s, float b) : tab(V::table4(V::set1(s), V::set1(b))) {}
};
template <int G>
struct GroupTab<Q<8, G>> {
  T s, b;
  QMM_FN GroupTab(float s_, float b_) : s(V::set1(s_)), b(V::set1(b_)) {}
};

// Dequantizes block i of a group (packed data at `p`) into NV vectors.
template <class QF>
QMM_FN inline void dequant_block(const uint8_t* p, const GroupTab<QF>& t, int i, T* wv) {
  if constexpr (QF::BITS == 4) {
    V::dequant4(p + i * W, t.tab, wv[0], wv[1]);
  } else {
    wv[0] = V::fma(V::unpack8(p + i * W), t.s, t.b);
  }
}

// A tile's accumulators, zeroed.
template <int MR, int R>
QMM_FN inline void zero_tile(T (&acc)[MR][R]) {
  QMM_UNROLL
  for (int m = 0; m < MR; ++m)
    QMM_UNROLL
    for (int j = 0; j < R; ++j) acc[m][j] = V::zero();
}

// Writes (or adds, for later k-blocks) the horizontal sums of a tile.
template <int MR, int R>
QMM_FN inline void store_tile(const Problem& p, int m0, int n0, bool accumulate,
                              T (*acc)[R]) {
  QMM_UNROLL
  for (int m = 0; m < MR; ++m) {
    float* o = p.out + static_cast<size_t>(m0 + m) * p.N + n0;
    QMM_UNROLL
    for (int j = 0; j < R; ++j) {
      if (n0 + j >= p.N) break;  // (a constant-index loop keeps acc in registers)
      float r = V::hsum(acc[m][j]);
      o[j] = accumulate ? o[j] + r : r;
    }
  }
}

// Where the R weight rows of the tile at n0 start, and their scales and
// biases for k-block [k0, k1) as f32. Rows past N repeat the last row
// (computed, never stored) so the inner loops need no bounds checks.
template <class QF, ScaleType ST, int R = NR>
struct TileRows {
  const uint8_t* w[R];
  const float* s[R];
  const float* b[R];
  size_t row_bytes;
  // Converted scales and biases: per row at j * kMaxGroups, or the whole
  // tile's in one run.
  alignas(64) float sbuf[R * kMaxGroups];
  alignas(64) float bbuf[R * kMaxGroups];

  QMM_FN TileRows(const Problem& p, int n0, int k0, int k1) {
    row_bytes = static_cast<size_t>(p.K) * QF::BITS / 8;
    const size_t groups = static_cast<size_t>(p.K / QF::GROUP);
    const int g0 = k0 / QF::GROUP, ng = (k1 - k0) / QF::GROUP;
    // A k-block of whole rows and no row past N: the tile's scales (and
    // biases) are one contiguous run, converted in one pass rather than a
    // pass per row (the per-row passes' bookkeeping was ~a fifth of the
    // 4-bit decode kernel's time at K = 576).
    const bool whole = ng == static_cast<int>(groups) && n0 + R <= p.N;
    const float* s_all = nullptr;
    const float* b_all = nullptr;
    if (whole) {
      s_all = scales_f32<ST>(p.scales, n0 * groups, R * ng, sbuf);
      b_all = biases_f32<QF::BITS, ST>(p.biases, n0 * groups, R * ng, s_all, bbuf);
    }
    QMM_UNROLL
    for (int j = 0; j < R; ++j) {
      const size_t row = static_cast<size_t>(min_i(n0 + j, p.N - 1));
      w[j] = p.w + row * row_bytes + static_cast<size_t>(k0) * QF::BITS / 8;
      if (whole) {
        s[j] = s_all + j * ng;
        b[j] = b_all + j * ng;
      } else {
        s[j] = scales_f32<ST>(p.scales, row * groups + g0, ng, sbuf + j * kMaxGroups);
        b[j] = biases_f32<QF::BITS, ST>(p.biases, row * groups + g0, ng, s[j],
                                        bbuf + j * kMaxGroups);
      }
    }
  }
};

// The direct (decode) path prefetches weights this many rows ahead of where
// it reads: two tiles of 4 rows, one and a half of 8 (measured).
constexpr int prefetch_rows(int R) { return R <= 4 ? 2 * R : R + R / 2; }
constexpr int kPrefetchRows = prefetch_rows(NR);
// __builtin_prefetch's locality for those weights, by rows of x per tile.
// One or two rows (decode) stream the weights at the memory's pace: into L2
// (prefetcht1), whose misses the core keeps many more of in flight than
// L1's. A tile's interleaved rows read 4-8 short streams, which the
// prefetchers do not follow; into L1 (prefetcht0) that pattern read ~11
// GB/s on one Zen 4 core, into L2 ~22, a sequential read ~27
// (bench/prefetch_pattern.cc). More rows are compute-bound and keep L1 (a
// batch of 8 measured 1-2% slower with L2).
template <int MR>
constexpr int kPrefetchLocality = MR <= 2 ? 2 : 3;

// Bytes of packed weights per group.
template <class QF>
constexpr int kGroupBytes = QF::GROUP * QF::BITS / 8;

// MR rows of x from m0 against the R rows of w in `rows` (from n0),
// dequantized in registers, k in [k0, k1).
template <class QF, ScaleType ST, int R, int MR>
QMM_FN void tile_direct(const Problem& p, const TileRows<QF, ST, R>& rows, int m0, int n0,
                        int k0, int k1, bool accumulate) {
  const size_t ldx = static_cast<size_t>(p.K);
  T acc[MR][R];
  zero_tile(acc);

  const int ng = (k1 - k0) / QF::GROUP;
  for (int g = 0; g < ng; ++g) {
    const float* x = p.x + m0 * ldx + k0 + g * QF::GROUP;
    // One weight row at a time keeps few vectors live (AVX2 has 16).
    QMM_UNROLL
    for (int j = 0; j < R; ++j) {
      const uint8_t* wg = rows.w[j] + g * kGroupBytes<QF>;
      // Hardware prefetchers do not keep up with this stream from DRAM
      // (the 8-bit LM head ran ~2x faster with this line).
      __builtin_prefetch(wg + prefetch_rows(R) * rows.row_bytes, 0, kPrefetchLocality<MR>);
      const GroupTab<QF> tab(rows.s[j][g], rows.b[j][g]);
      QMM_UNROLL
      for (int i = 0; i < QF::BLOCKS; ++i) {
        T wv[QF::NV];
        dequant_block<QF>(wg, tab, i, wv);
        QMM_UNROLL
        for (int v = 0; v < QF::NV; ++v)
          QMM_UNROLL
          for (int m = 0; m < MR; ++m)
            acc[m][j] = V::fma(V::load(x + m * ldx + i * QF::BLOCK + v * W), wv[v], acc[m][j]);
      }
    }
  }
  store_tile<MR>(p, m0, n0, accumulate, acc);
}

// Dequantizes NR rows of w from n0, k in [k0, k1), into `out` (row stride
// kGemmRowStride).
template <class QF, ScaleType ST>
QMM_FN void fill_rows(const Problem& p, int n0, int k0, int k1, float* out) {
  const TileRows<QF, ST> rows(p, n0, k0, k1);
  const int ng = (k1 - k0) / QF::GROUP;
  for (int j = 0; j < NR; ++j) {
    for (int g = 0; g < ng; ++g) {
      float* dst = out + j * kGemmRowStride + g * QF::GROUP;
      const uint8_t* wg = rows.w[j] + g * kGroupBytes<QF>;
      const GroupTab<QF> tab(rows.s[j][g], rows.b[j][g]);
      QMM_UNROLL
      for (int i = 0; i < QF::BLOCKS; ++i) {
        T wv[QF::NV];
        dequant_block<QF>(wg, tab, i, wv);
        QMM_UNROLL
        for (int v = 0; v < QF::NV; ++v) V::store(dst + i * QF::BLOCK + v * W, wv[v]);
      }
    }
  }
}

// The GEMM path's tile width: two vectors of output columns.
constexpr int NC = 2 * W;
constexpr int MG = V::MR_GEMM;
static_assert(MG <= kMaxGemmRows && W <= kMaxLanes, "see qmm_kernels.h");
static_assert(MG % 2 == 0, "a GEMM tile runs as two halves");

// The NC weight rows from n0, k in [k0, k1), dequantized into `rows` and
// transposed into `panel` [k][NC], k class-major: the k with k % W == l
// (k in the permuted order x has) at rows [l * per, (l + 1) * per), per =
// (k1 - k0) / W.
template <class QF, ScaleType ST>
QMM_FN void fill_gemm_panel(const Problem& p, int n0, int k0, int k1, float* rows,
                            float* panel) {
  for (int j = 0; j < NC; j += NR)
    fill_rows<QF, ST>(p, n0 + j, k0, k1, rows + j * kGemmRowStride);
  const int per = (k1 - k0) / W;
  for (int k = 0; k < k1 - k0; k += W) {
    QMM_UNROLL
    for (int h = 0; h < 2; ++h) {
      T v[W];
      QMM_UNROLL
      for (int c = 0; c < W; ++c) v[c] = V::load(rows + (h * W + c) * kGemmRowStride + k);
      V::transpose(v);  // v[c]: k + c across the rows, lane class c
      QMM_UNROLL
      for (int c = 0; c < W; ++c) V::store(panel + (c * per + k / W) * NC + h * W, v[c]);
    }
  }
}

// Bit-reversed i in [0, W): the lane class of the GEMM path's pass i.
constexpr int bit_reverse(int i) {
  int r = 0;
  for (int b = 1; b < W; b <<= 1, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}
constexpr int log2_lanes() {
  int n = 0;
  while ((1 << n) < W) ++n;
  return n;
}
static_assert((1 << log2_lanes()) == W, "lanes must be a power of two");

// R <= MG / 2 rows of x from m0 (`xt`: their first row in a tile at the
// k-block, xt[k * MG + r], k class-major like `panel`) against `panel`, for
// kc values of k; writes (or adds to) `cols` <= NC output columns from n.
// Pass i runs the lane classes l = bit_reverse(2i) and l + W/2 side by
// side, so hsum's first level (lane l + lane l + W/2) is added in registers
// and only the later levels go through the stack.
template <int R>
QMM_FN void tile_gemm(const Problem& p, const float* panel, const float* xt, int kc, int m0,
                      int n, int cols, bool accumulate) {
  const int per = kc / W;
  T acc[R][2], acc2[R][2];
  alignas(64) T stack[log2_lanes() - 1][R][2];  // pending subtrees of the fold
  for (int i = 0; i < W / 2; ++i) {
    const int la = bit_reverse(2 * i), lb = la + W / 2;
    const float* pa = panel + static_cast<size_t>(la) * per * NC;
    const float* pb = panel + static_cast<size_t>(lb) * per * NC;
    const float* xa = xt + static_cast<size_t>(la) * per * MG;
    const float* xb = xt + static_cast<size_t>(lb) * per * MG;
    QMM_UNROLL
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc2[r][0] = acc2[r][1] = V::zero();
    for (int k = 0; k < per; ++k) {
      {
        const T w0 = V::load(pa + k * NC), w1 = V::load(pa + k * NC + W);
        QMM_UNROLL
        for (int r = 0; r < R; ++r) {
          const T x = V::set1(xa[k * MG + r]);
          acc[r][0] = V::fma(x, w0, acc[r][0]);
          acc[r][1] = V::fma(x, w1, acc[r][1]);
        }
      }
      const T w0 = V::load(pb + k * NC), w1 = V::load(pb + k * NC + W);
      QMM_UNROLL
      for (int r = 0; r < R; ++r) {
        const T x = V::set1(xb[k * MG + r]);
        acc2[r][0] = V::fma(x, w0, acc2[r][0]);
        acc2[r][1] = V::fma(x, w1, acc2[r][1]);
      }
    }
    QMM_UNROLL
    for (int r = 0; r < R; ++r)
      QMM_UNROLL
      for (int h = 0; h < 2; ++h) acc[r][h] = V::add(acc[r][h], acc2[r][h]);
    // Binary counter: each trailing 1 bit of i completes a subtree.
    int level = 0;
    for (int c = i; c & 1; c >>= 1, ++level) {
      QMM_UNROLL
      for (int r = 0; r < R; ++r)
        QMM_UNROLL
        for (int h = 0; h < 2; ++h) acc[r][h] = V::add(stack[level][r][h], acc[r][h]);
    }
    if (i + 1 < W / 2) {
      QMM_UNROLL
      for (int r = 0; r < R; ++r) stack[level][r][0] = acc[r][0], stack[level][r][1] = acc[r][1];
    }
  }
  QMM_UNROLL
  for (int r = 0; r < R; ++r) {
    float* o = p.out + static_cast<size_t>(m0 + r) * p.N + n;
    if (cols == NC) {
      QMM_UNROLL
      for (int h = 0; h < 2; ++h)
        V::store(o + h * W, accumulate ? V::add(V::load(o + h * W), acc[r][h]) : acc[r][h]);
    } else {  // the last columns of a range: never past it (another thread's)
      alignas(64) float t[NC];
      V::store(t, acc[r][0]);
      V::store(t + W, acc[r][1]);
      for (int j = 0; j < cols; ++j) o[j] = accumulate ? o[j] + t[j] : t[j];
    }
  }
}

// Runtime row count -> compile-time register tile height (largest <= rows).
template <class QF, ScaleType ST, int R, int MR = V::MR_DIRECT>
QMM_FN void direct_rows(const Problem& p, const TileRows<QF, ST, R>& rows, int count, int m,
                        int n, int k0, int k1, bool accumulate) {
  if constexpr (MR > 1) {
    if (count < MR)
      return direct_rows<QF, ST, R, MR - 1>(p, rows, count, m, n, k0, k1, accumulate);
  }
  tile_direct<QF, ST, R, MR>(p, rows, m, n, k0, k1, accumulate);
}

template <int R = MG / 2>
QMM_FN void gemm_half(const Problem& p, const float* panel, const float* xt, int kc, int rows,
                      int m, int n, int cols, bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R) return gemm_half<R - 1>(p, panel, xt, kc, rows, m, n, cols, accumulate);
  }
  tile_gemm<R>(p, panel, xt, kc, m, n, cols, accumulate);
}

// A tile of MG rows (`rows` of them real) runs as two halves.
QMM_FN void gemm_rows(const Problem& p, const float* panel, const float* xt, int kc, int rows,
                      int m, int n, int cols, bool accumulate) {
  constexpr int H = MG / 2;
  gemm_half(p, panel, xt, kc, min_i(rows, H), m, n, cols, accumulate);
  if (rows > H) gemm_half(p, panel, xt + H, kc, min_i(rows, MG) - H, m + H, n, cols, accumulate);
}

// Tiles of R weight rows (n0 and n1 multiples of R, or n1 = N).
template <class QF, ScaleType ST, int R>
QMM_FN void run_direct(const Problem& p, int n0, int n1) {
  for (int k0 = 0; k0 < p.K; k0 += kBlockK) {
    const int k1 = min_i(p.K, k0 + kBlockK);
    // Near-equal row groups (8 rows -> 4 + 4, not 6 + 2).
    const int groups = (p.M + V::MR_DIRECT - 1) / V::MR_DIRECT;
    const int base = p.M / groups, extra = p.M % groups;
    for (int n = n0; n < n1; n += R) {
      const TileRows<QF, ST, R> rows(p, n, k0, k1);
      for (int gi = 0, m = 0; gi < groups; ++gi) {
        const int count = base + (gi < extra ? 1 : 0);
        direct_rows<QF, ST, R>(p, rows, count, m, n, k0, k1, k0 > 0);
        m += count;
      }
    }
  }
}

// x arrives in tiles of MG rows, class-major per k-block (see Problem::x);
// `scratch` holds the rows a panel is transposed from, then the panels.
// Blocked for the caches: a group of panels (up to kPanelCacheFloats) is
// filled once and every block of x tiles (up to kXBlockFloats) runs
// against all of them before the next block, so x comes from memory once
// per group rather than once per panel (at M in the thousands, x is
// megabytes). The same tiles and sums as panel by panel: the same bits.
template <class QF, ScaleType ST>
QMM_FN void run_gemm(const Problem& p, int n0, int n1, float* scratch) {
  float* rows = scratch;
  float* panels = scratch + NC * kGemmRowStride;
  const size_t tile_floats = static_cast<size_t>(p.K) * MG;
  for (int k0 = 0; k0 < p.K; k0 += kBlockK) {
    const int k1 = min_i(p.K, k0 + kBlockK), kc = k1 - k0;
    const size_t panel_floats = static_cast<size_t>(kc) * NC;
    const int group = static_cast<int>(kPanelCacheFloats / panel_floats);
    const int block_rows = MG * (kc * MG < kXBlockFloats ? kXBlockFloats / (kc * MG) : 1);
    for (int ng = n0; ng < n1; ng += group * NC) {
      const int panels_here = min_i(group, (n1 - ng + NC - 1) / NC);
      for (int j = 0; j < panels_here; ++j)
        fill_gemm_panel<QF, ST>(p, ng + j * NC, k0, k1, rows, panels + j * panel_floats);
      for (int mb = 0; mb < p.M; mb += block_rows) {
        const int m_end = min_i(p.M, mb + block_rows);
        for (int j = 0; j < panels_here; ++j) {
          const int n = ng + j * NC, cols = min_i(NC, n1 - n);
          for (int m = mb; m < m_end; m += MG) {
            const float* xt = p.x + (m / MG) * tile_floats + static_cast<size_t>(k0) * MG;
            gemm_rows(p, panels + j * panel_floats, xt, kc, p.M - m, m, n, cols, k0 > 0);
          }
        }
      }
    }
  }
}

template <class QF, ScaleType ST>
QMM_FN void run_typed(const Problem& p, int n0, int n1, float* scratch) {
  if (p.gemm) {
    run_gemm<QF, ST>(p, n0, n1, scratch);
  } else if (V::NR_WIDE > NR && p.wide && p.M <= kWideRows && p.K <= kWideMaxK) {
    run_direct<QF, ST, V::NR_WIDE>(p, n0, n1);
  } else {
    run_direct<QF, ST, NR>(p, n0, n1);
  }
}

template <int BITS, int GROUP>
QMM_FN void run_format(const Problem& p, int n0, int n1, float* scratch) {
  using QF = Q<BITS, GROUP>;
  switch (p.stype) {
    case ScaleType::F32: return run_typed<QF, ScaleType::F32>(p, n0, n1, scratch);
    case ScaleType::F16: return run_typed<QF, ScaleType::F16>(p, n0, n1, scratch);
    case ScaleType::BF16: return run_typed<QF, ScaleType::BF16>(p, n0, n1, scratch);
  }
}

template <int BITS>
QMM_FN void run_bits(const Problem& p, int n0, int n1, float* scratch) {
  switch (p.group) {
    case 32: return run_format<BITS, 32>(p, n0, n1, scratch);
    case 64: return run_format<BITS, 64>(p, n0, n1, scratch);
    default: return run_format<BITS, 128>(p, n0, n1, scratch);
  }
}

// One GEMM tile of x (Problem::x): MG rows, rows[r] a dense row of K
// floats or null (a padding row: zeros), written as dst[i * MG + r] with i
// the kernel's index of k: permuted inside blocks of 2W for 4-bit weights,
// class-major inside each k-block. Blocks of W rows by W values of k are
// transposed in registers, so each k's MG values leave as one store.
QMM_FN void pack_x_tile(const float* const* rows, int K, int bits, float* dst) {
  constexpr int groups = (MG + W - 1) / W;
  for (int kb = 0; kb < K; kb += W) {
    const int k0 = kb / kBlockK * kBlockK;
    const int per = (min_i(K, k0 + kBlockK) - k0) / W;
    QMM_UNROLL
    for (int g = 0; g < groups; ++g) {
      constexpr int last = MG - (groups - 1) * W;  // rows in the last group
      T v[W];
      QMM_UNROLL
      for (int j = 0; j < W; ++j) {
        const int r = g * W + j;
        v[j] = r < MG && rows[r] ? V::load(rows[r] + kb) : V::zero();
      }
      V::transpose(v);  // v[c]: k = kb + c across the group's rows
      QMM_UNROLL
      for (int c = 0; c < W; ++c) {
        const int rel = kb + c - k0;
        int pos = rel;  // the permuted position inside the k-block
        if (bits == 4) {
          const int o = rel & (2 * W - 1);
          pos = (rel - o) + ((o & 1) ? W + (o >> 1) : (o >> 1));
        }
        float* d = dst + static_cast<size_t>(k0 + (pos % W) * per + pos / W) * MG + g * W;
        if (g + 1 < groups || last == W) {
          V::store(d, v[c]);
        } else {
          alignas(64) float t[W];
          V::store(t, v[c]);
          QMM_UNROLL
          for (int j = 0; j < last; ++j) d[j] = t[j];
        }
      }
    }
  }
}

QMM_FN void run(const Problem& p, int n0, int n1, float* scratch) {
  if (p.bits == 4) {
    run_bits<4>(p, n0, n1, scratch);
  } else {
    run_bits<8>(p, n0, n1, scratch);
  }
}

// ---------------------------------------------------------------------------
// Int8 activations (Kernels::run_q8). x arrives quantized per block of 32
// (xq, d; see Problem). Per block and output, the variant's q8_dot gives the
// exact integer sum(q * xq) spread over vector lanes, converted to f32; it is
// scaled by s_w * d and accumulated in f32. The bias term b_w * sum(d * xq)
// per weight group is one more f32 dot product per output (xs, biases).
// A chunk is V::Q8_BLOCKS blocks: the variant's V provides
//   q8_load<BITS, HALF>(p)        a chunk of packed weights as unsigned bytes
//                                 (HALF: only its first block, the rest 0)
//   q8_dot<BITS>(w, xq, xqsum)    the per-lane integer dot products as f32
//   q8_wscale<GROUP, HALF>(s, g)  weight scales per lane for the chunk at
//                                 group g (lanes of block i: s[g + i])
//   mul(a, b), load_n(p, n)    (load_n: the first n < W floats, others 0)
// and the lanes of block i of a chunk are lanes [8i, 8i + 8): d8 (each d
// repeated 8 times) lines up with them.

// Weight rows of a tile for k-block [k0, k1), as TileRows.
template <class QF, ScaleType ST>
using Q8Rows = TileRows<QF, ST>;

// One chunk (blocks [b, b + Q8_BLOCKS), or only block b if HALF) of an MR x
// NR tile.
template <class QF, ScaleType ST, int MR, bool HALF>
QMM_Q8_FN __attribute__((always_inline)) inline void q8_chunk(
    const Q8Rows<QF, ST>& rows, T (&acc)[MR][NR], int b, const int8_t* xq, const float* xd,
    const int32_t* xsum, size_t ldx, size_t ldb) {
  constexpr int BB = kQ8Block * QF::BITS / 8;  // weight bytes per block
  QMM_UNROLL
  for (int j = 0; j < NR; ++j) {
    const uint8_t* wp = rows.w[j] + b * BB;
    __builtin_prefetch(wp + kPrefetchRows * rows.row_bytes, 0, kPrefetchLocality<MR>);
    const auto wv = V::template q8_load<QF::BITS, HALF>(wp);
    const T sc = V::template q8_wscale<QF::GROUP, HALF>(rows.s[j], b * kQ8Block / QF::GROUP);
    QMM_UNROLL
    for (int m = 0; m < MR; ++m) {
      const T f = V::template q8_dot<QF::BITS>(wv, xq + m * ldx + b * kQ8Block,
                                               xsum + m * ldb + b);
      acc[m][j] = V::fma(f, V::mul(sc, V::load(xd + (m * ldb + b) * 8)), acc[m][j]);
    }
  }
}

// The bias term of an int8 tile: per weight group, b_w * xs (the biases'
// last vector loaded partially, the rest zero).
template <class QF, ScaleType ST, int MR>
QMM_Q8_FN __attribute__((always_inline)) inline void q8_bias_term(
    const Problem& p, const Q8Rows<QF, ST>& rows, T (&acc)[MR][NR], int m0, int k0, int k1) {
  const int g0 = k0 / QF::GROUP, ng = (k1 - k0) / QF::GROUP;
  for (int g = 0; g < ng; g += W) {
    QMM_UNROLL
    for (int j = 0; j < NR; ++j) {
      const T bw = g + W <= ng ? V::load(rows.b[j] + g) : V::load_n(rows.b[j] + g, ng - g);
      QMM_UNROLL
      for (int m = 0; m < MR; ++m)
        acc[m][j] = V::fma(V::load(p.xs + static_cast<size_t>(m0 + m) * p.xs_stride + g0 + g),
                           bw, acc[m][j]);
    }
  }
}

#if defined(QMM_Q8_SPLIT)
// 4-bit weights, x in the split layout (Q8Split, qmm_kernels.h), for a
// variant that defines QMM_Q8_SPLIT and provides
//   Q8S_BLOCKS                    blocks per chunk
//   q8s_load(p, n)                n <= Q8S_BLOCKS blocks of packed weights
//                                 (block L in 128-bit lane L): their low and
//                                 high nibbles
//   q8s_dot(w, x)                 both nibbles' integer dot products with the
//                                 chunk's even and odd x bytes, as f32 (lanes
//                                 4L..4L+3: block L)
//   q8s_wscale<GROUP>(s, g, n)    the weight scales over those lanes
// Per chunk and weight row, the nibbles are unpacked once for the MR rows
// of x; the conversion, scaling and FMA run once per chunk.
constexpr Q8Split kQ8Split{V::Q8S_BLOCKS};

template <class QF, ScaleType ST, int MR, bool FULL>
QMM_Q8_FN __attribute__((always_inline)) inline void q8s_chunk(
    const Q8Rows<QF, ST>& rows, T (&acc)[MR][NR], int b, int n, const int8_t* xq,
    const float* xd, size_t ldx, size_t ldd) {
  constexpr int BB = kQ8Block / 2;  // packed bytes per block
  if constexpr (FULL) n = V::Q8S_BLOCKS;
  QMM_UNROLL
  for (int j = 0; j < NR; ++j) {
    const uint8_t* wp = rows.w[j] + b * BB;
    __builtin_prefetch(wp + kPrefetchRows * rows.row_bytes, 0, kPrefetchLocality<MR>);
    const auto w = V::q8s_load(wp, n);
    const T sc = V::template q8s_wscale<QF::GROUP>(rows.s[j], b * kQ8Block / QF::GROUP, n);
    QMM_UNROLL
    for (int m = 0; m < MR; ++m)
      acc[m][j] = V::fma(V::q8s_dot(w, xq + m * ldx), V::mul(sc, V::load(xd + m * ldd)),
                         acc[m][j]);
  }
}

template <class QF, ScaleType ST, int MR>
QMM_Q8_FN void tile_q8_split(const Problem& p, const Q8Rows<QF, ST>& rows, int m0, int n0,
                             int k0, int k1, bool accumulate) {
  constexpr int CB = V::Q8S_BLOCKS;
  const size_t ldx = kQ8Split.row_bytes(p.K), ldd = kQ8Split.row_floats(p.K);
  const size_t cb = kQ8Split.chunk_bytes(), cf = kQ8Split.chunk_floats();
  const int nb = (k1 - k0) / kQ8Block, c0 = k0 / (CB * kQ8Block);
  const int8_t* xq = p.xq + m0 * ldx + c0 * cb;
  const float* xd = p.xd8 + m0 * ldd + c0 * cf;
  T acc[MR][NR];
  zero_tile(acc);
  int b = 0;
  for (; b + CB <= nb; b += CB, xq += cb, xd += cf)
    q8s_chunk<QF, ST, MR, true>(rows, acc, b, CB, xq, xd, ldx, ldd);
  if (b < nb) q8s_chunk<QF, ST, MR, false>(rows, acc, b, nb - b, xq, xd, ldx, ldd);
  q8_bias_term<QF, ST, MR>(p, rows, acc, m0, k0, k1);
  store_tile<MR>(p, m0, n0, accumulate, acc);
}
#endif

// MR rows of x (quantized) from m0 against the NR weight rows in `rows`,
// k in [k0, k1).
template <class QF, ScaleType ST, int MR>
QMM_Q8_FN void tile_q8(const Problem& p, const Q8Rows<QF, ST>& rows, int m0, int n0, int k0,
                       int k1, bool accumulate) {
  constexpr int CB = V::Q8_BLOCKS;
  const size_t ldx = static_cast<size_t>(p.K), ldb = ldx / kQ8Block;
  const int nb = (k1 - k0) / kQ8Block;
  const int8_t* xq = p.xq + m0 * ldx + k0;
  const size_t b0 = m0 * ldb + k0 / kQ8Block;
  const float* xd = p.xd8 + b0 * 8;
  const int32_t* xsum = p.xqsum + b0;
  T acc[MR][NR];
  zero_tile(acc);

  int b = 0;
  for (; b + CB <= nb; b += CB)
    q8_chunk<QF, ST, MR, false>(rows, acc, b, xq, xd, xsum, ldx, ldb);
  if constexpr (CB > 1) {
    if (b < nb) q8_chunk<QF, ST, MR, true>(rows, acc, b, xq, xd, xsum, ldx, ldb);
  }

  q8_bias_term<QF, ST, MR>(p, rows, acc, m0, k0, k1);
  store_tile<MR>(p, m0, n0, accumulate, acc);
}

template <class QF, ScaleType ST, int MR = V::Q8_MR>
QMM_Q8_FN void q8_rows(const Problem& p, const Q8Rows<QF, ST>& rows, int count, int m, int n,
                       int k0, int k1, bool accumulate) {
  if constexpr (MR > 1) {
    if (count < MR) return q8_rows<QF, ST, MR - 1>(p, rows, count, m, n, k0, k1, accumulate);
  }
#if defined(QMM_Q8_SPLIT)
  if constexpr (QF::BITS == 4) {
    tile_q8_split<QF, ST, MR>(p, rows, m, n, k0, k1, accumulate);
  } else
#endif
  {
    tile_q8<QF, ST, MR>(p, rows, m, n, k0, k1, accumulate);
  }
}

// Rows of x in blocks of kBlockM, each split into near-equal groups of at
// most Q8_MR rows that run one after the other on the same weight tile
// (unpacked again per group, from L1).
template <class QF, ScaleType ST>
QMM_Q8_FN void run_q8_typed(const Problem& p, int n0, int n1) {
  for (int k0 = 0; k0 < p.K; k0 += kBlockK) {
    const int k1 = min_i(p.K, k0 + kBlockK);
    const bool accumulate = k0 > 0;
    for (int mc = 0; mc < p.M; mc += kBlockM) {
      const int rows_m = min_i(p.M, mc + kBlockM) - mc;
      const int groups = (rows_m + V::Q8_MR - 1) / V::Q8_MR;
      const int base = rows_m / groups, extra = rows_m % groups;
      for (int n = n0; n < n1; n += NR) {
        const Q8Rows<QF, ST> rows(p, n, k0, k1);
        for (int gi = 0, m = mc; gi < groups; ++gi) {
          const int count = base + (gi < extra ? 1 : 0);
          q8_rows<QF, ST>(p, rows, count, m, n, k0, k1, accumulate);
          m += count;
        }
      }
    }
  }
}

template <int BITS, int GROUP>
QMM_Q8_FN void run_q8_format(const Problem& p, int n0, int n1) {
  using QF = Q<BITS, GROUP>;
  switch (p.stype) {
    case ScaleType::F32: return run_q8_typed<QF, ScaleType::F32>(p, n0, n1);
    case ScaleType::F16: return run_q8_typed<QF, ScaleType::F16>(p, n0, n1);
    case ScaleType::BF16: return run_q8_typed<QF, ScaleType::BF16>(p, n0, n1);
  }
}

template <int BITS>
QMM_Q8_FN void run_q8_bits(const Problem& p, int n0, int n1) {
  switch (p.group) {
    case 32: return run_q8_format<BITS, 32>(p, n0, n1);
    case 64: return run_q8_format<BITS, 64>(p, n0, n1);
    default: return run_q8_format<BITS, 128>(p, n0, n1);
  }
}

QMM_Q8_FN void run_q8(const Problem& p, int n0, int n1) {
  if (p.bits == 4) {
    run_q8_bits<4>(p, n0, n1);
  } else {
    run_q8_bits<8>(p, n0, n1);
  }
}

#if defined(QMM_Q8_GEMM)
// ---------------------------------------------------------------------------
// Int8 activations at GEMM sizes (Kernels::run_q8_gemm; M above the direct
// rows). The dot-product tiles above leave each block's integer sum spread
// over lanes, so every 64 products cost a conversion, a scale multiply and
// an FMA besides the `vpdpbusd`: no better than f32 there. Here, per
// k-block and NC output columns, the weights are unpacked to bytes and
// stored column-interleaved, panel[block][quad q][column][4 bytes] (k 4q ..
// 4q + 3 of the block, in x's permuted order), so one vector of int32 lanes
// holds W columns: a lane accumulates a whole block of 32 products in 8
// `vpdpbusd` (each with x's 4 bytes broadcast) and is scaled once per block.
// The variant's V provides
//   I, q8g_zero(), q8g_load(p)    int32 vectors, 64 bytes of panel
//   q8g_dot(acc, w, x4)           acc += per-lane dot of 4 u8 (w) x 4 s8 (x4)
//   q8g_add(a, b)                 lane-wise int32 sum
//   q8g_float(acc)                the int32 lanes as f32
//   q8g_store(p, v)               64 bytes of panel
//   q8g_words16(src, off, out)    16 columns' 16 bytes at src[j] + off as 4
//                                 vectors, word t of column j in lane j
//   q8g_low4(v), q8g_high4(v)     each byte's low / high nibble
//   q8g_gather(base, idx)         W floats base[idx[j]]
//   load_halves(src, bf16)        W f16 (or bfloat16) values as f32
//   q8_quantize_block             Kernels::quantize_q8_block (vectorized)
// Exact integer sums, f32 scaling per block: the result is the int8 path's
// arithmetic (within its tolerance of run_q8), not its bits.
using I = V::I;
constexpr int Q8G_MR = V::Q8G_MR;
constexpr int Q8G_BLOCK_BYTES = 8 * NC * 4;  // one block of 32 k for NC columns
static_assert(kBlockK / kQ8Block * (Q8G_BLOCK_BYTES / 4 + 2 * NC) <=
                  2 * kMaxLanes * kGemmRowStride + kPanelCacheFloats,
              "the panel, its scales and biases fit scratch_floats()");

// Weights [k0, k1) of columns n .. n + NC (rows past N repeat the last one;
// their outputs are never stored) into the byte panel `pw`, the scale of
// each block into `ps` [block][NC] and the bias of each group into `pb`
// [group][NC]. W columns at a time, a column per lane: the packed words are
// transposed in registers and the scales gathered (column by column and
// byte by byte, this fill took longer than the GEMM's tiles at 32 rows).
template <class QF, ScaleType ST>
QMM_Q8_FN void fill_q8_panel(const Problem& p, int n, int k0, int k1, uint8_t* pw, float* ps,
                             float* pb) {
  static_assert(W == 16, "a panel half is 16 columns of 4 bytes: one vector");
  const TileRows<QF, ST, NC> rows(p, n, k0, k1);
  const int nb = (k1 - k0) / kQ8Block, ng = (k1 - k0) / QF::GROUP;
  constexpr int BB = kQ8Block * QF::BITS / 8;  // packed bytes per block
  constexpr int Q = NC * 4;                     // bytes per quad of the panel
  for (int h = 0; h < NC / W; ++h) {
    const uint8_t* const* w = rows.w + h * W;
    alignas(64) int32_t si[W], bi[W];  // each column's scales and biases
    for (int j = 0; j < W; ++j) {
      si[j] = static_cast<int32_t>(rows.s[h * W + j] - rows.s[0]);
      bi[j] = static_cast<int32_t>(rows.b[h * W + j] - rows.b[0]);
    }
    for (int b = 0; b < nb; ++b) {
      uint8_t* dst = pw + static_cast<size_t>(b) * Q8G_BLOCK_BYTES + h * W * 4;
      I q[4];
      V::q8g_words16(w, static_cast<size_t>(b) * BB, q);
      if constexpr (QF::BITS == 4) {  // words of packed k; low nibbles first
        QMM_UNROLL
        for (int t = 0; t < 4; ++t) {
          V::q8g_store(dst + t * Q, V::q8g_low4(q[t]));
          V::q8g_store(dst + (4 + t) * Q, V::q8g_high4(q[t]));
        }
      } else {
        QMM_UNROLL
        for (int t = 0; t < 4; ++t) V::q8g_store(dst + t * Q, q[t]);
        V::q8g_words16(w, static_cast<size_t>(b) * BB + 16, q);
        QMM_UNROLL
        for (int t = 0; t < 4; ++t) V::q8g_store(dst + (4 + t) * Q, q[t]);
      }
      V::store(ps + b * NC + h * W, V::q8g_gather(rows.s[0] + b * kQ8Block / QF::GROUP, si));
    }
    for (int g = 0; g < ng; ++g) V::store(pb + g * NC + h * W, V::q8g_gather(rows.b[0] + g, bi));
  }
}

// MR rows of x from m0 against the panel (nb blocks, ng groups from group
// g0); writes (or adds to) `cols` <= NC output columns from n.
template <int MR>
QMM_Q8_FN void tile_q8g(const Problem& p, const uint8_t* pw, const float* ps, const float* pb,
                        int nb, int g0, int ng, int k0, int m0, int n, int cols,
                        bool accumulate) {
  const size_t ldx = static_cast<size_t>(p.K), ldb = ldx / kQ8Block;
  const int8_t* xq = p.xq + m0 * ldx + k0;
  const float* xd = p.xd8 + (m0 * ldb + k0 / kQ8Block) * 8;
  T f[MR][2];
  QMM_UNROLL
  for (int r = 0; r < MR; ++r) f[r][0] = f[r][1] = V::zero();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = pw + static_cast<size_t>(b) * Q8G_BLOCK_BYTES;
    I a[MR][2];
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) a[r][0] = a[r][1] = V::q8g_zero();
    QMM_UNROLL
    for (int q = 0; q < 8; ++q) {
      const I w0 = V::q8g_load(wb + q * NC * 4), w1 = V::q8g_load(wb + q * NC * 4 + W * 4);
      QMM_UNROLL
      for (int r = 0; r < MR; ++r) {
        int32_t x4;
        __builtin_memcpy(&x4, xq + r * ldx + b * kQ8Block + 4 * q, 4);
        a[r][0] = V::q8g_dot(a[r][0], w0, x4);
        a[r][1] = V::q8g_dot(a[r][1], w1, x4);
      }
    }
    const T s0 = V::load(ps + b * NC), s1 = V::load(ps + b * NC + W);
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const T d = V::set1(xd[(r * ldb + b) * 8]);
      f[r][0] = V::fma(V::q8g_float(a[r][0]), V::mul(s0, d), f[r][0]);
      f[r][1] = V::fma(V::q8g_float(a[r][1]), V::mul(s1, d), f[r][1]);
    }
  }
  // Bias term: b_w * sum(d * xq) per group.
  for (int g = 0; g < ng; ++g) {
    const T b0 = V::load(pb + g * NC), b1 = V::load(pb + g * NC + W);
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const T xs = V::set1(p.xs[static_cast<size_t>(m0 + r) * p.xs_stride + g0 + g]);
      f[r][0] = V::fma(b0, xs, f[r][0]);
      f[r][1] = V::fma(b1, xs, f[r][1]);
    }
  }
  QMM_UNROLL
  for (int r = 0; r < MR; ++r) {
    float* o = p.out + static_cast<size_t>(m0 + r) * p.N + n;
    if (cols == NC) {
      QMM_UNROLL
      for (int h = 0; h < 2; ++h)
        V::store(o + h * W, accumulate ? V::add(V::load(o + h * W), f[r][h]) : f[r][h]);
    } else {  // the last columns of a range: never past it (another thread's)
      alignas(64) float t[NC];
      V::store(t, f[r][0]);
      V::store(t + W, f[r][1]);
      for (int j = 0; j < cols; ++j) o[j] = accumulate ? o[j] + t[j] : t[j];
    }
  }
}

template <int MR = Q8G_MR>
QMM_Q8_FN void q8g_rows(const Problem& p, const uint8_t* pw, const float* ps, const float* pb,
                        int nb, int g0, int ng, int k0, int rows, int m, int n, int cols,
                        bool accumulate) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return q8g_rows<MR - 1>(p, pw, ps, pb, nb, g0, ng, k0, rows, m, n, cols, accumulate);
  }
  tile_q8g<MR>(p, pw, ps, pb, nb, g0, ng, k0, m, n, cols, accumulate);
}

// Requests the next panel's weights, scales and biases while the tiles run
// on this one: filling a panel reads NC short runs of rows (288 bytes each at
// K = 576), too short for the hardware prefetchers, and at 32 rows of x the
// fill waited on DRAM for most of its time. (always_inline: GCC drops a
// call to a function that only prefetches.)
template <class QF>
QMM_Q8_FN __attribute__((always_inline)) inline void prefetch_panel(const Problem& p, int n,
                                                                   int k0, int k1) {
  const size_t row_bytes = static_cast<size_t>(p.K) * QF::BITS / 8;
  const size_t groups = static_cast<size_t>(p.K / QF::GROUP);
  const size_t sb = p.stype == ScaleType::F32 ? 4 : 2;  // bytes per scale
  const int wb = (k1 - k0) * QF::BITS / 8, gb = static_cast<int>((k1 - k0) / QF::GROUP * sb);
  for (int j = 0; j < NC; ++j) {
    const size_t row = static_cast<size_t>(min_i(n + j, p.N - 1));
    const uint8_t* w = p.w + row * row_bytes + static_cast<size_t>(k0) * QF::BITS / 8;
    for (int o = 0; o < wb; o += 64) __builtin_prefetch(w + o);
    const size_t g = (row * groups + k0 / QF::GROUP) * sb;
    for (int o = 0; o < gb + 63; o += 64) {  // + 63: a run that straddles a line
      const size_t at = g + static_cast<size_t>(min_i(o, gb - 1));
      __builtin_prefetch(static_cast<const uint8_t*>(p.scales) + at);
      if (p.biases) __builtin_prefetch(static_cast<const uint8_t*>(p.biases) + at);
    }
  }
}

template <class QF, ScaleType ST>
QMM_Q8_FN void run_q8_gemm_typed(const Problem& p, int n0, int n1, float* scratch) {
  uint8_t* pw = reinterpret_cast<uint8_t*>(scratch);
  float* ps = scratch + kBlockK / kQ8Block * Q8G_BLOCK_BYTES / 4;
  float* pb = ps + kBlockK / kQ8Block * NC;
  for (int k0 = 0; k0 < p.K; k0 += kBlockK) {
    const int k1 = min_i(p.K, k0 + kBlockK);
    const int nb = (k1 - k0) / kQ8Block, g0 = k0 / QF::GROUP, ng = (k1 - k0) / QF::GROUP;
    for (int n = n0; n < n1; n += NC) {
      fill_q8_panel<QF, ST>(p, n, k0, k1, pw, ps, pb);
      if (n + NC < n1) prefetch_panel<QF>(p, n + NC, k0, k1);
      const int cols = min_i(NC, n1 - n);
      for (int m = 0; m < p.M; m += Q8G_MR)
        q8g_rows(p, pw, ps, pb, nb, g0, ng, k0, p.M - m, m, n, cols, k0 > 0);
    }
  }
}

template <int BITS, int GROUP>
QMM_Q8_FN void run_q8_gemm_format(const Problem& p, int n0, int n1, float* scratch) {
  using QF = Q<BITS, GROUP>;
  switch (p.stype) {
    case ScaleType::F32: return run_q8_gemm_typed<QF, ScaleType::F32>(p, n0, n1, scratch);
    case ScaleType::F16: return run_q8_gemm_typed<QF, ScaleType::F16>(p, n0, n1, scratch);
    case ScaleType::BF16: return run_q8_gemm_typed<QF, ScaleType::BF16>(p, n0, n1, scratch);
  }
}

template <int BITS>
QMM_Q8_FN void run_q8_gemm_bits(const Problem& p, int n0, int n1, float* scratch) {
  switch (p.group) {
    case 32: return run_q8_gemm_format<BITS, 32>(p, n0, n1, scratch);
    case 64: return run_q8_gemm_format<BITS, 64>(p, n0, n1, scratch);
    default: return run_q8_gemm_format<BITS, 128>(p, n0, n1, scratch);
  }
}

QMM_Q8_FN void run_q8_gemm(const Problem& p, int n0, int n1, float* scratch) {
  if (p.bits == 4) {
    run_q8_gemm_bits<4>(p, n0, n1, scratch);
  } else {
    run_q8_gemm_bits<8>(p, n0, n1, scratch);
  }
}

// ---------------------------------------------------------------------------
// Int8 activations against weights packed at load (Problem::packed).
// The packed panel holds the same words that fill_q8_panel transposes,
// already transposed: a tile of NC columns is one sequential stream of
// (K / 32) x BITS x NC words, so the tiles read their weights with no
// per-call fill (the transposes, gathers and stores that made the GEMM
// path slower than the dot-product tiles below 24 rows). Each 64-byte load
// is word t of 16 columns. 4-bit: its low nibbles are k 8t, 8t + 2, ..
// (x's bytes 4t .. 4t + 3 in nibble order), its high nibbles the odd k
// (x's 16 + 4t ..); 8-bit: its bytes are k 4t .. 4t + 3, and words t and
// t + 4 meet the same x bytes as the 4-bit nibbles. The arithmetic is the
// int8 GEMM's: exact integer sums per block, f32 scaling per block.
template <int BITS>
constexpr int kQ8pBlockBytes = BITS * NC * 4;  // one block of 32 k for NC columns
// At one or two rows of x (decode) the tiles request their stream this many
// bytes ahead into L2, on top of the hardware prefetchers (Intel Xeon,
// SmolLM2 Q4_1 and Q4_0, int8 decode 1.07-1.08x at 4 KiB, 1.04x at 2 KiB,
// 1.01x at 1 KiB, 1.07x at 8 KiB; docs/cpu-kernels.md). More rows are
// compute-bound (docs/cpu-kernels.md, 4) and were not measured with it.
constexpr int kQ8pAheadBytes = 4096;

// A packed tile's scales and biases ([group][NC] from `at`), read where the
// tile uses them, W at a time: f32 in place, f16 / bf16 converted per
// vector, a symmetric format's implied biases kImpliedZero * s (as
// biases_f32 derives them). Converting a whole tile's worth into a scratch
// buffer first cost ~30% of the packed path's samples in int8 decode (the
// loop stalled on the two extra streams); read per block, their loads
// overlap the tile's arithmetic.
template <int BITS, ScaleType ST>
struct PanelScales {
  const void* s;
  const void* b;  // null: implied
  size_t at;
  QMM_Q8_FN T load(const void* base, int i) const {
    if constexpr (ST == ScaleType::F32) {
      return V::load(static_cast<const float*>(base) + at + i);
    } else {
      return V::load_halves(static_cast<const uint16_t*>(base) + at + i, ST == ScaleType::BF16);
    }
  }
  QMM_Q8_FN T scale(int i) const { return load(s, i); }
  QMM_Q8_FN T bias(int i) const {
    if (b) return load(b, i);
    return V::mul(load(s, i), V::set1(kImpliedZero<BITS>));
  }
};

// MR rows of x from m0 against packed column tile `t` with its scales and
// biases `sc`, its weights read from `wt`: the packed words (LOAD_BITS =
// BITS), or 4-bit weights unpacked to one byte each (LOAD_BITS = 8, see
// unpack_tile4).
template <int BITS, int MR, int GROUP, ScaleType ST, int LOAD_BITS = BITS>
QMM_Q8_FN void tile_q8p(const Problem& p, const PanelScales<BITS, ST>& sc, const uint8_t* wt,
                        int t, int m0) {
  constexpr int BB = kQ8pBlockBytes<LOAD_BITS>;
  const int nb = p.K / kQ8Block, ng = p.K / GROUP;
  const size_t ldx = static_cast<size_t>(p.K), ldb = ldx / kQ8Block;
  const int8_t* xq = p.xq + m0 * ldx;
  const float* xd = p.xd8 + m0 * ldb * 8;
  T f[MR][2];
  QMM_UNROLL
  for (int r = 0; r < MR; ++r) f[r][0] = f[r][1] = V::zero();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = wt + static_cast<size_t>(b) * BB;
    // At one or two rows the low and high halves of the block add into
    // separate int32 accumulators: 4 dependent `vpdpbusd` per chain and
    // block, not 8 (their latency, not their throughput, bounded the tile).
    constexpr int A = MR <= 2 ? 2 : 1;
    I a[A][MR][2];
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) {
      QMM_UNROLL
      for (int j = 0; j < A; ++j) a[j][r][0] = a[j][r][1] = V::q8g_zero();
    }
    QMM_UNROLL
    for (int q = 0; q < 4; ++q) {
      const uint8_t* wq = wb + q * NC * 4;
      if constexpr (MR <= 2) {  // the lines this step reads, kQ8pAheadBytes on
        QMM_UNROLL
        for (int o = 0; o < NC * 4; o += 64) {
          __builtin_prefetch(wq + kQ8pAheadBytes + o, 0, kPrefetchLocality<MR>);
          if constexpr (LOAD_BITS == 8)
            __builtin_prefetch(wq + 4 * NC * 4 + kQ8pAheadBytes + o, 0, kPrefetchLocality<MR>);
        }
      }
      I l0, l1, h0, h1;
      if constexpr (LOAD_BITS == 4) {
        const I v0 = V::q8g_load(wq), v1 = V::q8g_load(wq + W * 4);
        l0 = V::q8g_low4(v0), l1 = V::q8g_low4(v1), h0 = V::q8g_high4(v0), h1 = V::q8g_high4(v1);
      } else {
        l0 = V::q8g_load(wq), l1 = V::q8g_load(wq + W * 4);
        h0 = V::q8g_load(wq + 4 * NC * 4), h1 = V::q8g_load(wq + 4 * NC * 4 + W * 4);
      }
      QMM_UNROLL
      for (int r = 0; r < MR; ++r) {
        const int8_t* xb = xq + r * ldx + b * kQ8Block + 4 * q;
        int32_t xl, xh;
        __builtin_memcpy(&xl, xb, 4);
        __builtin_memcpy(&xh, xb + kQ8Block / 2, 4);
        a[0][r][0] = V::q8g_dot(a[0][r][0], l0, xl);
        a[0][r][1] = V::q8g_dot(a[0][r][1], l1, xl);
        a[A - 1][r][0] = V::q8g_dot(a[A - 1][r][0], h0, xh);
        a[A - 1][r][1] = V::q8g_dot(a[A - 1][r][1], h1, xh);
      }
    }
    if constexpr (A == 2) {
      QMM_UNROLL
      for (int r = 0; r < MR; ++r) {
        a[0][r][0] = V::q8g_add(a[0][r][0], a[1][r][0]);
        a[0][r][1] = V::q8g_add(a[0][r][1], a[1][r][1]);
      }
    }
    const int sb = b * kQ8Block / GROUP * NC;
    const T s0 = sc.scale(sb), s1 = sc.scale(sb + W);
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const T d = V::set1(xd[(r * ldb + b) * 8]);
      f[r][0] = V::fma(V::q8g_float(a[0][r][0]), V::mul(s0, d), f[r][0]);
      f[r][1] = V::fma(V::q8g_float(a[0][r][1]), V::mul(s1, d), f[r][1]);
    }
  }
  // Bias term: b_w * sum(d * xq) per group.
  for (int g = 0; g < ng; ++g) {
    const T b0 = sc.bias(g * NC), b1 = sc.bias(g * NC + W);
    QMM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const T xs = V::set1(p.xs[static_cast<size_t>(m0 + r) * p.xs_stride + g]);
      f[r][0] = V::fma(b0, xs, f[r][0]);
      f[r][1] = V::fma(b1, xs, f[r][1]);
    }
  }
  QMM_UNROLL
  for (int r = 0; r < MR; ++r) {
    float* o = p.out + static_cast<size_t>(m0 + r) * p.N + static_cast<size_t>(t) * NC;
    V::store(o, f[r][0]);
    V::store(o + W, f[r][1]);
  }
}

template <int BITS, int GROUP, ScaleType ST, int LOAD_BITS = BITS, int MR = Q8G_MR>
QMM_Q8_FN void q8p_rows(const Problem& p, const PanelScales<BITS, ST>& sc, const uint8_t* wt,
                        int rows, int t, int m) {
  if constexpr (MR > 1) {
    if (rows < MR) return q8p_rows<BITS, GROUP, ST, LOAD_BITS, MR - 1>(p, sc, wt, rows, t, m);
  }
  tile_q8p<BITS, MR, GROUP, ST, LOAD_BITS>(p, sc, wt, t, m);
}

// With Problem::unpack4 (prefill sizes) a column tile's 4-bit weights are
// unpacked to bytes once per call (unpack_tile4) and the tiles read those:
// no nibble masks and shifts per 4 rows in the inner loop. Decode reads the
// packed words (it streams them once from memory).
// The bytes of one block of 32 k for NC columns, unpacked.
constexpr size_t kQ8pUnpackedBlockBytes = kQ8pBlockBytes<8>;

// Column tile `t`'s 4-bit weights as one byte each, in the 8-bit packed
// layout (per block: words 0-3 the low nibbles of the packed words 0-3,
// words 4-7 their high nibbles), so that tile_q8p<.., LOAD_BITS = 8> pairs
// them with x exactly as it pairs the nibbles: the same integer sums.
QMM_Q8_FN void unpack_tile4(const Problem& p, int t, uint8_t* dst) {
  const int nb = p.K / kQ8Block;
  const uint8_t* wt = p.w + static_cast<size_t>(t) * nb * kQ8pBlockBytes<4>;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = wt + static_cast<size_t>(b) * kQ8pBlockBytes<4>;
    uint8_t* db = dst + static_cast<size_t>(b) * kQ8pUnpackedBlockBytes;
    QMM_UNROLL
    for (int q = 0; q < 4; ++q) {
      QMM_UNROLL
      for (int h = 0; h < NC * 4; h += W * 4) {
        const I v = V::q8g_load(wb + q * NC * 4 + h);
        V::q8g_store(db + q * NC * 4 + h, V::q8g_low4(v));
        V::q8g_store(db + (4 + q) * NC * 4 + h, V::q8g_high4(v));
      }
    }
  }
}

template <int BITS, int GROUP, ScaleType ST>
QMM_Q8_FN void run_q8_packed_typed(const Problem& p, int n0, int n1, float* scratch) {
  const int ng = p.K / GROUP, nb = p.K / kQ8Block;
  // Unpacked: the tile's bytes, then its scales and biases as f32 ([group]
  // [NC] each, the values PanelScales reads; a symmetric format's biases
  // derived), converted once rather than per block and tile of rows.
  const size_t unpacked = static_cast<size_t>(nb) * kQ8pUnpackedBlockBytes;
  const bool unpack = BITS == 4 && p.unpack4 &&
                      unpacked + 2 * sizeof(float) * ng * NC <= scratch_floats(p.K) * sizeof(float);
  auto* bytes = reinterpret_cast<uint8_t*>(scratch);
  float* s32 = scratch + unpacked / sizeof(float);
  float* b32 = s32 + ng * NC;
  for (int t = n0 / NC; t < n1 / NC; ++t) {
    const PanelScales<BITS, ST> sc{p.scales, p.biases, static_cast<size_t>(t) * ng * NC};
    if (unpack) {
      unpack_tile4(p, t, bytes);
      for (int i = 0; i < ng * NC; i += W) {
        V::store(s32 + i, sc.scale(i));
        V::store(b32 + i, sc.bias(i));
      }
      const PanelScales<BITS, ScaleType::F32> sc32{s32, b32, 0};
      for (int m = 0; m < p.M; m += Q8G_MR)
        q8p_rows<BITS, GROUP, ScaleType::F32, 8>(p, sc32, bytes, p.M - m, t, m);
    } else {
      const uint8_t* wt = p.w + static_cast<size_t>(t) * nb * kQ8pBlockBytes<BITS>;
      for (int m = 0; m < p.M; m += Q8G_MR) q8p_rows<BITS, GROUP, ST>(p, sc, wt, p.M - m, t, m);
    }
  }
}

template <int BITS, int GROUP>
QMM_Q8_FN void run_q8_packed_group(const Problem& p, int n0, int n1, float* scratch) {
  switch (p.stype) {
    case ScaleType::F32: return run_q8_packed_typed<BITS, GROUP, ScaleType::F32>(p, n0, n1, scratch);
    case ScaleType::F16: return run_q8_packed_typed<BITS, GROUP, ScaleType::F16>(p, n0, n1, scratch);
    case ScaleType::BF16: return run_q8_packed_typed<BITS, GROUP, ScaleType::BF16>(p, n0, n1, scratch);
  }
}

template <int BITS>
QMM_Q8_FN void run_q8_packed_bits(const Problem& p, int n0, int n1, float* scratch) {
  switch (p.group) {
    case 32: return run_q8_packed_group<BITS, 32>(p, n0, n1, scratch);
    case 64: return run_q8_packed_group<BITS, 64>(p, n0, n1, scratch);
    default: return run_q8_packed_group<BITS, 128>(p, n0, n1, scratch);
  }
}

QMM_Q8_FN void run_q8_packed(const Problem& p, int n0, int n1, float* scratch) {
  if (p.bits == 4) {
    run_q8_packed_bits<4>(p, n0, n1, scratch);
  } else {
    run_q8_packed_bits<8>(p, n0, n1, scratch);
  }
}

constexpr auto kRunQ8Gemm = &run_q8_gemm;
constexpr auto kRunQ8Packed = &run_q8_packed;
constexpr auto kQuantizeQ8 = &V::q8_quantize_block;
#else
constexpr void (*kRunQ8Gemm)(const Problem&, int, int, float*) = nullptr;
constexpr void (*kRunQ8Packed)(const Problem&, int, int, float*) = nullptr;
constexpr int32_t (*kQuantizeQ8)(const float*, bool, int8_t*, float*) = nullptr;
#endif

#if defined(QMM_Q8_SPLIT)
constexpr int kQ8SplitBlocks = V::Q8S_BLOCKS;
#else
constexpr int kQ8SplitBlocks = 0;
#endif

const Kernels kKernels{QMM_ISA, V::W, &run, V::NR_WIDE, V::DIRECT_ROWS, MG, NC, &run_q8,
                       kRunQ8Gemm, kRunQ8Packed, kQuantizeQ8, &pack_x_tile, kQ8SplitBlocks};

}  // namespace
}  // namespace mlxrt::qmm::QMM_NS

#undef QMM_UNROLL
