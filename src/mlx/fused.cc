#include "mlxrt/src/mlx/fused.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/pool.h"
#include "mlxrt/src/mlx/swiglu.h"

// MLX's scalar sin/cos (header-only); its comparisons mix signedness.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#include "mlx/backend/cpu/simd/simd.h"
#pragma GCC diagnostic pop

namespace mx = mlx::core;

namespace mlxrt::fused {

// Numerics. MLX's CPU wheel runs these ops one element at a time (no SIMD on
// x86), so each loop below does what its composition does, in its order:
//   rms_norm: s = 0; s += x*x in index order (square, then a sequential
//     sum); mean = s * float(1.0 / D); r = 1 / sqrt(mean + eps);
//     out = (x * r) * w.
//   rope: pos = (float(t) + float(offset)) * scale; theta = pos * inv_freq;
//     c = cos(theta), s = sin(theta) with MLX's own scalar sin/cos (the
//     Cephes polynomials of its header mlx/backend/cpu/simd/math.h, called
//     here, not libm's); out1 = x1*c - x2*s, out2 = x1*s + x2*c (each product
//     rounded on its own); features past `dims` are copied.
// inv_freqs come from MLX's own ops (rope_inv_freqs), as its exp is not
// libm's either. The tests compare bits with MLX's ops (fused_tests.rs).

namespace {

using swiglu::opaque;

// What a task needs to walk an input.
struct View {
  const float* data;
  mx::Shape shape;
  mx::Strides strides;
  bool dense;
  const float* row(int64_t r, int64_t d) const {
    return dense ? data + r * d : data + swiglu::row_offset(shape, strides, r);
  }
};

View view(const array& a) {
  return View{a.data<float>(), a.shape(), a.strides(), a.flags().row_contiguous};
}

bool runs_here(const array& x) {
  return mx::default_device() == mx::Device::cpu && x.dtype() == mx::float32 && x.ndim() >= 1 &&
         x.size() > 0;
}

void alloc_out(array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

// Unit-stride element-wise loops four floats at a time, in GCC's and Clang's
// vector extension (any target): at -O2 GCC 12 does not vectorize a loop of
// unknown trip count. Each lane computes what the scalar loop does.
typedef float F4 __attribute__((vector_size(16)));
inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }

// RMSNorm of one row of d values (element stride xs) into `op`, weights w
// (stride ws).
void rms_norm_row(const float* xp, int64_t xs, const float* wp, int64_t ws, float* op, int64_t d,
                  float inv_d, float eps) {
  float s = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    const float v = xp[i * xs];
    float sq = v * v;
    opaque(sq);  // MLX squares, then sums: no FMA (Clang and GCC on arm64 would contract)
    s += sq;
  }
  const float scale = 1.0f / std::sqrt(s * inv_d + eps);
  if (xs == 1 && ws == 1) {  // the usual case
    const F4 sc = {scale, scale, scale, scale};
    int64_t i = 0;
    for (; i + 4 <= d; i += 4) store4(op + i, (load4(xp + i) * sc) * load4(wp + i));
    for (; i < d; ++i) op[i] = (xp[i] * scale) * wp[i];
  } else {
    for (int64_t i = 0; i < d; ++i) op[i] = (xp[i * xs] * scale) * wp[i * ws];
  }
}

// RoPE's cos/sin for every (start, t): n_starts * t_len rows of [cos of
// half frequencies, sin of them]; start b is offp[b * os], or `offset`
// without offp. Every layer of a forward asks for the same table, so it is
// kept with what it was computed from and recomputed only when that changes
// (recomputed per layer, the sin/cos were ~2% of a 512-token prefill).
class RopeTable {
 public:
  const float* get(const int32_t* offp, int64_t os, int64_t n_starts, int64_t t_len, int offset,
                   float scale, const float* ip, int64_t is, int64_t half) {
    // [n_starts, starts..., t_len, half, scale, inverse frequencies...]: the
    // counts first, so that no two inputs give the same key.
    key_now_.assign(1, static_cast<int32_t>(n_starts));
    for (int64_t b = 0; b < n_starts; ++b) key_now_.push_back(offp ? offp[b * os] : offset);
    key_now_.push_back(static_cast<int32_t>(t_len));
    key_now_.push_back(static_cast<int32_t>(half));
    key_now_.push_back(bits(scale));
    for (int64_t i = 0; i < half; ++i) key_now_.push_back(bits(ip[i * is]));
    if (key_now_ != key_) {  // (key_ starts empty, key_now_ never is)
      compute(n_starts, t_len, scale, ip, is, half);
      key_.swap(key_now_);
    }
    return table_.data();
  }

