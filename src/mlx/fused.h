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
#include "mlxrt/src/mlx/shim.h"
#include "rust/cxx.h"

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

// The residual add before a norm: outputs {x + y, rms_norm(x + y, w)}, the
// sum as MLX's f32 add gives it and the norm as FastRmsNorm (one node
// instead of two). Inputs {x, y, w}: f32, x and y of one shape (any
// strides), w [x.shape(-1)].
class FastAddRmsNorm : public mlx::core::Primitive {
 public:
  FastAddRmsNorm(mlx::core::Stream s, float eps) : Primitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override { return "FastAddRmsNorm"; }
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

// The heads of a packed projection x [B, L, C] (f32, any strides: the
// stacked q/k/v matmul's output): part i is the column range [col, col +
// heads * D) as [B, heads, L, D], optionally RMS-normed per head (as
// FastRmsNorm) and then rotated (as FastRope), in f32 or cast to the KV
// cache's f16 / bf16 (as MLX's astype rounds); one node instead of a slice,
// a reshape and a transpose per part, a RoPE per rotated part and a cast per
// cached part (a decode step's graph had ~13 nodes per layer for this).
// Inputs {x, inv_freqs},
// then offsets [B] (int32) if `has_offsets`, then the norm weights the parts
// name by input index.
class FastHeads : public mlx::core::Primitive {
 public:
  struct Part {
    int col, heads;
    bool rotate;
    int norm;  // input index of the per-head norm weight [D], or -1
    mlx::core::Dtype dtype;  // of the output: f32, f16 or bf16
  };
  FastHeads(mlx::core::Stream s, std::vector<Part> parts, int head_dim, int dims, bool traditional,
            float scale, int offset, bool has_offsets, float eps)
      : Primitive(s), parts_(std::move(parts)), head_dim_(head_dim), dims_(dims),
        traditional_(traditional), scale_(scale), offset_(offset), has_offsets_(has_offsets),
        eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override { return "FastHeads"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;
  const std::vector<Part>& parts() const { return parts_; }

 private:
  std::vector<Part> parts_;
  int head_dim_, dims_;
  bool traditional_;
  float scale_;
  int offset_;
  bool has_offsets_;
  float eps_;
};

// ---- bridged to Rust (fused_sys.rs) ----
// Each returns null when the primitive does not apply (another default
// device, or a dtype other than f32): the caller then uses MLX's op.

// `fast::rms_norm(x, w, eps)`.
std::unique_ptr<array> fused_rms_norm(const array& x, const array& w, float eps);
// {x + y, `fast::rms_norm(x + y, w, eps)`}.
std::unique_ptr<ArrVec> fused_add_rms_norm(const array& x, const array& y, const array& w,
                                           float eps);
// `fast::rope(x, dims, traditional, base, scale, offset)` (or with freqs),
// given the inverse frequencies MLX would compute (`rope_inv_freqs`).
std::unique_ptr<array> fused_rope(const array& x, int32_t dims, bool traditional, float scale,
                                  int32_t offset, const array& inv_freqs);
// The same with one start position per batch row (`offsets` [B]).
std::unique_ptr<array> fused_rope_at(const array& x, int32_t dims, bool traditional, float scale,
                                     const array& offsets, const array& inv_freqs);
// FastHeads: parts (cols[i], heads[i], rotate[i] != 0, output dtype code
// dtypes[i]: f32, f16 or bf16, else null is returned) of x, RoPE at
// `offset` or per row at `offsets` (null: none); `q_norm` / `k_norm` (null:
// none) normalize the first / second part per head with `eps` first.
std::unique_ptr<ArrVec> fused_heads(const array& x, rust::Slice<const int32_t> cols,
                                    rust::Slice<const int32_t> heads,
                                    rust::Slice<const uint8_t> rotate,
                                    rust::Slice<const uint8_t> dtypes, int32_t head_dim,
                                    int32_t dims, bool traditional, float scale, int32_t offset,
                                    const array* offsets, const array& inv_freqs,
                                    const array* q_norm, const array* k_norm, float eps);
// The inverse frequencies of MLX's RoPE, by MLX's own ops (so with its exp):
// exp(arange(0, -dims/2, -1) * (log(base) / (dims/2))).
std::unique_ptr<array> rope_inv_freqs(int32_t dims, float base);
// 1 / freqs, for RoPE with explicit frequencies.
std::unique_ptr<array> rope_inv_freqs_of(const array& freqs);
// Whether `a` is the output of one of the primitives above.
bool is_fused_node(const array& a);

}  // namespace mlxrt::fused
