// Float scaled-dot-product attention (MLX's fast::scaled_dot_product_attention
// for f32 q, k, v) as one MLX custom primitive for the CPU: tiled over
// queries and keys, online softmax with a vectorized exp, causal and window
// bounds computed in the kernel (masked tiles skipped, no mask or score
// matrix in memory), flash-decoding key split for few query rows. It shares
// the quantized-KV attention's driver (qsdpa.cc: tasks over the quantized
// matmul's pool, partial merge) and vectors (qsdpa_kernels.cc); the kernel
// is fattn_impl.h. Bridged to Rust by fattn_sys.rs, safe API and the MLX
// fallback in fattn.rs.
#pragma once

#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/qsdpa_kernels.h"

namespace mlxrt::fattn {

using mlx::core::array;
using qsdpa::Isa;
using qsdpa::Kernels;
using qsdpa::MaskKind;

// Inputs: q [B, Hq, L, D], k [B, H, T, D], v [B, H, T, Dv] f32; for Bool /
// Additive masks a mask broadcast to [B, 1 or H, L, T] (bool, or f32 added to
// the scores). Output [B, Hq, L, Dv] f32, or with `merged` [B, L, Hq * Dv]
// (the heads side by side, as the output projection reads them). CPU only.
class FloatSdpa : public mlx::core::UnaryPrimitive {
 public:
  FloatSdpa(mlx::core::Stream s, float scale, MaskKind mask, int window, const Kernels* k,
            bool merged)
      : UnaryPrimitive(s), scale_(scale), mask_(mask), window_(window), kernels_(k),
        merged_(merged) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "FloatSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  MaskKind mask_;
  int window_;
  const Kernels* kernels_;
  bool merged_;
};

// ---- bridged to Rust (fattn_sys.rs) ----

// The primitive's output node, or null when it does not apply (default device
// not the CPU, dtypes, shapes or a mask it does not handle): the caller then
// uses MLX's own attention, which also reports invalid input. `mask_kind`: 0
// none, 1 causal (query i of L sees keys up to T - L + i, and with
// `window` > 0 only the last `window` of them), 2 the array `mask` (bool:
// false masks; any other dtype is added); `mask` is not read otherwise.
// `isa` as for the quantized matmul. `merged`: the output as [B, L, Hq * Dv].
std::unique_ptr<array> float_sdpa(const array& q, const array& k, const array& v, float scale,
                                  uint8_t mask_kind, const array& mask, int32_t window,
                                  uint8_t isa, bool merged);
// The `Isa` code of the kernel that computes `a`, or 0 if `a` is not the
// output of a FloatSdpa.
uint8_t fattn_node_isa(const array& a);

}  // namespace mlxrt::fattn