 private:
  static int32_t bits(float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i;
  }

  void compute(int64_t n_starts, int64_t t_len, float scale, const float* ip, int64_t is,
               int64_t half) {
    table_.resize(n_starts * t_len * 2 * half);
    float* rows = table_.data();
    const int32_t* starts = key_now_.data() + 1;  // (see get)
    // A row's sin and cos cost ~16x its size in other ops' work.
    parallel_ranges(n_starts * t_len, grain_for(32 * half), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / t_len, t = r % t_len;
        const float pos = (static_cast<float>(t) + static_cast<float>(starts[b])) * scale;
        float* cs = rows + r * 2 * half;
        for (int64_t i = 0; i < half; ++i) {
          const float theta = pos * ip[i * is];
          cs[i] = mx::simd::cos(mx::simd::Simd<float, 1>(theta)).value;
          cs[half + i] = mx::simd::sin(mx::simd::Simd<float, 1>(theta)).value;
        }
      }
    });
  }

  std::vector<float> table_;
  std::vector<int32_t> key_, key_now_;
};

// The calling thread's table (one per MLX stream thread). The pool's threads
// would see their own thread_local: hand them the returned data.
const float* rope_table(const int32_t* offp, int64_t os, int64_t n_starts, int64_t t_len,
                        int offset, float scale, const float* ip, int64_t is, int64_t half) {
  thread_local RopeTable table;
  return table.get(offp, os, n_starts, t_len, offset, scale, ip, is, half);
}

// A row of d floats into f16 or bf16, rounded as MLX's astype rounds (its
// own conversion types).
template <typename T>
void cast_row(const float* src, T* dst, int64_t d) {
  for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(src[i]);
}

// One row of d values (element stride xs) rotated over its first `dims`
// features with a table row `cs`, into `op`; the rest copied.
void rope_row(const float* xp, int64_t xs, const float* cs, float* op, int64_t d, int64_t dims,
              bool trad) {
  const int64_t half = dims / 2;
  const int64_t second = trad ? 1 : half;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t j = trad ? 2 * i : i;
    const float x1 = xp[j * xs], x2 = xp[(j + second) * xs];
    const float c = cs[i], s = cs[half + i];
    float a = x1 * c, bb = x2 * s, e = x1 * s, f = x2 * c;
    opaque(a);
    opaque(bb);
    opaque(e);
    opaque(f);
    op[j] = a - bb;
    op[j + second] = e + f;
  }
  for (int64_t i = dims; i < d; ++i) op[i] = xp[i * xs];
}

}  // namespace

// ---------------------------------------------------------------------------
// RMSNorm

void FastRmsNorm::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  const array& w = inputs[1];
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("FastRmsNorm: inputs must be f32");
  alloc_out(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  const int64_t d = x.shape(-1);
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const float inv_d = static_cast<float>(1.0 / static_cast<double>(d));
  enc.dispatch([xv = view(x), ws = w.strides(0), wp = w.data<float>(), o = out.data<float>(), d,
                rows, inv_d, eps = eps_]() {
    const int64_t xs = xv.shape.empty() ? 1 : xv.strides.back();
    parallel_ranges(rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) rms_norm_row(xv.row(r, d), xs, wp, ws, o + r * d, d, inv_d, eps);
    });
  });
}

void FastRmsNorm::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("FastRmsNorm has no GPU implementation");
}

bool FastRmsNorm::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastRmsNorm*>(&other);
  return o && o->eps_ == eps_;
}

std::vector<mx::Shape> FastRmsNorm::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape()};
}

void FastAddRmsNorm::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  const array &x = inputs[0], &y = inputs[1], &w = inputs[2];
  if (x.dtype() != mx::float32 || y.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("FastAddRmsNorm: inputs must be f32");
  for (auto& o : outputs) alloc_out(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);
  const int64_t d = x.shape(-1);
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const float inv_d = static_cast<float>(1.0 / static_cast<double>(d));
  enc.dispatch([xv = view(x), yv = view(y), ws = w.strides(0), wp = w.data<float>(),
                sum = outputs[0].data<float>(), o = outputs[1].data<float>(), d, rows, inv_d,
                eps = eps_]() {
    const int64_t xs = xv.shape.empty() ? 1 : xv.strides.back();
    const int64_t ys = yv.shape.empty() ? 1 : yv.strides.back();
    parallel_ranges(rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float *xp = xv.row(r, d), *yp = yv.row(r, d);
        float* sp = sum + r * d;
        if (xs == 1 && ys == 1) {
          int64_t i = 0;
          for (; i + 4 <= d; i += 4) store4(sp + i, load4(xp + i) + load4(yp + i));
          for (; i < d; ++i) sp[i] = xp[i] + yp[i];
        } else {
          for (int64_t i = 0; i < d; ++i) sp[i] = xp[i * xs] + yp[i * ys];
        }
        rms_norm_row(sp, 1, wp, ws, o + r * d, d, inv_d, eps);
      }
    });
  });
}

