// SwiGLU, `silu(gate) * up`, as one MLX custom primitive for f32 on the CPU
// (vectorized kernels in swiglu_kernels.cc). Bridged to Rust by
// swiglu_sys.rs; the safe API is in swiglu.rs.
#pragma once

#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/swiglu_kernels.h"

namespace mlxrt::swiglu {

// Element offset of row `r` (all axes but the last) of an array view (also
// used by the RMSNorm / RoPE primitives, fused.cc).
inline int64_t row_offset(const mlx::core::Shape& shape, const mlx::core::Strides& strides,
                          int64_t r) {
  int64_t off = 0;
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    off += (r % shape[d]) * strides[d];
    r /= shape[d];
  }
  return off;
}

using mlx::core::array;

// out = gate * sigmoid(gate) * up, bit-identical to MLX's CPU composition.
// Inputs: {gate, up} of one shape, or (packed) {gu} whose last axis holds
// gate then up (out has half its last axis). f32, any strides. CPU only:
// `eval_gpu` throws, and the builders below never make it for another device.
class FastSwiGlu : public mlx::core::UnaryPrimitive {
 public:
  FastSwiGlu(mlx::core::Stream s, bool packed, const Kernels* k)
      : UnaryPrimitive(s), packed_(packed), kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "FastSwiGlu"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  bool packed_;
  const Kernels* kernels_;
};

// ---- bridged to Rust (swiglu_sys.rs) ----

// `multiply(multiply(gate, sigmoid(gate)), up)`: the primitive when the
// default device is the CPU and both are f32 arrays of one shape, MLX's ops
// otherwise (other dtypes broadcast and promote as MLX does). `isa` is an
// `Isa` code as for the quantized matmul (Auto = the best this CPU runs).
std::unique_ptr<array> fast_swiglu(const array& gate, const array& up, uint8_t isa);
// The same with gate = gu[..., :F] and up = gu[..., F:] (F = half the last
// axis, which must be even), without slicing nodes on the fast path.
std::unique_ptr<array> fast_swiglu_packed(const array& gu, uint8_t isa);
// The `Isa` code of the kernel that computes `a`, or 0 if `a` is not the
// output of a FastSwiGlu.
uint8_t swiglu_node_isa(const array& a);

}  // namespace mlxrt::swiglu
