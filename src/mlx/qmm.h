// A fast quantized matmul for MLX's CPU device, as an MLX custom primitive,
// plus a few CPU-backend queries (which BLAS MLX's matmul resolved to).
// Bridged to Rust by qmm_sys.rs; the safe API is in qmm.rs.
#pragma once

#include <memory>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlxrt/src/mlx/qmm_kernels.h"
#include "rust/cxx.h"

namespace mlxrt::qmm {

using mlx::core::array;

// out = x @ dequant(w).T for affine-quantized w (4 or 8 bits, group 32, 64 or
// 128, f32/f16/bf16 scales and biases) with x in f32 and any leading batch
// dimensions. CPU only: `eval_gpu` throws, and `fast_quantized_matmul` never
// builds this primitive for another device.
class FastQuantizedMatmul : public mlx::core::UnaryPrimitive {
 public:
  // `q8`: quantize x to int8 per block of 32 and run `Kernels::run_q8`.
  // `packed`: the weights are packed column panels (see Problem::packed;
  // implies q8).
  FastQuantizedMatmul(mlx::core::Stream s, int group, int bits, const Kernels* k, bool q8,
                      bool packed = false)
      : UnaryPrimitive(s), group_(group), bits_(bits), kernels_(k), q8_(q8), packed_(packed) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override { return "FastQuantizedMatmul"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

  Isa isa() const { return kernels_->isa; }
  bool int8_x() const { return q8_; }

 private:
  int group_, bits_;
  const Kernels* kernels_;
  bool q8_, packed_;
};

// ---- bridged to Rust (qmm_sys.rs) ----

// `quantized_matmul(x, w, scales, biases, transpose=true, group, bits)`: the
// primitive above when the default device is the CPU and the case is
// supported, MLX's own op otherwise. `isa` is an `Isa` code; Auto picks the
// best the CPU has; naming one the CPU lacks is an error. `int8_x`: int8
// activations (x quantized per block of 32, integer dot products; AVX-512
// without VNNI runs AVX2's kernel).
std::unique_ptr<array> fast_quantized_matmul(const array& x, const array& w,
                                             const array& scales, const array& biases,
                                             int32_t group_size, int32_t bits, uint8_t isa,
                                             bool int8_x);
// The same for a symmetric format (GGUF's Q4_0 and Q8_0), whose biases are
// not stored: each is -2^(bits-1) times its scale. The primitive computes
// them as it converts the scales; MLX's op (other devices, other cases) gets
// them as a lazy product of the scales.
std::unique_ptr<array> fast_quantized_matmul_symmetric(const array& x, const array& w,
                                                       const array& scales, int32_t group_size,
                                                       int32_t bits, uint8_t isa, bool int8_x);
// 4- or 8-bit weights packed at load into column panels (see
// Problem::packed: w [N/32, K/32, bits, 32] uint32 words, scales and biases
// [N/32, K/group, 32]) times x with int8 activations: the primitive on the
// CPU where `packed_weights_usable()`; elsewhere the unpacked arrays.
std::unique_ptr<array> fast_quantized_matmul_packed(const array& x, const array& w,
                                                    const array& scales, const array& biases,
                                                    int32_t group_size);
// The same for a symmetric format (biases implied by the scales).
std::unique_ptr<array> fast_quantized_matmul_packed_symmetric(const array& x, const array& w,
                                                              const array& scales,
                                                              int32_t group_size);
// Whether packed `bits`-bit panels run here: the default device is the
// CPU and its best int8 kernel runs them (AVX-512 VNNI).
bool packed_weights_usable(int32_t bits);
// Output columns per packed panel.
constexpr int kPackedCols = 32;
// The best instruction set this CPU runs (an `Isa` code, never Auto).
uint8_t best_isa();
bool isa_available(uint8_t isa);
// Whether the best int8-activation kernel has an int8 GEMM (AVX-512 VNNI).
bool int8_gemm_available();
// Set in fast_node_isa's answer for an int8-activation node.
constexpr uint8_t kInt8Flag = 0x80;
// The `Isa` code of the kernel that computes `a` (| kInt8Flag with int8
// activations), or 0 if `a` is not the output of a FastQuantizedMatmul.
uint8_t fast_node_isa(const array& a);
// Threads the kernel's pool uses (including the calling thread).
size_t pool_threads();
// Calls fn(ctx, i) for i in [0, n) on that pool and the calling thread (for
// mlxrt's other CPU primitives, e.g. qsdpa.cc); returns when all are done.
void pool_for(int n, void (*fn)(void*, int), void* ctx);

// The file of the library MLX's dense CPU matmul gets `cblas_sgemm` from
// (the first loaded object defining it, see qmm.cc); empty if none.
rust::String blas_library();
// OpenBLAS's thread count, or -1 when the BLAS is not OpenBLAS.
int32_t blas_threads();

}  // namespace mlxrt::qmm
