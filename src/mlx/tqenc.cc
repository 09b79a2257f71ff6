#include "mlxrt/src/mlx/tqenc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/common/hadamard.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/swiglu.h"

namespace mx = mlx::core;

namespace mlxrt::tqenc {

// Numerics: what turbo.rs's MLX ops do on the CPU, operation for operation
// (MLX's CPU backend runs them one element at a time, in f32):
//   keys, per group of 32: hi = max, lo = min, big = max(|hi|, |lo|);
//     s = max((hi - lo) * f32(1/levels), big * f32(1/2040)), rounded to f16
//     and back; den = s, or 1 where s == 0; anchor = (hi + lo) * 0.5 (8 bits)
//     or lo; z = f16(rint(anchor / den)); q = min(max(rint(x / den - z),
//     qlo), qhi).
//   values: y = hadamard(x * sign) with MLX's CPU Hadamard (butterflies in
//     index order, the scale applied after the last one, or the 12-point
//     matrix step after them); per group r = f16(sqrt(sum(y * y) * 1/32))
//     with the squares rounded then summed in index order; u = y / (r or 1);
//     q = #{boundaries < u}.
//   rint is round-half-even, as MLX's `round`; f16 is MLX's own float16_t.
// The tests compare every plane's bits with the ops (tqenc_tests.rs).

namespace {

using swiglu::opaque;

inline float f16_round(float x) { return static_cast<float>(static_cast<mx::float16_t>(x)); }

inline uint16_t f16_bits(float x) {
  const mx::float16_t h = static_cast<mx::float16_t>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Rows of an input (all axes but the last).
struct View {
  const float* data;
  mx::Shape shape;
  mx::Strides strides;
  bool dense;
  const float* row(int64_t r, int64_t d) const {
    return dense ? data + r * d : data + swiglu::row_offset(shape, strides, r);
  }
  int64_t step() const { return strides.back(); }
};

View view(const array& a) {
  return View{a.data<float>(), a.shape(), a.strides(), a.flags().row_contiguous};
}

// The 2^k-point and m-point factors of MLX's Hadamard transform of size d,
// and the m-point matrix's signs (true = +), row-major.
struct Hadamard {
  int n = 0, m = 1;
  std::vector<char> plus;

  explicit Hadamard(int d) {
    auto [nn, mm] = mx::decompose_hadamard(d);
    n = nn;
    m = mm;
    if (m > 1) {
      const auto matrix = mx::hadamard_matrices().at(m);
      for (char c : matrix)
        if (c == '+' || c == '-') plus.push_back(c == '+');
    }
  }

  // In place on y[0 .. n*m), as MLX's CPU kernel: the 2^k butterflies on each
  // contiguous n-block (scaled at the last stage when m == 1), then the
  // m-point matrix across the blocks, scaled.
  void apply(float* y, float scale) const {
    const float n_scale = m > 1 ? 1.0f : scale;
    for (int b = 0; b < m; ++b) {
      float* p = y + b * n;
      for (int h = 1; h < n; h <<= 1) {
        for (int i = 0; i < n / 2; ++i) {
          const int k = i & (h - 1);
          const int j = ((i - k) << 1) + k;
          const float x = p[j], z = p[j + h];
          p[j] = x + z;
          p[j + h] = x - z;
          if (h == n / 2) {
            p[j] *= n_scale;
            p[j + h] *= n_scale;
          }
        }
      }
    }
    if (m == 1) return;
    float acc[32];
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < m; ++j) {
        float a = 0.0f;
        for (int k = 0; k < m; ++k) {
          const float x = y[i + k * n];
          if (plus[k + j * m])
            a += x;
          else
            a -= x;
        }
        acc[j] = a;
      }
      for (int j = 0; j < m; ++j) y[i + j * n] = acc[j] * scale;
    }
  }
};

// Indices of `bits` bits → an LSB-first bitstream (8 indices → `bits` bytes).
void pack(const uint8_t* q, int n, int bits, uint8_t* out) {
  for (int i = 0; i < n; i += 8) {
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>(q[i + j]) << (bits * j);
    for (int b = 0; b < bits; ++b) *out++ = static_cast<uint8_t>(w >> (8 * b));
  }
}

constexpr int kGroup = 32;
// The largest head dim the primitives take (rows are staged on the stack).
constexpr int kMaxDim = 1024;

// One row of keys: indices (int8 or packed), f16 scales and zeros.
void encode_key_row(const float* x, int64_t xs, int d, int bits, void* idx, uint16_t* scales,
                    uint16_t* zeros) {
  const bool is_signed = bits == 8;
  const float levels = is_signed ? 254.0f : static_cast<float>((1 << bits) - 1);
  const float inv_levels = 1.0f / levels, inv_range = 1.0f / 2040.0f;
  const float qlo = is_signed ? -127.0f : 0.0f, qhi = is_signed ? 127.0f : levels;
  uint8_t q[kMaxDim];
  for (int g = 0; g < d / kGroup; ++g) {
    const float* p = x + static_cast<int64_t>(g) * kGroup * xs;
    float hi = p[0], lo = p[0];
    for (int i = 1; i < kGroup; ++i) {
      const float v = p[i * xs];
      hi = v > hi ? v : hi;
      lo = v < lo ? v : lo;
    }
    const float big = std::max(std::fabs(hi), std::fabs(lo));
    const float a = (hi - lo) * inv_levels, b = big * inv_range;
    const float s = f16_round(a > b ? a : b);
    const float den = s == 0.0f ? 1.0f : s;
    const float anchor = is_signed ? (hi + lo) * 0.5f : lo;
    const float z = f16_round(std::rint(anchor / den));
    scales[g] = f16_bits(s);
    zeros[g] = f16_bits(z);
    for (int i = 0; i < kGroup; ++i) {
      float v = std::rint(p[i * xs] / den - z);
      v = v > qlo ? v : qlo;
      v = v < qhi ? v : qhi;
      if (is_signed)
        static_cast<int8_t*>(idx)[g * kGroup + i] = static_cast<int8_t>(v);
      else
        q[g * kGroup + i] = static_cast<uint8_t>(v);
    }
  }
  if (!is_signed) pack(q, d, bits, static_cast<uint8_t*>(idx));
}

// One row of values: rotated, indices packed, f16 RMS scales. `y` is scratch
// of d floats.
void encode_value_row(const float* x, int64_t xs, int d, int bits, const Hadamard& had,
                      float norm, const float* signs, const float* bounds, float* y, uint8_t* idx,
                      uint16_t* scales) {
  for (int i = 0; i < d; ++i) y[i] = x[i * xs] * signs[i];
  had.apply(y, norm);
  const int nb = (1 << bits) - 1;
  const float inv_group = static_cast<float>(1.0 / kGroup);
  uint8_t q[kMaxDim];
  for (int g = 0; g < d / kGroup; ++g) {
    const float* p = y + g * kGroup;
    float sum = 0.0f;
    for (int i = 0; i < kGroup; ++i) {
      float sq = p[i] * p[i];
      opaque(sq);
      sum += sq;
    }
    const float r = f16_round(std::sqrt(sum * inv_group));
    const float den = r == 0.0f ? 1.0f : r;
    scales[g] = f16_bits(r);
    for (int i = 0; i < kGroup; ++i) {
      const float u = p[i] / den;
      int c = 0;
      for (int b = 0; b < nb; ++b) c += u > bounds[b];
      q[g * kGroup + i] = static_cast<uint8_t>(c);
    }
  }
  pack(q, d, bits, idx);
}

bool is_f32_4d(const array& a) { return a.dtype() == mx::float32 && a.ndim() == 4 && a.size() > 0; }

// Head dims the codec takes (turbo.rs `check`): multiples of 32 of the form
// 2^k or 12·2^k.
bool codec_dim(int d) {
  if (d < kGroup || d % kGroup != 0 || d > kMaxDim) return false;
  int odd = d;
  while (odd % 2 == 0) odd /= 2;
  return odd == 1 || odd == 3;
}

}  // namespace

