#include "mlxrt/src/mlx/swiglu.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/pool.h"
#include "mlxrt/src/mlx/qmm.h"

namespace mx = mlx::core;

namespace mlxrt::swiglu {

namespace {

const Kernels* compiled(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return kernels_avx512();
    case Isa::Avx2: return kernels_avx2();
    case Isa::Portable: return kernels_portable();
    default: return nullptr;
  }
}

// The same choice as the quantized matmul: Auto is the best variant the CPU
// runs (capped by MLXRT_QMM_ISA); naming one it cannot run is an error.
const Kernels* select_kernels(uint8_t code) {
  if (code > static_cast<uint8_t>(Isa::Avx512))
    throw std::invalid_argument("unknown instruction set code " + std::to_string(code));
  if (code == static_cast<uint8_t>(Isa::Auto)) code = qmm::best_isa();
  const Kernels* k = qmm::isa_available(code) ? compiled(static_cast<Isa>(code)) : nullptr;
  if (!k) throw std::invalid_argument("this CPU or build cannot run the requested instruction set");
  return k;
}

// What eval_cpu's task needs to walk the inputs.
struct View {
  const float* data;
  mx::Shape shape;
  mx::Strides strides;
};

// `n` values of a row with stride `step`, as a dense pointer (copied into
// `buf` when `step` is not 1).
const float* dense_row(const float* p, int64_t step, int64_t n, std::vector<float>& buf) {
  if (step == 1) return p;
  buf.resize(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i * step];
  return buf.data();
}

array composition(const array& g, const array& u) {
  return mx::multiply(mx::multiply(g, mx::sigmoid(g)), u);
}

bool runs_here(const array& a) {
  return mx::default_device() == mx::Device::cpu && a.dtype() == mx::float32 && a.ndim() >= 1 &&
         a.size() > 0;
}

}  // namespace

void FastSwiGlu::eval_cpu(const std::vector<array>& inputs, array& out) {
  for (auto& a : inputs)
    if (a.dtype() != mx::float32) throw std::invalid_argument("FastSwiGlu: inputs must be f32");
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);

  const int64_t d = out.shape(-1);
  const int64_t rows = static_cast<int64_t>(out.size()) / d;
  const array& g = inputs[0];
  const array& u = packed_ ? inputs[0] : inputs[1];
  // Fast case: two dense arrays are one long row.
  if (!packed_ && g.flags().row_contiguous && u.flags().row_contiguous) {
    enc.dispatch([g = g.data<float>(), u = u.data<float>(), o = out.data<float>(),
                  n = static_cast<int64_t>(out.size()), k = kernels_]() {
      // Element-wise: any split gives the same bits.
      parallel_ranges(n, grain_for(1), [&](int64_t b, int64_t e) { k->run(g + b, u + b, o + b, e - b); });
    });
    return;
  }
  enc.dispatch([gv = View{g.data<float>(), g.shape(), g.strides()},
                uv = View{u.data<float>(), u.shape(), u.strides()}, o = out.data<float>(), d,
                rows, packed = packed_, k = kernels_]() {
    const int64_t gs = gv.strides.back(), us = uv.strides.back();
    parallel_ranges(rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      thread_local std::vector<float> gbuf, ubuf;  // per pool thread
      for (int64_t r = r0; r < r1; ++r) {
        const float* gp = gv.data + row_offset(gv.shape, gv.strides, r);
        // Packed: up starts d elements after gate along the last axis.
        const float* up = packed ? gp + d * gs : uv.data + row_offset(uv.shape, uv.strides, r);
        k->run(dense_row(gp, gs, d, gbuf), dense_row(up, packed ? gs : us, d, ubuf), o + r * d, d);
      }
    });
  });
}

void FastSwiGlu::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("FastSwiGlu has no GPU implementation");
}

bool FastSwiGlu::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastSwiGlu*>(&other);
  return o && o->packed_ == packed_ && o->kernels_ == kernels_;
}

std::vector<mx::Shape> FastSwiGlu::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  if (packed_) shape.back() /= 2;
  return {shape};
}

std::unique_ptr<array> fast_swiglu(const array& gate, const array& up, uint8_t isa) {
  const Kernels* k = select_kernels(isa);
  if (!runs_here(gate) || up.dtype() != mx::float32 || up.shape() != gate.shape())
    return std::make_unique<array>(composition(gate, up));
  auto prim = std::make_shared<FastSwiGlu>(mx::default_stream(mx::Device::cpu), false, k);
  return std::make_unique<array>(gate.shape(), mx::float32, std::move(prim),
                                 std::vector<array>{gate, up});
}

std::unique_ptr<array> fast_swiglu_packed(const array& gu, uint8_t isa) {
  const Kernels* k = select_kernels(isa);
  if (gu.ndim() < 1 || gu.shape(-1) % 2 != 0)
    throw std::invalid_argument("fast_swiglu_packed: the last axis must have an even size");
  mx::Shape shape = gu.shape();
  const int f = shape.back() / 2;
  shape.back() = f;
  if (!runs_here(gu)) {
    auto half = [&](int i) {
      mx::Shape start(gu.ndim(), 0), stop = gu.shape();
      start.back() = i * f;
      stop.back() = (i + 1) * f;
      return mx::slice(gu, start, stop);
    };
    return std::make_unique<array>(composition(half(0), half(1)));
  }
  auto prim = std::make_shared<FastSwiGlu>(mx::default_stream(mx::Device::cpu), true, k);
  return std::make_unique<array>(shape, mx::float32, std::move(prim), std::vector<array>{gu});
}

uint8_t swiglu_node_isa(const array& a) {
  if (!a.has_primitive()) return 0;
  auto* p = dynamic_cast<FastSwiGlu*>(&a.primitive());
  return p ? static_cast<uint8_t>(p->isa()) : 0;
}

}  // namespace mlxrt::swiglu
