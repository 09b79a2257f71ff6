// Paged KV on the CPU: attention whose keys and values live in a block pool
// ([num_blocks, H, block, X] per plane) and are found through each row's
// block table, and the write of new positions into such a pool (in place
// when MLX lets the pool's buffer be donated).
//
// The attention reuses the float, affine and TurboQuant attention's SIMD
// kernels (fattn_impl.h, qsdpa_impl.h, tqsdpa_impl.h) unchanged: the shared driver (qsdpa.cc's flash_attention) splits keys into
// chunks that never cross a block, gives every row its own length, and the
// chunk callback here rebases the problem onto the chunk's block (every
// plane's pointer at that block, T and the transposed keys shifted by the
// block's first position), so causal and window bounds stay right.
// Bridged to Rust by paged_sys.rs; safe API and the MLX-op fallback in
// paged.rs.
#pragma once

#include <array>
#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/qsdpa_kernels.h"
#include "mlxrt/src/mlx/tqsdpa_kernels.h"
#include "rust/cxx.h"

namespace mlxrt::paged {

using mlx::core::array;
using qsdpa::Isa;
using qsdpa::Kernels;
using qsdpa::TurboKernels;

// Inputs: q [B, Hq, L, D] f32; key and value pools [N, H, bs, D] and
// [N, H, bs, Dv] f32; table [B, max_blocks] int32 (row b's logical block j
// is pool block table[b][j]); lens [B] int32 (keys row b holds, its L new
// ones included). Causal: query l of row b sees keys up to lens[b] - L + l
// (and with `window` > 0 only its last `window`); else all lens[b] keys. A
// query that sees no key (a batch row's padding) averages the row's keys; a
// row of length 0 gives zeros. Output [B, Hq, L, Dv] f32. CPU only. A table
// entry outside [0, N) or a length outside [0, max_blocks * bs] makes that
// row's output NaN, except -1 for a block wholly behind the window of every
// query of the row (a sliding layer's released block, never read).
class PagedFloatSdpa : public mlx::core::UnaryPrimitive {
 public:
  PagedFloatSdpa(mlx::core::Stream s, float scale, bool causal, int window, const Kernels* k)
      : UnaryPrimitive(s), scale_(scale), causal_(causal), window_(window), kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "PagedFloatSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  bool causal_;
  int window_;
  const Kernels* kernels_;
};

// The same over affine-quantized pools (MLX's layout, as QuantizedSdpa):
// inputs q; key words [N, H, bs, D * bits / 32] uint32, scales and biases
// [N, H, bs, D / group] f32; the value planes likewise (Dv); table; lens.
class PagedQuantizedSdpa : public mlx::core::UnaryPrimitive {
 public:
  PagedQuantizedSdpa(mlx::core::Stream s, float scale, int group, int bits, bool causal,
                     int window, const Kernels* k)
      : UnaryPrimitive(s), scale_(scale), group_(group), bits_(bits), causal_(causal),
        window_(window), kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "PagedQuantizedSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  int group_, bits_;
  bool causal_;
  int window_;
  const Kernels* kernels_;
};

// The same over TurboQuant pools (src/cache/turbo.rs's planes, as
// TurboSdpa reads them): inputs q; key indices [N, H, bs, D] int8 (8 bits)
// or [N, H, bs, D * bits / 8] uint8, key scales and zeros [N, H, bs, D / 32]
// f16, value indices [N, H, bs, Dv * bits / 8] uint8, value scales
// [N, H, bs, Dv / 32] f16; table; lens. Output in the rotated value domain.
class PagedTurboSdpa : public mlx::core::UnaryPrimitive {
 public:
  PagedTurboSdpa(mlx::core::Stream s, float scale, int key_bits, int value_bits,
                 const std::array<float, 16>& book, bool causal, int window,
                 const TurboKernels* k)
      : UnaryPrimitive(s), scale_(scale), key_bits_(key_bits), value_bits_(value_bits),
        book_(book), causal_(causal), window_(window), kernels_(k) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "PagedTurboSdpa"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }

 private:
  float scale_;
  int key_bits_, value_bits_;
  std::array<float, 16> book_;
  bool causal_;
  int window_;
  const TurboKernels* kernels_;
};

// Inputs: pool [N, H, bs, X], rows [n, X] of its dtype, dest [n] int32 (a
// row of the pool viewed as [N * H * bs, X]). Output: the pool with those
// rows replaced, in the pool's own buffer when it can be donated (no other
// reference), else in a copy. Destinations outside the pool are skipped
// (the caller validates them).
class PagedWrite : public mlx::core::UnaryPrimitive {
 public:
  explicit PagedWrite(mlx::core::Stream s) : UnaryPrimitive(s) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "PagedWrite"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return dynamic_cast<const PagedWrite*>(&other) != nullptr;
  }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override {
    return {inputs[0].shape()};
  }
};

// ---- bridged to Rust (paged_sys.rs) ----

// The primitive's output node, or null when it does not apply (default
// device not the CPU, dtypes, shapes, head sizes the kernels do not take):
// the caller then uses the MLX-op fallback. `isa` as for the quantized
// matmul.
std::unique_ptr<array> paged_float_sdpa(const array& q, const array& k_pool, const array& v_pool,
                                        const array& table, const array& lens, float scale,
                                        bool causal, int32_t window, uint8_t isa);
// As paged_float_sdpa over affine pools (`group` 32, 64 or 128, `bits` 4
// or 8); null where the kernels do not apply.
std::unique_ptr<array> paged_quantized_sdpa(const array& q, const array& kw, const array& ks,
                                            const array& kb, const array& vw, const array& vs,
                                            const array& vb, const array& table,
                                            const array& lens, float scale, bool causal,
                                            int32_t window, int32_t group, int32_t bits,
                                            uint8_t isa);
// As paged_float_sdpa over TurboQuant pools (`book`: the 2^value_bits
// centroids), in the rotated value domain; null where the kernels do not
// apply (widths, dtypes, shapes: the caller gathers and uses MLX ops).
std::unique_ptr<array> paged_turbo_sdpa(const array& q, const array& ki, const array& ks,
                                        const array& kz, const array& vi, const array& vs,
                                        const array& table, const array& lens,
                                        rust::Slice<const float> book, int32_t key_bits,
                                        int32_t value_bits, float scale, bool causal,
                                        int32_t window, uint8_t isa);
// `pool` with rows `rows` written at `dest` (see PagedWrite): the primitive
// on the CPU, else (or with `stock`) MLX's scatter.
std::unique_ptr<array> paged_write(const array& pool, const array& rows, const array& dest, bool stock);
// The address of an evaluated array's data (tests: a write in place keeps it).
uint64_t paged_data_address(const array& a);
// The `Isa` code of the kernel that computes `a`, or 0 if `a` is not the
// output of a PagedFloatSdpa.
uint8_t paged_node_isa(const array& a);
// The same for PagedQuantizedSdpa.
uint8_t paged_q_node_isa(const array& a);
// The same for PagedTurboSdpa.
uint8_t paged_t_node_isa(const array& a);

}  // namespace mlxrt::paged
