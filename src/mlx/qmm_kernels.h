// Interface between the quantized-matmul primitive (qmm.cc) and its SIMD
// kernels (qmm_impl.h, instantiated once per instruction set by
// qmm_avx512.cc, qmm_avx2.cc and qmm_portable.cc).
//
// This header is deliberately free of standard-library includes: the kernel
// files compile code for instruction sets the host may lack, and any inline
// library function instantiated there could be picked by the linker for the
// whole program (an ODR hazard). Only plain structs and declarations here.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace mlxrt::qmm {

// The element type of scales and biases (both always share one type).
enum class ScaleType : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

// Instruction sets, best last. Codes are shared with `QmmIsa` in qmm_sys.rs.
enum class Isa : uint8_t { Auto = 0, Portable = 1, Avx2 = 2, Avx512 = 3 };

// One quantized matmul: out[M, N] = x[M, K] @ dequant(w)[N, K]^T, with
// dequant(w)[n, k] = scale[n, k / group] * q[n, k] + bias[n, k / group] and
// q packed little-end-first into uint32 words (MLX's affine layout).
struct Problem {
  // x in f32. For 4-bit weights it is *permuted* inside each block of
  // 2*lanes values ([lanes even k, lanes odd k]), matching the order in
  // which the kernel unpacks nibbles. On the direct path (`gemm` false) it is
  // row-major M x K; on the GEMM path it is packed in tiles of `Kernels::gemm_rows`
  // rows, each tile K x gemm_rows k-major (x[k][row], rows past M zero), so
  // the GEMM tile broadcasts from one sequential stream, and inside each
  // k-block of kBlockK (or the rest) class-major: the (permuted) k with
  // k % lanes == l stored together, classes in order, k in order within.
  const float* x;
  const uint8_t* w;       // N rows of K * bits / 8 bytes
  const void* scales;     // N x K/group
  // N x K/group, or null for a symmetric format (GGUF's Q4_0 and Q8_0):
  // then bias = -2^(bits-1) * scale, exactly what such files store.
  const void* biases;
  float* out;             // M x N, row-major
  int M, N, K;
  int group, bits;
  ScaleType stype;
  // Int8 activations (`run_q8` only): x quantized per block of 32 values,
  // xq = round(x / d) with d = max|x| / 127, permuted inside each block like
  // x above ([16 even k, 16 odd k]) for 4-bit weights; or, for 4-bit
  // weights on the dot-product path of a variant with `q8_split_blocks`, in
  // the split layout (`Q8Split`).
  const int8_t* xq = nullptr;      // M x K (+ kQ8Pad bytes); split: M x row_bytes(K)
  const float* xd8 = nullptr;      // M x K/32 blocks, each d 8 times; split: M x row_floats(K)
  const int32_t* xqsum = nullptr;  // M x K/32: sum of xq per block
  const float* xs = nullptr;       // M x xs_stride: sum of d * xq per weight group
  int xs_stride = 0;               // K / group rounded up to a multiple of 16
  // The GEMM path (x packed in tiles) rather than the direct one (x
  // row-major); both give the same bits, the choice is speed only.
  bool gemm = false;
  // Whether the direct path may use the variant's wide decode tiles (see
  // qmm_impl.h); the same bits either way.
  bool wide = true;
  // Weights packed at load into column panels (`run_q8_packed`): `w`
  // [N / gemm_cols][K / 32][bits][gemm_cols] words (word t of a column's
  // block: MLX's word t of that block), `scales` and `biases`
  // [N / gemm_cols][K / group][gemm_cols]. x as on the GEMM path.
  bool packed = false;
  // The packed tiles read a column tile's 4-bit weights unpacked to bytes
  // once per call (prefill sizes) instead of as nibbles; the same bits.
  bool unpack4 = false;
};

// Rows of x from which qmm.cc sets Problem::unpack4 (measured; see
// docs/cpu-kernels.md "Packed panels").
constexpr int kPackedUnpackRows = 32;

// Blocks of x that share one int8 scale.
constexpr int kQ8Block = 32;
// Bytes (and floats) of zeroed padding past the q8 buffers, so that a
// vector load of a whole chunk at the last block stays inside them.
constexpr int kQ8Pad = 64;

// The split layout of int8 x for 4-bit weights (`Kernels::q8_split_blocks`
// = B > 0): per row, chunks of B blocks of 32 values, each chunk the even-k
// bytes of its blocks (16 per block, block after block), then their odd-k
// bytes, so that a block's low and high nibbles meet their x in the same
// vector lanes; and per chunk 4 * B floats, each block's d 4 times. A row's
// last chunk may have fewer blocks: its other bytes and d's are zero.
struct Q8Split {
  int blocks;
  int chunks(int K) const { return (K / kQ8Block + blocks - 1) / blocks; }
  size_t chunk_bytes() const { return static_cast<size_t>(blocks) * kQ8Block; }
  size_t chunk_floats() const { return static_cast<size_t>(blocks) * 4; }
  size_t row_bytes(int K) const { return chunks(K) * chunk_bytes(); }
  size_t row_floats(int K) const { return chunks(K) * chunk_floats(); }
};

