#include "mlxrt/src/mlx/tqsdpa.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/qsdpa.h"

namespace mx = mlx::core;

namespace mlxrt::tqsdpa {

namespace {

using qsdpa::Bytes;
using qsdpa::Rows;
using qsdpa::TurboProblem;

const TurboKernels* select_kernels(uint8_t code) {
  const TurboKernels* k = nullptr;
  switch (qsdpa::select_isa(code)) {
    case Isa::Avx512: k = qsdpa::turbo_kernels_avx512(); break;
    case Isa::Avx2: k = qsdpa::turbo_kernels_avx2(); break;
    case Isa::Portable: k = qsdpa::turbo_kernels_portable(); break;
    default: break;
  }
  if (!k) throw std::invalid_argument("this build has no kernel for the requested instruction set");
  return k;
}

Bytes bytes(const Rows& r, const array& a) {
  const int64_t item = a.itemsize();
  return Bytes{r.data, {r.bh[0] * item, r.bh[1] * item}, a.shape(3) * item};
}

// Everything eval_cpu's task needs, captured by value.
struct Inputs {
  array q, ki, ks, kz, vi, vs, mask;
};

void compute(const Inputs& in, float* out, float scale, int key_bits, int value_bits,
             const std::array<float, 16>& book, MaskKind mask, const TurboKernels* k) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int H = in.ki.shape(1), T = in.ki.shape(2), rep = Hq / H, M = rep * L;
  const int Dv = in.vs.shape(3) * 32;

  // q * scale (turbo.rs scales the queries).
  std::vector<float> qbuf;
  const float* qp = qsdpa::group_queries(in.q, H, scale, nullptr, qbuf);

  const Rows ki(in.ki), ks(in.ks), kz(in.kz), vi(in.vi), vs(in.vs);
  TurboProblem p{};
  p.base = qsdpa::Problem{nullptr, {}, {}, B, H, M, L, T, 32, 0, mask, nullptr, {0, 0, 0, 0}};
  qsdpa::set_mask(p.base, in.mask);
  p.q = qp;
  p.k_idx = bytes(ki, in.ki);
  p.k_scale = bytes(ks, in.ks);
  p.k_zero = bytes(kz, in.kz);
  p.v_idx = bytes(vi, in.vi);
  p.v_scale = bytes(vs, in.vs);
  p.D = D;
  p.Dv = Dv;
  p.key_bits = key_bits;
  p.value_bits = value_bits;
  std::copy(book.begin(), book.end(), p.book);
  const std::pair<const TurboProblem*, const TurboKernels*> ctx{&p, k};
  qsdpa::flash_attention(qsdpa::Split{
      B, H, M, L, T, Dv, k->rows, mask == MaskKind::Causal, qsdpa::turbo_scratch_floats(D, Dv),
      qsdpa::kChunk,
      [](const void* c, int b, int h, int m0, int rows, int t0, int t1, float* scratch,
         float* acc, float* mx, float* sum) {
        const auto* pk = static_cast<const std::pair<const TurboProblem*, const TurboKernels*>*>(c);
        pk->second->chunk(*pk->first, b, h, m0, rows, t0, t1, scratch, acc, mx, sum);
      },
      &ctx, nullptr, rep, out});
}

bool is_plane(const array& a, mx::Dtype dtype, int B, int H, int T, int cols) {
  return a.ndim() == 4 && a.dtype() == dtype && a.shape(0) == B && a.shape(1) == H &&
         a.shape(2) == T && a.shape(3) == cols;
}

}  // namespace

void TurboSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  Inputs in{weak(0), weak(1), weak(2), weak(3), weak(4), weak(5),
            inputs.size() > 6 ? weak(6) : weak(0)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, kb = key_bits_,
                vb = value_bits_, book = book_, mask = mask_, k = kernels_]() {
    compute(in, o, scale, kb, vb, book, mask, k);
  });
}

void TurboSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("TurboSdpa has no GPU implementation");
}

bool TurboSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const TurboSdpa*>(&other);
  return o && o->scale_ == scale_ && o->key_bits_ == key_bits_ &&
         o->value_bits_ == value_bits_ && o->book_ == book_ && o->mask_ == mask_ &&
         o->kernels_ == kernels_;
}

std::vector<mx::Shape> TurboSdpa::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[5].shape(3) * 32;
  return {shape};
}

std::unique_ptr<array> turbo_sdpa(const array& q, const array& ki, const array& ks,
                                  const array& kz, const array& vi, const array& vs,
                                  rust::Slice<const float> book, int32_t key_bits,
                                  int32_t value_bits, float scale, uint8_t mask_kind,
                                  const array& mask, uint8_t isa) {
  const TurboKernels* k = select_kernels(isa);
  if (mask_kind > 2) throw std::invalid_argument("unknown mask kind " + std::to_string(mask_kind));
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (!qsdpa::turbo_kernel_bits(key_bits, value_bits)) return nullptr;
  if (book.size() != (size_t{1} << value_bits)) return nullptr;
  if (q.ndim() != 4 || q.dtype() != mx::float32 || ki.ndim() != 4 || vi.ndim() != 4) return nullptr;
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int H = ki.shape(1), T = ki.shape(2);
  if (B < 1 || L < 1 || T < 1 || H < 1 || Hq % H != 0 || D < 32 || D % 32 != 0) return nullptr;
  const int Dv = vs.ndim() == 4 ? vs.shape(3) * 32 : 0;
  if (Dv < 32) return nullptr;
  const auto key_type = key_bits == 8 ? mx::int8 : mx::uint8;
  if (!is_plane(ki, key_type, B, H, T, D * key_bits / 8) ||
      !is_plane(ks, mx::float16, B, H, T, D / 32) || !is_plane(kz, mx::float16, B, H, T, D / 32) ||
      !is_plane(vi, mx::uint8, B, H, T, Dv * value_bits / 8) ||
      !is_plane(vs, mx::float16, B, H, T, Dv / 32))
    return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;

  MaskKind kind;
  std::vector<array> inputs{q, ki, ks, kz, vi, vs};
  if (!qsdpa::mask_input(mask_kind, mask, B, H, Hq, L, T, kind, inputs)) return nullptr;
  // turbo.rs selects with the mask, so only a bool one means the same here.
  if (kind == MaskKind::Additive) return nullptr;
  std::array<float, 16> cb{};
  std::copy(book.begin(), book.end(), cb.begin());
  auto prim = std::make_shared<TurboSdpa>(mx::default_stream(mx::Device::cpu), scale, key_bits,
                                          value_bits, cb, kind, k);
  return std::make_unique<array>(mx::Shape{B, Hq, L, Dv}, mx::float32, std::move(prim),
                                 std::move(inputs));
}

uint8_t tqsdpa_node_isa(const array& a) { return qsdpa::node_isa<TurboSdpa>(a); }

}  // namespace mlxrt::tqsdpa