// ---------------------------------------------------------------------------
// Encoder

void TurboEncode::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  const array& k = inputs[0];
  const array& v = inputs[1];
  if (k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("TurboEncode: inputs must be f32");
  auto& enc = mx::cpu::get_command_encoder(stream());
  // The tasks run later on the stream's thread, when the graph (this
  // primitive included) may be gone: they copy what they read of it.
  enc.set_input_array(k);
  enc.set_input_array(v);
  for (auto& o : outputs) {
    o.set_data(mx::allocator::malloc(o.nbytes()));
    enc.set_output_array(o);
  }
  const int dk = k.shape(3), dv = v.shape(3);
  const int64_t rows = static_cast<int64_t>(k.size()) / dk;
  enc.dispatch([kv = view(k), vv = view(v), ki = outputs[0].data<void>(),
                ks = outputs[1].data<uint16_t>(), kz = outputs[2].data<uint16_t>(),
                vi = outputs[3].data<uint8_t>(), vs = outputs[4].data<uint16_t>(), dk, dv, rows,
                kb = key_bits_, vb = value_bits_, norm = norm_, signs = signs_,
                bounds = boundaries_]() {
    const Hadamard had(dv);
    std::vector<float> y(dv);
    const int64_t kstride = kb == 8 ? dk : dk * kb / 8;
    for (int64_t r = 0; r < rows; ++r) {
      encode_key_row(kv.row(r, dk), kv.step(), dk, kb, static_cast<uint8_t*>(ki) + r * kstride,
                     ks + r * (dk / kGroup), kz + r * (dk / kGroup));
      encode_value_row(vv.row(r, dv), vv.step(), dv, vb, had, norm, signs.data(), bounds.data(), y.data(),
                       vi + r * (dv * vb / 8), vs + r * (dv / kGroup));
    }
  });
}

