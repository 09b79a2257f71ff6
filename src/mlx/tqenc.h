// The TurboQuant KV encoder (src/cache/turbo.rs) as one MLX custom primitive
// for the CPU: new keys and values [B, H, L, D] in, the cache's five planes
// out. The MLX-op composition it replaces (`TurboCodec::encode`) takes some
// 60 graph nodes per layer and token, which made a decode step's encode cost
// more than its attention. Also the inverse value rotation of the attention
// output (two nodes) as one. Both repeat MLX's CPU arithmetic operation for
// operation, so the bits are MLX's (tqenc.cc; tested in tqenc_tests.rs).
// Bridged to Rust by tqenc_sys.rs; safe API in tqenc.rs.
#pragma once

#include <memory>
#include <vector>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/shim.h"
#include "rust/cxx.h"

namespace mlxrt::tqenc {

using mlx::core::array;
using mlxrt::ArrVec;

// Inputs {k [B, H, L, Dk], v [B, H, L, Dv]}, f32, any strides. Outputs: key
// indices int8 [B, H, L, Dk] (8 bits) or uint8 [.., Dk * key_bits / 8], key
// scales and zeros f16 [.., Dk / 32], value indices uint8
// [.., Dv * value_bits / 8], value scales f16 [.., Dv / 32].
class TurboEncode : public mlx::core::Primitive {
 public:
  TurboEncode(mlx::core::Stream s, int key_bits, int value_bits, float norm,
              std::vector<float> signs, std::vector<float> boundaries)
      : Primitive(s),
        key_bits_(key_bits),
        value_bits_(value_bits),
        norm_(norm),
        signs_(std::move(signs)),
        boundaries_(std::move(boundaries)) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override { return "TurboEncode"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int key_bits_, value_bits_;
  float norm_;
  std::vector<float> signs_, boundaries_;
};

// hadamard_transform(y, norm) * signs along the last axis of y [.., D] (f32,
// any strides): the value rotation's inverse.
class TurboUnrotate : public mlx::core::UnaryPrimitive {
 public:
  TurboUnrotate(mlx::core::Stream s, float norm, std::vector<float> signs)
      : UnaryPrimitive(s), norm_(norm), signs_(std::move(signs)) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "TurboUnrotate"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float norm_;
  std::vector<float> signs_;
};

// ---- bridged to Rust (tqenc_sys.rs) ----
// Each returns null where the primitive does not apply (default device not
// the CPU, inputs not f32, widths or shapes outside the codec's): the caller
// then uses the MLX ops.

// `TurboCodec::encode(k, v)`: the five planes in that order. `signs`: the
// value sign table (Dv entries); `boundaries`: the 2^value_bits - 1 codebook
// boundaries, ascending; `norm` = 1 / sqrt(Dv).
std::unique_ptr<ArrVec> turbo_encode(const array& k, const array& v, int32_t key_bits,
                                     int32_t value_bits, float norm, rust::Slice<const float> signs,
                                     rust::Slice<const float> boundaries);
// `TurboCodec::unrotate(y)`.
std::unique_ptr<array> turbo_unrotate(const array& y, float norm, rust::Slice<const float> signs);
// Whether `a` is an output of one of the primitives above.
bool is_tqenc_node(const array& a);

}  // namespace mlxrt::tqenc
