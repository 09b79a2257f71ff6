// RMSNorm and RoPE as single MLX primitives for f32 on the CPU, where MLX
// builds both from generic ops (about 7 nodes per RMSNorm and 20 per RoPE:
// the CPU backend has no kernel for `fast::rms_norm` / `fast::rope`). A decode
// step of a 30-layer model holds some 90 of these calls, so their nodes made
// up most of the graph MLX walks and dispatches per token. Bridged to Rust
// by fused_sys.rs; the safe API is in fused.rs.
#pragma once

#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mlxrt::fused {

using mlx::core::array;

// x * rsqrt(mean(x^2, -1) + eps) * w over the last axis: MLX's CPU
// composition repeated operation for operation (see fused.cc). Inputs
// {x, w}: f32, x of any shape and strides, w of shape [x.shape(-1)].
class FastRmsNorm : public mlx::core::UnaryPrimitive {
 public:
  FastRmsNorm(mlx::core::Stream s, float eps) : UnaryPrimitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "FastRmsNorm"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float eps_;
};

// Rotary embedding of x [B, ..., T, D] (f32, any strides) over its first
// `dims` features for positions (offset + t) * scale, with inverse
// frequencies inv_freqs [dims / 2] (f32). Inputs {x, inv_freqs} with the
// offset a constant, or {x, inv_freqs, offsets} with offsets [B] (int32),
// one start per batch row.
class FastRope : public mlx::core::UnaryPrimitive {
 public:
  FastRope(mlx::core::Stream s, int dims, bool traditional, float scale, int offset)
      : UnaryPrimitive(s), dims_(dims), traditional_(traditional), scale_(scale), offset_(offset) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "FastRope"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int dims_;
  bool traditional_;
  float scale_;
  int offset_;
};

// ---- bridged to Rust (fused_sys.rs) ----
// Each returns null when the primitive does not apply (another default
// device, or a dtype other than f32): the caller then uses MLX's op.

// `fast::rms_norm(x, w, eps)`.
std::unique_ptr<array> fused_rms_norm(const array& x, const array& w, float eps);
// `fast::rope(x, dims, traditional, base, scale, offset)` (or with freqs),
// given the inverse frequencies MLX would compute (`rope_inv_freqs`).
std::unique_ptr<array> fused_rope(const array& x, int32_t dims, bool traditional, float scale,
                                  int32_t offset, const array& inv_freqs);
// The same with one start position per batch row (`offsets` [B]).
std::unique_ptr<array> fused_rope_at(const array& x, int32_t dims, bool traditional, float scale,
                                     const array& offsets, const array& inv_freqs);
// The inverse frequencies of MLX's RoPE, by MLX's own ops (so with its exp):
// exp(arange(0, -dims/2, -1) * (log(base) / (dims/2))).
std::unique_ptr<array> rope_inv_freqs(int32_t dims, float base);
// 1 / freqs, for RoPE with explicit frequencies.
std::unique_ptr<array> rope_inv_freqs_of(const array& freqs);
// Whether `a` is the output of one of the primitives above.
bool is_fused_node(const array& a);

}  // namespace mlxrt::fused