void TurboEncode::eval_gpu(const std::vector<array>&, std::vector<array>&) {
  throw std::runtime_error("TurboEncode has no GPU implementation");
}

bool TurboEncode::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const TurboEncode*>(&other);
  return o && o->key_bits_ == key_bits_ && o->value_bits_ == value_bits_ && o->norm_ == norm_ &&
         o->signs_ == signs_ && o->boundaries_ == boundaries_;
}

std::vector<mx::Shape> TurboEncode::output_shapes(const std::vector<array>& inputs) {
  mx::Shape lead = inputs[0].shape();
  const int dk = lead.back(), dv = inputs[1].shape(3);
  auto with = [&](int last) {
    mx::Shape s = lead;
    s.back() = last;
    return s;
  };
  return {with(key_bits_ == 8 ? dk : dk * key_bits_ / 8), with(dk / kGroup), with(dk / kGroup),
          with(dv * value_bits_ / 8), with(dv / kGroup)};
}

// ---------------------------------------------------------------------------
// Inverse rotation

void TurboUnrotate::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& y = inputs[0];
  if (y.dtype() != mx::float32) throw std::invalid_argument("TurboUnrotate: input must be f32");
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(y);
  enc.set_output_array(out);
  const int d = y.shape(-1);
  const int64_t rows = static_cast<int64_t>(y.size()) / d;
  enc.dispatch([yv = view(y), o = out.data<float>(), d, rows, norm = norm_, signs = signs_]() {
    const Hadamard had(d);
    const int64_t ys = yv.step();
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = yv.row(r, d);
      float* op = o + r * d;
      for (int i = 0; i < d; ++i) op[i] = p[i * ys];
      had.apply(op, norm);
      for (int i = 0; i < d; ++i) op[i] *= signs[i];
    }
  });
}

void TurboUnrotate::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("TurboUnrotate has no GPU implementation");
}

bool TurboUnrotate::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const TurboUnrotate*>(&other);
  return o && o->norm_ == norm_ && o->signs_ == signs_;
}

std::vector<mx::Shape> TurboUnrotate::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape()};
}

// ---------------------------------------------------------------------------
// Bridge functions

std::unique_ptr<ArrVec> turbo_encode(const array& k, const array& v, int32_t key_bits,
                                     int32_t value_bits, float norm, rust::Slice<const float> signs,
                                     rust::Slice<const float> boundaries) {
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (key_bits < 2 || key_bits > 8 || value_bits < 1 || value_bits > 4) return nullptr;
  if (!is_f32_4d(k) || !is_f32_4d(v)) return nullptr;
  for (int a = 0; a < 3; ++a)
    if (k.shape(a) != v.shape(a)) return nullptr;
  const int dk = k.shape(3), dv = v.shape(3);
  if (!codec_dim(dk) || !codec_dim(dv)) return nullptr;
  if (signs.size() != static_cast<size_t>(dv) ||
      boundaries.size() != (size_t{1} << value_bits) - 1)
    return nullptr;
  auto prim = std::make_shared<TurboEncode>(
      mx::default_stream(mx::Device::cpu), key_bits, value_bits, norm,
      std::vector<float>(signs.begin(), signs.end()),
      std::vector<float>(boundaries.begin(), boundaries.end()));
  const std::vector<array> inputs{k, v};
  auto shapes = prim->output_shapes(inputs);
  const auto key_type = key_bits == 8 ? mx::int8 : mx::uint8;
  auto planes = array::make_arrays(
      std::move(shapes), {key_type, mx::float16, mx::float16, mx::uint8, mx::float16}, prim,
      inputs);
  auto out = std::make_unique<ArrVec>();
  out->v = std::move(planes);
  return out;
}

std::unique_ptr<array> turbo_unrotate(const array& y, float norm, rust::Slice<const float> signs) {
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (y.dtype() != mx::float32 || y.ndim() < 1 || y.size() == 0) return nullptr;
  const int d = y.shape(-1);
  if (!codec_dim(d) || signs.size() != static_cast<size_t>(d)) return nullptr;
  auto prim = std::make_shared<TurboUnrotate>(mx::default_stream(mx::Device::cpu), norm,
                                              std::vector<float>(signs.begin(), signs.end()));
  return std::make_unique<array>(y.shape(), mx::float32, std::move(prim), std::vector<array>{y});
}

bool is_tqenc_node(const array& a) {
  if (!a.has_primitive()) return false;
  auto& p = a.primitive();
  return dynamic_cast<TurboEncode*>(&p) || dynamic_cast<TurboUnrotate*>(&p);
}

}  // namespace mlxrt::tqenc
