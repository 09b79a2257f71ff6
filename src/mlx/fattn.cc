#include "mlxrt/src/mlx/fattn.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/qsdpa.h"

namespace mx = mlx::core;

namespace mlxrt::fattn {

// Defined by fattn_impl.h, once per variant qsdpa_kernels.cc compiles.
// `f16`: the variant reading keys and values stored as f16.
namespace portable {
const Kernels* kernels(bool f16);
}
#if defined(__x86_64__)
namespace avx2 {
const Kernels* kernels(bool f16);
}
namespace avx512 {
const Kernels* kernels(bool f16);
}
#endif

namespace {

const Kernels* select_kernels(uint8_t code, bool f16) {
  switch (qsdpa::select_isa(code)) {
    case Isa::Portable: return portable::kernels(f16);
#if defined(__x86_64__)
    case Isa::Avx2: return avx2::kernels(f16);
    case Isa::Avx512: return avx512::kernels(f16);
#endif
    default: throw std::invalid_argument("this build has no kernels for the requested instruction set");
  }
}

// Everything eval_cpu's task needs, captured by value.
struct Inputs {
  array q, k, v, mask;
};

void compute(const Inputs& in, float* out, float scale, MaskKind mask, int window,
             const Kernels* k, bool merged) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int H = in.k.shape(1), T = in.k.shape(2), rep = Hq / H, Dv = in.v.shape(3);
  std::vector<float> qbuf;
  const float* qp = qsdpa::group_queries(in.q, H, scale, nullptr, qbuf);
  const qsdpa::Rows kr(in.k), vr(in.v);
  // Float rows (f32, or f16 for both) as "planes" without scales: the
  // float kernel reads `w` only.
  const bool f16 = in.k.dtype() == mx::float16;
  const int64_t item = f16 ? 2 : 4;
  auto plane = [item](const qsdpa::Rows& r, int dim) {
    return qsdpa::Plane{r.data, nullptr, nullptr, {r.bh[0] * item, r.bh[1] * item}, {0, 0}, {0, 0}, dim};
  };
  qsdpa::Problem p{qp, plane(kr, D), plane(vr, Dv), B, H, rep * L, L, T, 0, 32, mask,
                   nullptr, {0, 0, 0, 0}};
  p.window = window;
  p.heads_last = merged;
  // Prefill: the keys transposed once (see transpose_keys).
  std::vector<float> kt;
  if (qsdpa::transpose_keys(p, k->rows)) {
    p.kt_len = T + 2 * k->lanes;
    kt.assign(static_cast<size_t>(B) * H * D * p.kt_len, 0.0f);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        float* dst = kt.data() + (static_cast<size_t>(b) * H + h) * D * p.kt_len;
        if (f16) {
          const auto* src = reinterpret_cast<const uint16_t*>(p.k.w_at(b, h));
          for (int t = 0; t < T; ++t)
            for (int d = 0; d < D; ++d)
              dst[d * p.kt_len + t] = qsdpa::half_to_float(src[static_cast<size_t>(t) * D + d]);
        } else {
          const auto* src = reinterpret_cast<const float*>(p.k.w_at(b, h));
          for (int t = 0; t < T; ++t)
            for (int d = 0; d < D; ++d) dst[d * p.kt_len + t] = src[static_cast<size_t>(t) * D + d];
        }
      }
    p.keys_t = kt.data();
  }
  qsdpa::set_mask(p, in.mask);
  qsdpa::run(p, k, rep, out);
}

bool is_4d(const array& a, mx::Dtype t) { return a.ndim() == 4 && a.dtype() == t; }

}  // namespace

void FloatSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  Inputs in{weak(0), weak(1), weak(2), inputs.size() > 3 ? weak(3) : weak(0)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, mask = mask_,
                window = window_, k = kernels_,
                merged = merged_]() { compute(in, o, scale, mask, window, k, merged); });
}

void FloatSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("FloatSdpa has no GPU implementation");
}

bool FloatSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FloatSdpa*>(&other);
  return o && o->scale_ == scale_ && o->mask_ == mask_ && o->window_ == window_ &&
         o->kernels_ == kernels_ && o->merged_ == merged_;
}

std::vector<mx::Shape> FloatSdpa::output_shapes(const std::vector<array>& inputs) {
  const array &q = inputs[0], &v = inputs[2];
  if (merged_) return {{q.shape(0), q.shape(2), q.shape(1) * v.shape(3)}};
  return {{q.shape(0), q.shape(1), q.shape(2), v.shape(3)}};
}

std::unique_ptr<array> float_sdpa(const array& q, const array& k, const array& v, float scale,
                                  uint8_t mask_kind, const array& mask, int32_t window,
                                  uint8_t isa, bool merged) {
  // f32 queries; keys and values both f32 or both f16 (a cache stored as f16).
  const bool f16 = k.dtype() == mx::float16;
  const Kernels* kern = select_kernels(isa, f16);
  if (mask_kind > 2) throw std::invalid_argument("unknown mask kind " + std::to_string(mask_kind));
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  const auto kv_type = f16 ? mx::float16 : mx::float32;
  if (!is_4d(q, mx::float32) || !is_4d(k, kv_type) || !is_4d(v, kv_type)) return nullptr;
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int H = k.shape(1), T = k.shape(2), Dv = v.shape(3);
  if (B < 1 || L < 1 || T < 1 || H < 1 || Hq % H != 0 || window < 0) return nullptr;
  if (k.shape(0) != B || k.shape(3) != D || v.shape(0) != B || v.shape(1) != H ||
      v.shape(2) != T)
    return nullptr;
  // Whole vectors per row (every head size models use).
  if (D % kern->lanes != 0 || Dv % kern->lanes != 0 || D < 1 || Dv < 1) return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;
  if (mask_kind != 1 && window != 0) return nullptr;

  auto kind = mask_kind == 0 ? MaskKind::None : MaskKind::Causal;
  std::vector<array> inputs{q, k, v};
  if (mask_kind == 2) {
    // MLX broadcasts the mask against [B, Hq, L, T]; the kernels take one
    // mask per batch row (or per kv head without grouping).
    kind = qsdpa::push_mask(mask, B, Hq == H ? H : 1, L, T, inputs);
    if (kind == MaskKind::None) return nullptr;
  }
  auto prim = std::make_shared<FloatSdpa>(mx::default_stream(mx::Device::cpu), scale, kind,
                                          window, kern, merged);
  auto shape = merged ? mx::Shape{B, L, Hq * Dv} : mx::Shape{B, Hq, L, Dv};
  return std::make_unique<array>(std::move(shape), mx::float32, std::move(prim),
                                 std::move(inputs));
}

uint8_t fattn_node_isa(const array& a) { return qsdpa::node_isa<FloatSdpa>(a); }

}  // namespace mlxrt::fattn
