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

// ---- shared with the float attention (fattn.cc) ----

// A 4-D array of 4-byte elements as the kernels read it: each (b, h) block
// of rows dense (true of a KV cache sliced along T from a larger buffer),
// any strides between blocks. Anything else is copied dense first.
struct Rows {
  const uint8_t* data;
  int64_t bh[2];  // elements between consecutive b, h
  std::vector<uint32_t> copy;

  explicit Rows(const array& a);
};

// A float buffer of n floats starting on a cache line (see qmm.cc).
float* aligned(std::vector<float>& buf, size_t n);

// The same choice as the quantized matmul: Auto is the best variant the CPU
// runs (capped by MLXRT_QMM_ISA); naming one it cannot run is an error.
Isa select_isa(uint8_t code);

// q [B, Hq, L, D] f32 (any strides) times `scale` as the kernels read it:
// [B][H][rep * L][D], the rows of each kv head together; for 4-bit keys
// permuted in blocks of 2 * lanes like their nibbles. Lives in `buf`.
const float* scaled_queries(const array& q, int H, float scale, int bits, int lanes,
                            std::vector<float>& buf);

// Points `p` (mask Bool or Additive) at `mask` [B, 1 or H, L, T] (bool, or
// f32 added to the scores).
void point_mask(Problem& p, const array& mask);

// Appends a mask (rank <= 4, padded on the left to [B or 1, 1 or H, L or
// 1, T or 1]) to `inputs` as the kernels read it: broadcast to
// [B, 1 or H, L, T], bool, or any other dtype as f32 to add. Returns its
// kind, or None (nothing appended) for a mask they do not take.
MaskKind push_mask(array m, int B, int H, int L, int T, std::vector<array>& inputs);

// Attention of `p` with kernels `k` into `out` [B, H * rep, L, v.dim]:
// (b, kv head, block of k->rows query rows) tasks over the quantized
// matmul's thread pool, the keys split further (flash-decoding partials,
// merged with online-softmax rescaling) when there are few row blocks.
void run(const Problem& p, const Kernels* k, int rep, float* out);

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
