// Attention over an affine-quantized KV cache (mlx-lm's
// quantized_scaled_dot_product_attention) as one MLX custom primitive for the
// CPU: scores from the packed keys, softmax and the value sum in one pass per
// chunk of keys, chunks spread over the quantized matmul's thread pool
// (flash-decoding partials, merged at the end). Kernels in qsdpa_impl.h;
// bridged to Rust by qsdpa_sys.rs, safe API (and the MLX-op composition used
// everywhere else) in qsdpa.rs.
#pragma once

#include <memory>
#include <vector>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/qsdpa_kernels.h"

namespace mlxrt::qsdpa {

using mlx::core::array;

// Inputs: q [B, Hq, L, D] f32; key planes w [B, H, T, D * bits / 32] uint32,
// scales and biases [B, H, T, D / group] f32; the value planes likewise (Dv);
// for Bool / Additive masks a mask broadcast to [B, 1 or H, L, T] (bool, or
// f32 added to the scores). Output [B, Hq, L, Dv] f32. CPU only.
class QuantizedSdpa : public mlx::core::UnaryPrimitive {
 public:
  QuantizedSdpa(mlx::core::Stream s, float scale, int group, int bits, MaskKind mask,
                const Kernels* k)
      : UnaryPrimitive(s), scale_(scale), group_(group), bits_(bits), mask_(mask), kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "QuantizedSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  int group_, bits_;
  MaskKind mask_;
  const Kernels* kernels_;
};

// ---- shared with the TurboQuant (tqsdpa.cc) and float (fattn.cc) attention ----

// A 4-D array as the kernels read it: each (b, h) block of rows dense (true
// of a KV cache sliced along T from a larger buffer), any strides between
// blocks. Anything else is copied dense first.
struct Rows {
  const uint8_t* data;
  int64_t bh[2];  // elements between consecutive b, h
  std::vector<uint8_t> copy;

  explicit Rows(const array& a);
};

// A float buffer of n floats starting on a cache line, inside `buf` (grown
// when too small, never shrunk; its contents are not reset).
float* aligned(std::vector<float>& buf, size_t n);

// q [B, Hq, L, D] f32 times `scale`, as [B][H][rep * L][D] dense in `buf`
// (rows of each kv head together, in Split's row order); value d of a row
// at pos[d] (null: d).
float* group_queries(const array& q, int H, float scale, const int* pos, std::vector<float>& buf);

// Attention of M = rep * L query rows per (b, kv head) over T keys (or
// lens[b]), chunk by
// chunk over the quantized matmul's pool (flash decoding: per-task partial
// softmax sums, merged at the end). Row m of kv head h is query head
// h * rep + m / L at position m % L; the output is [B, H * rep, L, dv], or
// with `heads_last` [B, L, H * rep, dv] (the layout the output projection
// reads, so no transpose follows).
struct Split {
  int B, H, M, L, T, dv;
  int rows;           // query rows per chunk call at most
  bool causal;        // row m sees keys up to T - L + m % L: later chunks are skipped
  size_t scratch;     // floats of per-thread scratch `chunk` needs
  int chunk_keys;     // keys per chunk call at most
  // As Kernels::chunk, for rows [m0, m0 + rows) of (b, h) and keys [t0, t1).
  void (*chunk)(const void* ctx, int b, int h, int m0, int rows, int t0, int t1, float* scratch,
                float* acc, float* mx, float* sum);
  const void* ctx;
  const int* order;   // order[d]: index of output value d in `acc`; null: d
  int rep;
  float* out;
  int window = 0;     // causal only: a row sees its last `window` keys (0: all)
  // Keys of batch row b: lens[b] (<= T) instead of T, for the causal bounds
  // and the end (null: every row has T). Paged KV: rows of many lengths.
  const int32_t* lens = nullptr;
  bool heads_last = false;
};
void flash_attention(const Split& s);

// Whether float attention transposes the keys first (`Problem::keys_t`):
// many rows per kv head (prefill) read every key many times, and the scores
// become a register-tiled product. Transposing costs about what ~64 query
// positions gain (Zen 4, SmolLM2 at T = 450: a speculative verify step of
// 6..32 positions was 2-3 ms per forward slower with it); decode reads the
// keys once. fattn and paged attention decide alike, so a row gives the
// same bits through either.
inline bool transpose_keys(const Problem& p, int rows) { return p.M >= 2 * rows && p.L >= 64; }

// Attention of `p` with kernels `k` into `out` [B, H * rep, L, v.dim]: a
// Split whose chunks are `k->chunk` (values back from the kernels' order).
void run(const Problem& p, const Kernels* k, int rep, float* out);

// The instruction set an `Isa` code asks for (Auto: the best this CPU
// runs); throws if the CPU cannot run it.
Isa select_isa(uint8_t code);

// Appends a mask (rank <= 4, padded on the left to [B or 1, 1 or H, L or
// 1, T or 1]) to `inputs` as the kernels read it: broadcast to
// [B, 1 or H, L, T], bool, or any other dtype as f32 to add. Returns its
// kind, or None (nothing appended) for a mask they do not take.
MaskKind push_mask(array m, int B, int H, int L, int T, std::vector<array>& inputs);
// The mask input for `mask_kind` (as `quantized_sdpa` takes it): sets
// `kind` and, for an array mask, appends it with push_mask; false for a
// mask shape the kernels do not take.
bool mask_input(uint8_t mask_kind, const array& mask, int B, int H, int Hq, int L, int T,
                MaskKind& kind, std::vector<array>& inputs);
// Points `p`'s mask fields at that appended mask (for Bool / Additive).
void set_mask(Problem& p, const array& mask);

// The `Isa` code of the kernel of primitive P that computes `a`, or 0 if
// `a` is not the output of a P.
template <class P>
uint8_t node_isa(const array& a) {
  if (!a.has_primitive()) return 0;
  auto* p = dynamic_cast<P*>(&a.primitive());
  return p ? static_cast<uint8_t>(p->isa()) : 0;
}

// ---- bridged to Rust (qsdpa_sys.rs) ----

// The primitive's output node, or null when it does not apply (default device
// not the CPU, dtypes, shapes or a mask it does not handle): the caller then
// uses the MLX-op composition, which also reports invalid input. `mask_kind`:
// 0 none, 1 causal, 2 the array `mask` (bool: false masks; any other dtype is
// added); `mask` is not read otherwise. `isa` as for the quantized matmul.
std::unique_ptr<array> quantized_sdpa(const array& q, const array& kw, const array& ks,
                                      const array& kb, const array& vw, const array& vs,
                                      const array& vb, float scale, uint8_t mask_kind,
                                      const array& mask, int32_t group_size, int32_t bits,
                                      uint8_t isa);
// The `Isa` code of the kernel that computes `a`, or 0 if `a` is not the
// output of a QuantizedSdpa.
uint8_t qsdpa_node_isa(const array& a);

}  // namespace mlxrt::qsdpa
