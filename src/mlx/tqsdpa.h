// Attention over a TurboQuant KV cache (src/cache/turbo.rs) as one MLX
// custom primitive for the CPU: scores straight from the int8 / packed keys,
// softmax and the value sum in the rotated domain (codebook lookups times the
// RMS scales) in one pass per chunk of keys, chunks spread over the quantized
// matmul's pool by qsdpa's flash-decoding split. Kernels in tqsdpa_impl.h;
// bridged to Rust by tqsdpa_sys.rs, safe API in tqsdpa.rs.
#pragma once

#include <array>
#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/tqsdpa_kernels.h"
#include "rust/cxx.h"

namespace mlxrt::tqsdpa {

using mlx::core::array;
using qsdpa::Isa;
using qsdpa::MaskKind;
using qsdpa::TurboKernels;

// Inputs: q [B, Hq, L, D] f32; keys: indices [B, H, T, D] int8 (8 bits) or
// [B, H, T, D * bits / 8] uint8, scales and zeros [B, H, T, D / 32] f16;
// values: indices [B, H, T, Dv * bits / 8] uint8, scales [B, H, T, Dv / 32]
// f16; for a Bool mask the mask broadcast to [B, 1 or H, L, T]. Output
// [B, Hq, L, Dv] f32 in the rotated value domain. CPU only.
class TurboSdpa : public mlx::core::UnaryPrimitive {
 public:
  TurboSdpa(mlx::core::Stream s, float scale, int key_bits, int value_bits,
            const std::array<float, 16>& book, MaskKind mask, const TurboKernels* k)
      : UnaryPrimitive(s),
        scale_(scale),
        key_bits_(key_bits),
        value_bits_(value_bits),
        book_(book),
        mask_(mask),
        kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "TurboSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  int key_bits_, value_bits_;
  std::array<float, 16> book_;
  MaskKind mask_;
  const TurboKernels* kernels_;
};

// ---- bridged to Rust (tqsdpa_sys.rs) ----

// The primitive's output node, or null when it does not apply (default
// device not the CPU, bit widths, dtypes, shapes or a mask it does not
// handle: the caller then uses the MLX-op composition). `book`: the
// 2^value_bits codebook centroids. `mask_kind`: 0 none, 1 causal, 2 the bool
// array `mask` (any other dtype: null). `isa` as for the quantized matmul.
std::unique_ptr<array> turbo_sdpa(const array& q, const array& ki, const array& ks,
                                  const array& kz, const array& vi, const array& vs,
                                  rust::Slice<const float> book, int32_t key_bits,
                                  int32_t value_bits, float scale, uint8_t mask_kind,
                                  const array& mask, uint8_t isa);
// The `Isa` code of the kernel that computes `a`, or 0 if `a` is not the
// output of a TurboSdpa.
uint8_t tqsdpa_node_isa(const array& a);

}  // namespace mlxrt::tqsdpa