void FastAddRmsNorm::eval_gpu(const std::vector<array>&, std::vector<array>&) {
  throw std::runtime_error("FastAddRmsNorm has no GPU implementation");
}

bool FastAddRmsNorm::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastAddRmsNorm*>(&other);
  return o && o->eps_ == eps_;
}

std::vector<mx::Shape> FastAddRmsNorm::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape(), inputs[0].shape()};
}

// ---------------------------------------------------------------------------
// RoPE

void FastRope::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  const array& inv = inputs[1];
  const bool per_row = inputs.size() > 2;
  if (x.dtype() != mx::float32 || inv.dtype() != mx::float32)
    throw std::invalid_argument("FastRope: x and inv_freqs must be f32");
  alloc_out(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);

  const int64_t d = x.shape(-1), t_len = x.ndim() >= 2 ? x.shape(-2) : 1;
  const int64_t batch = x.ndim() >= 3 ? x.shape(0) : 1;
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const int64_t per_batch = rows / batch;
  // Offsets are read in the task: the node computing them may not have run
  // yet when this one is encoded.
  const array* offs = per_row ? &inputs[2] : nullptr;
  enc.dispatch([xv = view(x), ip = inv.data<float>(), is = inv.strides(0), o = out.data<float>(),
                offp = offs ? offs->data<int32_t>() : nullptr, os = offs ? offs->strides(0) : 0,
                n_starts = offs ? static_cast<int64_t>(offs->size()) : 1, d, t_len, rows, per_batch,
                dims = dims_, trad = traditional_, scale = scale_, offset = offset_]() {
    const int64_t xs = xv.strides.back();
    const float* tab = rope_table(offp, os, n_starts, t_len, offset, scale, ip, is, dims / 2);
    parallel_ranges(rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = n_starts > 1 ? r / per_batch : 0;
        const float* cs = tab + (b * t_len + r % t_len) * dims;
        rope_row(xv.row(r, d), xs, cs, o + r * d, d, dims, trad);
      }
    });
  });
}

void FastRope::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("FastRope has no GPU implementation");
}

bool FastRope::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastRope*>(&other);
  return o && o->dims_ == dims_ && o->traditional_ == traditional_ && o->scale_ == scale_ &&
         o->offset_ == offset_;
}

std::vector<mx::Shape> FastRope::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape()};
}

// ---------------------------------------------------------------------------
// Heads of a packed projection

void FastHeads::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  const array& x = inputs[0];
  const array& inv = inputs[1];
  if (x.dtype() != mx::float32 || inv.dtype() != mx::float32)
    throw std::invalid_argument("FastHeads: x and inv_freqs must be f32");
  for (auto& o : outputs) alloc_out(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);

  struct Job {
    const float* norm;  // per-head RMSNorm weights, or null
    int64_t norm_stride;
    void* out;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const int n = parts_[i].norm;
    jobs.push_back({n >= 0 ? inputs[n].data<float>() : nullptr, n >= 0 ? inputs[n].strides(0) : 0,
                    outputs[i].data<void>()});
  }
  const array* offs = has_offsets_ ? &inputs[2] : nullptr;
  enc.dispatch([xv = view(x), ip = inv.data<float>(), is = inv.strides(0), jobs = std::move(jobs),
                parts = parts_, offp = offs ? offs->data<int32_t>() : nullptr,
                os = offs ? offs->strides(0) : 0,
                n_starts = offs ? static_cast<int64_t>(offs->size()) : 1, d = head_dim_,
                dims = dims_, trad = traditional_, scale = scale_, offset = offset_, eps = eps_]() {
    const int64_t batch = xv.shape[0], t_len = xv.shape[1], c = xv.shape[2];
    const int64_t xs = xv.strides.back();
    const float inv_d = static_cast<float>(1.0 / static_cast<double>(d));
    const float* tab = rope_table(offp, os, n_starts, t_len, offset, scale, ip, is, dims / 2);
    parallel_ranges(batch * t_len, grain_for(c), [&](int64_t bt0, int64_t bt1) {
      thread_local std::vector<float> normed, row_out;  // per pool thread
      normed.resize(d);
      row_out.resize(d);
      for (int64_t bt = bt0; bt < bt1; ++bt) {
        const int64_t b = bt / t_len, t = bt % t_len;
        const float* row = xv.row(bt, c);
        const float* cs = tab + ((n_starts > 1 ? b : 0) * t_len + t) * dims;
        for (size_t p = 0; p < parts.size(); ++p) {
          const Part& part = parts[p];
          for (int64_t h = 0; h < part.heads; ++h) {
            const float* src = row + (part.col + h * d) * xs;
            int64_t src_stride = xs;
            if (jobs[p].norm) {
              rms_norm_row(src, xs, jobs[p].norm, jobs[p].norm_stride, normed.data(), d, inv_d, eps);
              src = normed.data();
              src_stride = 1;
            }
            const int64_t at = ((b * part.heads + h) * t_len + t) * d;
            const bool f32 = part.dtype == mx::float32;
            float* dst = f32 ? static_cast<float*>(jobs[p].out) + at : row_out.data();
            if (part.rotate) {
              rope_row(src, src_stride, cs, dst, d, dims, trad);
            } else {
              for (int64_t i = 0; i < d; ++i) dst[i] = src[i * src_stride];
            }
            if (part.dtype == mx::float16) {
              cast_row(dst, static_cast<mx::float16_t*>(jobs[p].out) + at, d);
            } else if (part.dtype == mx::bfloat16) {
              cast_row(dst, static_cast<mx::bfloat16_t*>(jobs[p].out) + at, d);
            }
          }
        }
      }
    });
  });
}