// What one instruction-set variant provides.
struct Kernels {
  Isa isa;
  int lanes;  // f32 lanes of one vector; a 4-bit block is 2*lanes values
  // Computes output columns [n0, n1) of `p` (n0 a multiple of `tile_n`, or
  // of `gemm_cols` on the GEMM path). `scratch` holds at least
  // `scratch_floats(p.K)` floats, private to the calling thread.
  void (*run)(const Problem& p, int n0, int n1, float* scratch);
  int tile_n;       // weight rows per register tile of the direct path (the widest)
  int direct_rows;  // up to this M, the direct path by default (x row-major)
  int gemm_rows;    // rows of x per GEMM tile (the packing of x past that)
  int gemm_cols;    // output columns per GEMM tile
  // The same with int8 activations (the q8 fields of `p`): per block of 32,
  // s_w * d_x * sum(q * xq) in exact integers, plus b_w * sum(d_x * xq).
  // Null when this variant has none (AVX-512 without VNNI uses AVX2's).
  void (*run_q8)(const Problem& p, int n0, int n1);
  // Int8 activations at GEMM sizes (`p.gemm`; columns in tiles of
  // `gemm_cols`, `scratch` as for `run`), the same arithmetic as `run_q8`
  // with the weights unpacked into a column-interleaved panel. Null when
  // this variant has none (then `run_q8` takes every M).
  void (*run_q8_gemm)(const Problem& p, int n0, int n1, float* scratch);
  // The same against weights packed at load (`p.packed`; N a multiple of
  // `gemm_cols`): no panel to fill per call, so it runs at every M
  // (`scratch` as for `run`: at prefill sizes a column tile's 4-bit weights
  // are unpacked there). Null where `run_q8_gemm` is.
  void (*run_q8_packed)(const Problem& p, int n0, int n1, float* scratch);
  // 32 contiguous values of x quantized for the int8 path, the same bytes
  // as the portable code in qmm.cc (`nibble_order`: stored [even k, odd k]);
  // returns sum(xq) and sets *d. Null: the portable code runs.
  int32_t (*quantize_q8_block)(const float* x, bool nibble_order, int8_t* dst, float* d);
  // One GEMM tile of x packed as `Problem::x` says: `rows` holds
  // `gemm_rows` pointers, each to K contiguous floats, or null for a
  // padding row (zeros); `dst` receives K * gemm_rows floats.
  void (*pack_x_tile)(const float* const* rows, int K, int bits, float* dst);
  // Blocks per chunk of the split layout in which `run_q8` takes x for
  // 4-bit weights (`Q8Split`), or 0: per block.
  int q8_split_blocks;
};

// Floats of per-thread scratch that `run` needs for a given K.
size_t scratch_floats(int K);

// The k-block over which both paths' accumulators are blocked (the same
// blocks, for batch invariance; see qmm_impl.h); a multiple of every
// supported group size. A GEMM panel of kBlockK x gemm_cols weights is
// 256 KB, in L2.
constexpr int kBlockK = 2048;
// Row stride of the dequantized rows a panel is transposed from: one cache
// line past kBlockK, so the rows do not all map to the same L1 sets.
constexpr int kGemmRowStride = kBlockK + 16;
// The GEMM path's cache blocking (qmm_impl.h, run_gemm): floats of panels
// filled at once (at least one kBlockK panel of the widest variant: 512 KB,
// in L2 with an x block), and floats of x per block of rows run against
// them (256 KB).
constexpr int kPanelCacheFloats = 1 << 17;
constexpr int kXBlockFloats = 1 << 16;
// Most f32 lanes of any variant (AVX-512), for sizing scratch.
constexpr int kMaxLanes = 16;
// Most rows of x in any variant's GEMM tile.
constexpr int kMaxGemmRows = 16;
// Rows of x the int8 path runs against one weight tile before moving on, so
// that the x block stays in L2.
constexpr int kBlockM = 64;
// Weight rows per register tile of the direct path (a variant's wide
// decode tile is a multiple, see qmm_impl.h).
constexpr int kPanelRows = 4;

// Per-instruction-set entry points; a variant that was not compiled for this
// target (e.g. AVX-512 on aarch64) is null.
const Kernels* kernels_avx512();
const Kernels* kernels_avx2();
const Kernels* kernels_portable();

}  // namespace mlxrt::qmm