void FastHeads::eval_gpu(const std::vector<array>&, std::vector<array>&) {
  throw std::runtime_error("FastHeads has no GPU implementation");
}

bool FastHeads::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastHeads*>(&other);
  if (!o || o->parts_.size() != parts_.size()) return false;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part &a = parts_[i], &b = o->parts_[i];
    if (a.col != b.col || a.heads != b.heads || a.rotate != b.rotate || a.norm != b.norm ||
        a.dtype != b.dtype)
      return false;
  }
  return o->head_dim_ == head_dim_ && o->dims_ == dims_ && o->traditional_ == traditional_ &&
         o->scale_ == scale_ && o->offset_ == offset_ && o->has_offsets_ == has_offsets_ &&
         o->eps_ == eps_;
}

std::vector<mx::Shape> FastHeads::output_shapes(const std::vector<array>& inputs) {
  const array& x = inputs[0];
  std::vector<mx::Shape> shapes;
  for (auto& p : parts_) shapes.push_back({x.shape(0), p.heads, x.shape(1), head_dim_});
  return shapes;
}

// ---------------------------------------------------------------------------
// Bridge functions

std::unique_ptr<array> fused_rms_norm(const array& x, const array& w, float eps) {
  if (!runs_here(x) || w.dtype() != mx::float32 || w.ndim() != 1 || w.shape(0) != x.shape(-1))
    return nullptr;
  auto prim = std::make_shared<FastRmsNorm>(mx::default_stream(mx::Device::cpu), eps);
  return std::make_unique<array>(x.shape(), mx::float32, std::move(prim),
                                 std::vector<array>{x, w});
}

std::unique_ptr<ArrVec> fused_add_rms_norm(const array& x, const array& y, const array& w,
                                           float eps) {
  if (!runs_here(x) || y.dtype() != mx::float32 || y.shape() != x.shape() ||
      w.dtype() != mx::float32 || w.ndim() != 1 || w.shape(0) != x.shape(-1))
    return nullptr;
  auto prim = std::make_shared<FastAddRmsNorm>(mx::default_stream(mx::Device::cpu), eps);
  auto out = std::make_unique<ArrVec>();
  out->v = array::make_arrays({x.shape(), x.shape()}, {mx::float32, mx::float32}, std::move(prim),
                              {x, y, w});
  return out;
}

namespace {

bool rope_applies(const array& x, int dims, const array& inv) {
  return runs_here(x) && x.ndim() >= 3 && dims > 0 && dims % 2 == 0 && dims <= x.shape(-1) &&
         inv.dtype() == mx::float32 && inv.ndim() == 1 && inv.shape(0) == dims / 2;
}

}  // namespace

std::unique_ptr<array> fused_rope(const array& x, int32_t dims, bool traditional, float scale,
                                  int32_t offset, const array& inv_freqs) {
  if (!rope_applies(x, dims, inv_freqs)) return nullptr;
  auto prim = std::make_shared<FastRope>(mx::default_stream(mx::Device::cpu), dims, traditional,
                                         scale, offset);
  return std::make_unique<array>(x.shape(), mx::float32, std::move(prim),
                                 std::vector<array>{x, inv_freqs});
}

std::unique_ptr<array> fused_rope_at(const array& x, int32_t dims, bool traditional, float scale,
                                     const array& offsets, const array& inv_freqs) {
  if (!rope_applies(x, dims, inv_freqs) || offsets.ndim() != 1 ||
      (offsets.size() != 1 && offsets.shape(0) != x.shape(0)))
    return nullptr;
  auto prim = std::make_shared<FastRope>(mx::default_stream(mx::Device::cpu), dims, traditional,
                                         scale, 0);
  return std::make_unique<array>(x.shape(), mx::float32, std::move(prim),
                                 std::vector<array>{x, inv_freqs, mx::astype(offsets, mx::int32)});
}

std::unique_ptr<ArrVec> fused_heads(const array& x, rust::Slice<const int32_t> cols,
                                    rust::Slice<const int32_t> heads,
                                    rust::Slice<const uint8_t> rotate,
                                    rust::Slice<const uint8_t> dtypes, int32_t head_dim,
                                    int32_t dims, bool traditional, float scale, int32_t offset,
                                    const array* offsets, const array& inv_freqs,
                                    const array* q_norm, const array* k_norm, float eps) {
  const size_t n = cols.size();
  if (n == 0 || heads.size() != n || rotate.size() != n || dtypes.size() != n) return nullptr;
  if (!runs_here(x) || x.ndim() != 3 || head_dim <= 0 || dims <= 0 || dims % 2 != 0 ||
      dims > head_dim || inv_freqs.dtype() != mx::float32 || inv_freqs.ndim() != 1 ||
      inv_freqs.shape(0) != dims / 2)
    return nullptr;
  if (offsets && (offsets->ndim() != 1 || (offsets->size() != 1 && offsets->shape(0) != x.shape(0))))
    return nullptr;
  std::vector<array> inputs{x, inv_freqs};
  if (offsets) inputs.push_back(mx::astype(*offsets, mx::int32));
  // The norms apply to the first part (queries) and the second (keys).
  int norm_at[2] = {-1, -1};
  const array* norms[2] = {q_norm, k_norm};
  for (int i = 0; i < 2; ++i) {
    if (!norms[i]) continue;
    const array& w = *norms[i];
    if (w.dtype() != mx::float32 || w.ndim() != 1 || w.shape(0) != head_dim || n < 2) return nullptr;
    norm_at[i] = static_cast<int>(inputs.size());
    inputs.push_back(w);
  }
  std::vector<FastHeads::Part> parts;
  for (size_t i = 0; i < n; ++i) {
    if (heads[i] <= 0 || cols[i] < 0 || cols[i] + int64_t{heads[i]} * head_dim > x.shape(2))
      return nullptr;
    const mx::Dtype dt = to_dtype(dtypes[i]);
    if (dt != mx::float32 && dt != mx::float16 && dt != mx::bfloat16) return nullptr;
    parts.push_back({cols[i], heads[i], rotate[i] != 0, i < 2 ? norm_at[i] : -1, dt});
  }
  auto prim = std::make_shared<FastHeads>(mx::default_stream(mx::Device::cpu), std::move(parts),
                                          head_dim, dims, traditional, scale, offset,
                                          offsets != nullptr, eps);
  std::vector<mx::Shape> shapes = prim->output_shapes(inputs);
  auto out = std::make_unique<ArrVec>();
  std::vector<mx::Dtype> types;
  for (auto& p : prim->parts()) types.push_back(p.dtype);
  out->v = array::make_arrays(std::move(shapes), std::move(types), std::move(prim),
                              std::move(inputs));
  return out;
}

std::unique_ptr<array> rope_inv_freqs(int32_t dims, float base) {
  const int half = dims / 2;
  return std::make_unique<array>(
      mx::exp(mx::multiply(mx::arange(0, -half, -1, mx::float32),
                           array(std::log(base) / half, mx::float32))));
}

std::unique_ptr<array> rope_inv_freqs_of(const array& freqs) {
  return std::make_unique<array>(mx::reciprocal(mx::astype(freqs, mx::float32)));
}

bool is_fused_node(const array& a) {
  if (!a.has_primitive()) return false;
  auto& p = a.primitive();
  return dynamic_cast<FastRmsNorm*>(&p) || dynamic_cast<FastRope*>(&p) ||
         dynamic_cast<FastHeads*>(&p) || dynamic_cast<FastAddRmsNorm*>(&p);
}

}  // namespace mlxrt::fused
