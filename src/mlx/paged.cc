#include "mlxrt/src/mlx/paged.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/qsdpa.h"

namespace mx = mlx::core;

namespace mlxrt::fattn {
// The float attention kernels (fattn_impl.h), one per variant (`f16`: for
// keys and values stored as f16; paged pools are f32).
namespace portable {
const qsdpa::Kernels* kernels(bool f16);
}
#if defined(__x86_64__)
namespace avx2 {
const qsdpa::Kernels* kernels(bool f16);
}
namespace avx512 {
const qsdpa::Kernels* kernels(bool f16);
}
#endif
}  // namespace mlxrt::fattn

namespace mlxrt::paged {

namespace {

const Kernels* select_kernels(uint8_t code) {
  switch (qsdpa::select_isa(code)) {
    case Isa::Portable: return fattn::portable::kernels(false);
#if defined(__x86_64__)
    case Isa::Avx2: return fattn::avx2::kernels(false);
    case Isa::Avx512: return fattn::avx512::kernels(false);
#endif
    default: throw std::invalid_argument("this build has no kernels for the requested instruction set");
  }
}

// Largest power of two dividing `bs`, at most kChunk: chunks of that many
// keys (and of every smaller power of two the driver halves to) never
// cross a block.
int block_chunk(int bs) {
  int c = qsdpa::kChunk;
  while (c > 1 && bs % c != 0) c /= 2;
  return c;
}

// What the chunk callback rebases: the whole problem (pool pointers at
// block 0), the checked table and lengths, and the pools' block strides.
struct Paged {
  const qsdpa::Problem* p;
  const Kernels* k;
  const int32_t* table;
  const int32_t* lens;
  int max_blocks, bs;
  int64_t kw, vw;          // bytes between blocks of the key / value rows (words)
  int64_t ks, kb, vs, vb;  // floats between blocks of scales and biases (quantized)
};

// Chunk [t0, t1) of row b lies in logical block j = t0 / bs: the kernel
// sees that block's keys and values as positions [0, bs) of a problem of
// lens[b] - j * bs keys (and the transposed keys shifted likewise).
void chunk(const void* c, int b, int h, int m0, int rows, int t0, int t1, float* scratch,
           float* acc, float* mx, float* sum) {
  const auto& g = *static_cast<const Paged*>(c);
  const int j = t0 / g.bs, base = j * g.bs;
  const int64_t id = g.table[static_cast<int64_t>(b) * g.max_blocks + j];
  qsdpa::Problem r = *g.p;
  r.k.w += id * g.kw;
  r.v.w += id * g.vw;
  if (r.k.scales) {
    r.k.scales += id * g.ks;
    r.k.biases += id * g.kb;
    r.v.scales += id * g.vs;
    r.v.biases += id * g.vb;
  }
  r.T = g.lens[b] - base;
  if (r.keys_t) r.keys_t += base;
  g.k->chunk(r, b, h, m0, rows, t0 - base, t1 - base, scratch, acc, mx, sum);
}

// The table and lengths of a batch checked against a pool of N blocks:
// rows with a length or a block id outside it get length 0 and `bad`
// (NaN output), never a read outside the pool. Under a causal window a
// row's leading blocks that no query of the forward sees (`L` queries:
// wholly before key lens[b] - L - window + 1) may be -1 (released): they
// read as block 0 where a chunk touches them, and every score there is
// masked.
struct Checked {
  std::vector<int32_t> ids, lens, from;  // from: first key a query of the row may see
  std::vector<char> bad;
  int max_blocks, T;  // T: the longest row (at least 1)
};

Checked check(const array& table, const array& lens, int N, int bs, int L, bool causal,
              int window) {
  const int B = lens.shape(0), max_blocks = table.shape(1);
  const int32_t* t = table.data<int32_t>();
  const int32_t* l = lens.data<int32_t>();
  Checked c{std::vector<int32_t>(static_cast<size_t>(B) * max_blocks, 0), std::vector<int32_t>(B, 0),
            std::vector<int32_t>(B, 0), std::vector<char>(B, 0), max_blocks, 1};
  for (int b = 0; b < B; ++b) {
    const int n = l[b];
    bool ok = n >= 0 && n <= max_blocks * bs;
    const int from = causal && window > 0 ? std::max(0, n - L - window + 1) : 0;
    for (int j = 0; ok && j < (n + bs - 1) / bs; ++j) {
      const int32_t id = t[static_cast<int64_t>(b) * max_blocks + j];
      const bool released = id == -1 && (j + 1) * bs <= from;
      ok = released || (id >= 0 && id < N);
      if (ok && !released) c.ids[static_cast<size_t>(b) * max_blocks + j] = id;
    }
    c.lens[b] = ok ? n : 0;
    c.from[b] = ok ? from / bs * bs : 0;
    c.bad[b] = !ok;
    if (ok) c.T = std::max(c.T, n);
  }
  return c;
}

// Runs `s` (chunk callback and context set, T = c.T) with the rows' own
// lengths and chunks inside blocks of `bs`; a row of length 0 (all padding
// so far) gives zeros, a bad one NaN.
void run_rows(qsdpa::Split s, const Checked& c, int bs) {
  s.lens = c.lens.data();
  s.chunk_keys = block_chunk(bs);
  qsdpa::flash_attention(s);
  const size_t per_row = static_cast<size_t>(s.H) * s.rep * s.L * s.dv;
  for (int b = 0; b < s.B; ++b) {
    if (c.lens[b] != 0) continue;
    const float fill = c.bad[b] ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    std::fill(s.out + b * per_row, s.out + (b + 1) * per_row, fill);
  }
}

// Runs `p` (pools at block 0, T = c.T) through the driver, chunks rebased
// by `g`.
void attend(const qsdpa::Problem& p, const Checked& c, Paged g, const int* order, int rep,
            float* out) {
  g.p = &p;
  g.table = c.ids.data();
  g.lens = c.lens.data();
  g.max_blocks = c.max_blocks;
  qsdpa::Split s{p.B, p.H, p.M, p.L, p.T, p.v.dim, g.k->rows, p.mask == qsdpa::MaskKind::Causal,
                 qsdpa::kScratchFloats, qsdpa::kChunk, &chunk, &g, order, rep, out};
  s.window = p.window;
  run_rows(s, c, g.bs);
}

struct Inputs {
  array q, k, v, table, lens;
};

void compute(const Inputs& in, float* out, float scale, bool causal, int window,
             const Kernels* k) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int N = in.k.shape(0), H = in.k.shape(1), bs = in.k.shape(2), Dv = in.v.shape(3);
  const int rep = Hq / H;
  const Checked c = check(in.table, in.lens, N, bs, L, causal, window);
  std::vector<float> qbuf;
  const float* qp = qsdpa::group_queries(in.q, H, scale, nullptr, qbuf);
  const qsdpa::Rows kr(in.k), vr(in.v);
  auto plane = [](const qsdpa::Rows& r, int dim) {
    return qsdpa::Plane{r.data, nullptr, nullptr, {0, r.bh[1] * 4}, {0, 0}, {0, 0}, dim};
  };
  qsdpa::Problem p{qp, plane(kr, D), plane(vr, Dv), B, H, rep * L, L, c.T, 0, 32,
                   causal ? qsdpa::MaskKind::Causal : qsdpa::MaskKind::None, nullptr,
                   {0, 0, 0, 0}};
  p.window = window;
  // Prefill: keys transposed once per (b, h) in logical order, as fattn does
  // (from the first block a query sees: released ones stay zero).
  std::vector<float> kt;
  if (qsdpa::transpose_keys(p, k->rows)) {
    p.kt_len = c.T + 2 * k->lanes;
    kt.assign(static_cast<size_t>(B) * H * D * p.kt_len, 0.0f);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        float* dst = kt.data() + (static_cast<size_t>(b) * H + h) * D * p.kt_len;
        for (int t = c.from[b]; t < c.lens[b]; ++t) {
          const int64_t id = c.ids[static_cast<size_t>(b) * c.max_blocks + t / bs];
          const float* src = reinterpret_cast<const float*>(
              kr.data + (id * kr.bh[0] + h * kr.bh[1]) * 4) + static_cast<size_t>(t % bs) * D;
          for (int d = 0; d < D; ++d) dst[d * p.kt_len + t] = src[d];
        }
      }
    p.keys_t = kt.data();
  }
  attend(p, c, Paged{nullptr, k, nullptr, nullptr, 0, bs, kr.bh[0] * 4, vr.bh[0] * 4, 0, 0, 0, 0},
         nullptr, rep, out);
}

// Index of value d inside the quantized kernels' order (as qsdpa.cc):
// 4-bit values are permuted in each block of 2 * lanes (even d, then odd).
int kernel_pos(int d, int bits, int lanes) {
  if (bits != 4) return d;
  const int base = d - d % (2 * lanes), j = d - base;
  return base + (j % 2) * lanes + j / 2;
}

struct QInputs {
  array q, kw, ks, kb, vw, vs, vb, table, lens;
};

void compute_quantized(const QInputs& in, float* out, float scale, int group, int bits,
                       bool causal, int window, const Kernels* k) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int N = in.kw.shape(0), H = in.kw.shape(1), bs = in.kw.shape(2);
  const int rep = Hq / H, Dv = in.vw.shape(3) * 32 / bits;
  const Checked c = check(in.table, in.lens, N, bs, L, causal, window);
  std::vector<int> qpos(D), order(Dv);
  for (int d = 0; d < D; ++d) qpos[d] = kernel_pos(d, bits, k->lanes);
  for (int d = 0; d < Dv; ++d) order[d] = kernel_pos(d, bits, k->lanes);
  std::vector<float> qbuf;
  const float* qp = qsdpa::group_queries(in.q, H, scale, qpos.data(), qbuf);
  const qsdpa::Rows kw(in.kw), ks(in.ks), kb(in.kb), vw(in.vw), vs(in.vs), vb(in.vb);
  auto plane = [](const qsdpa::Rows& w, const qsdpa::Rows& s, const qsdpa::Rows& b, int dim) {
    return qsdpa::Plane{w.data, reinterpret_cast<const float*>(s.data),
                        reinterpret_cast<const float*>(b.data), {0, w.bh[1] * 4}, {0, s.bh[1]},
                        {0, b.bh[1]}, dim};
  };
  qsdpa::Problem p{qp, plane(kw, ks, kb, D), plane(vw, vs, vb, Dv), B, H, rep * L, L, c.T,
                   group, bits, causal ? qsdpa::MaskKind::Causal : qsdpa::MaskKind::None,
                   nullptr, {0, 0, 0, 0}};
  p.window = window;
  attend(p, c,
         Paged{nullptr, k, nullptr, nullptr, 0, bs, kw.bh[0] * 4, vw.bh[0] * 4, ks.bh[0], kb.bh[0],
               vs.bh[0], vb.bh[0]},
         order.data(), rep, out);
}

const Kernels* select_quantized(uint8_t code) {
  switch (qsdpa::select_isa(code)) {
    case Isa::Portable: return qsdpa::kernels_portable();
    case Isa::Avx2: return qsdpa::kernels_avx2();
    case Isa::Avx512: return qsdpa::kernels_avx512();
    default: return nullptr;
  }
}

// ---- TurboQuant pools: five byte planes rebased the same way ----

struct PagedTurbo {
  const qsdpa::TurboProblem* p;
  const TurboKernels* k;
  const int32_t* table;
  const int32_t* lens;
  int max_blocks, bs;
  int64_t step[5];  // bytes between blocks of each plane (TurboProblem's order)
};

void turbo_chunk(const void* c, int b, int h, int m0, int rows, int t0, int t1, float* scratch,
                 float* acc, float* mx, float* sum) {
  const auto& g = *static_cast<const PagedTurbo*>(c);
  const int j = t0 / g.bs, base = j * g.bs;
  const int64_t id = g.table[static_cast<int64_t>(b) * g.max_blocks + j];
  qsdpa::TurboProblem r = *g.p;
  qsdpa::Bytes* planes[5] = {&r.k_idx, &r.k_scale, &r.k_zero, &r.v_idx, &r.v_scale};
  for (int i = 0; i < 5; ++i) planes[i]->data += id * g.step[i];
  r.base.T = g.lens[b] - base;
  g.k->chunk(r, b, h, m0, rows, t0 - base, t1 - base, scratch, acc, mx, sum);
}

struct TInputs {
  array q, ki, ks, kz, vi, vs, table, lens;
};

void compute_turbo(const TInputs& in, float* out, float scale, int key_bits, int value_bits,
                   const std::array<float, 16>& book, bool causal, int window,
                   const TurboKernels* k) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int N = in.ki.shape(0), H = in.ki.shape(1), bs = in.ki.shape(2);
  const int rep = Hq / H, M = rep * L, Dv = in.vs.shape(3) * 32;
  const Checked c = check(in.table, in.lens, N, bs, L, causal, window);
  std::vector<float> qbuf;
  const float* qp = qsdpa::group_queries(in.q, H, scale, nullptr, qbuf);
  const qsdpa::Rows ki(in.ki), ks(in.ks), kz(in.kz), vi(in.vi), vs(in.vs);
  // Each plane at block 0, (b, h) strides {0, head}: the callback adds the
  // block.
  auto bytes = [](const qsdpa::Rows& r, const array& a) {
    const int64_t item = a.itemsize();
    return qsdpa::Bytes{r.data, {0, r.bh[1] * item}, a.shape(3) * item};
  };
  auto step = [](const qsdpa::Rows& r, const array& a) {
    return r.bh[0] * static_cast<int64_t>(a.itemsize());
  };
  const auto mask = causal ? qsdpa::MaskKind::Causal : qsdpa::MaskKind::None;
  qsdpa::TurboProblem p{};
  p.base = qsdpa::Problem{nullptr, {}, {}, B, H, M, L, c.T, 32, 0, mask, nullptr, {0, 0, 0, 0}};
  p.base.window = window;
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
  PagedTurbo g{&p,
               k,
               c.ids.data(),
               c.lens.data(),
               c.max_blocks,
               bs,
               {step(ki, in.ki), step(ks, in.ks), step(kz, in.kz), step(vi, in.vi), step(vs, in.vs)}};
  qsdpa::Split s{B, H, M, L, c.T, Dv, k->rows, causal, qsdpa::turbo_scratch_floats(D, Dv),
                 qsdpa::kChunk, &turbo_chunk, &g, nullptr, rep, out};
  s.window = window;
  run_rows(s, c, bs);
}

const TurboKernels* select_turbo(uint8_t code) {
  switch (qsdpa::select_isa(code)) {
    case Isa::Avx512: return qsdpa::turbo_kernels_avx512();
    case Isa::Avx2: return qsdpa::turbo_kernels_avx2();
    case Isa::Portable: return qsdpa::turbo_kernels_portable();
    default: return nullptr;
  }
}

bool is_plane(const array& a, mx::Dtype dt, int N, int H, int bs, int cols) {
  return a.ndim() == 4 && a.dtype() == dt && a.shape(0) == N && a.shape(1) == H &&
         a.shape(2) == bs && a.shape(3) == cols;
}

// A 4-D array copied element by element into dense row-major `o`.
void strided_copy(const array& a, uint8_t* o) {
  const auto& sh = a.shape();
  const auto& st = a.strides();
  const size_t item = a.itemsize();
  const uint8_t* src = a.data<uint8_t>();
  for (int i = 0; i < sh[0]; ++i)
    for (int j = 0; j < sh[1]; ++j)
      for (int t = 0; t < sh[2]; ++t)
        for (int d = 0; d < sh[3]; ++d, o += item)
          std::memcpy(o, src + (i * st[0] + j * st[1] + t * st[2] + d * st[3]) * item, item);
}

bool is_f32(const array& a) { return a.ndim() == 4 && a.dtype() == mx::float32; }

}  // namespace

void PagedFloatSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  Inputs in{weak(0), weak(1), weak(2), weak(3), weak(4)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, causal = causal_,
                window = window_, k = kernels_]() { compute(in, o, scale, causal, window, k); });
}

void PagedFloatSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("PagedFloatSdpa has no GPU implementation");
}

bool PagedFloatSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const PagedFloatSdpa*>(&other);
  return o && o->scale_ == scale_ && o->causal_ == causal_ && o->window_ == window_ &&
         o->kernels_ == kernels_;
}

std::vector<mx::Shape> PagedFloatSdpa::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[2].shape(3);
  return {shape};
}

void PagedQuantizedSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  QInputs in{weak(0), weak(1), weak(2), weak(3), weak(4), weak(5), weak(6), weak(7), weak(8)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, group = group_,
                bits = bits_, causal = causal_, window = window_, k = kernels_]() {
    compute_quantized(in, o, scale, group, bits, causal, window, k);
  });
}

void PagedQuantizedSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("PagedQuantizedSdpa has no GPU implementation");
}

bool PagedQuantizedSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const PagedQuantizedSdpa*>(&other);
  return o && o->scale_ == scale_ && o->group_ == group_ && o->bits_ == bits_ &&
         o->causal_ == causal_ && o->window_ == window_ && o->kernels_ == kernels_;
}

std::vector<mx::Shape> PagedQuantizedSdpa::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[4].shape(3) * 32 / bits_;
  return {shape};
}

void PagedTurboSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  TInputs in{weak(0), weak(1), weak(2), weak(3), weak(4), weak(5), weak(6), weak(7)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, kb = key_bits_,
                vb = value_bits_, book = book_, causal = causal_, window = window_,
                k = kernels_]() { compute_turbo(in, o, scale, kb, vb, book, causal, window, k); });
}

void PagedTurboSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("PagedTurboSdpa has no GPU implementation");
}

bool PagedTurboSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const PagedTurboSdpa*>(&other);
  return o && o->scale_ == scale_ && o->key_bits_ == key_bits_ &&
         o->value_bits_ == value_bits_ && o->book_ == book_ && o->causal_ == causal_ &&
         o->window_ == window_ && o->kernels_ == kernels_;
}

std::vector<mx::Shape> PagedTurboSdpa::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[5].shape(3) * 32;
  return {shape};
}

void PagedWrite::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& pool = inputs[0];
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  // paged_write makes rows and dest row-contiguous; a pool that is not (a
  // fresh broadcast of zeros) is copied dense first.
  const bool dense = pool.flags().row_contiguous;
  const bool donate = dense && pool.is_donatable();
  if (donate) {
    out.copy_shared_buffer(pool);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  enc.dispatch([pool = weak(0), rows = weak(1), dest = weak(2), o = out.data<uint8_t>(), donate,
                dense, bytes = out.nbytes()]() {
    if (!donate && dense) std::memcpy(o, pool.data<uint8_t>(), bytes);
    if (!dense) strided_copy(pool, o);
    const int n = rows.shape(0);
    const size_t row = static_cast<size_t>(rows.shape(1)) * rows.itemsize();
    const int64_t count = static_cast<int64_t>(bytes / std::max<size_t>(row, 1));
    const int32_t* d = dest.data<int32_t>();
    const uint8_t* src = rows.data<uint8_t>();
    for (int i = 0; i < n; ++i)
      if (d[i] >= 0 && d[i] < count) std::memcpy(o + d[i] * row, src + i * row, row);
  });
}

void PagedWrite::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("PagedWrite has no GPU implementation");
}

std::unique_ptr<array> paged_float_sdpa(const array& q, const array& k_pool, const array& v_pool,
                                        const array& table, const array& lens, float scale,
                                        bool causal, int32_t window, uint8_t isa) {
  const Kernels* kern = select_kernels(isa);
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (!is_f32(q) || !is_f32(k_pool) || !is_f32(v_pool)) return nullptr;
  if (table.ndim() != 2 || table.dtype() != mx::int32 || lens.ndim() != 1 ||
      lens.dtype() != mx::int32)
    throw std::invalid_argument("paged_float_sdpa: table [B, blocks] and lens [B] must be int32");
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int N = k_pool.shape(0), H = k_pool.shape(1), bs = k_pool.shape(2), Dv = v_pool.shape(3);
  if (table.shape(0) != B || lens.shape(0) != B)
    throw std::invalid_argument("paged_float_sdpa: table and lens need one row per batch row");
  if (B < 1 || L < 1 || H < 1 || N < 1 || Hq % H != 0 || k_pool.shape(3) != D ||
      v_pool.shape(0) != N || v_pool.shape(1) != H || v_pool.shape(2) != bs)
    throw std::invalid_argument("paged_float_sdpa: pools and queries do not match");
  if (window < 0 || (window > 0 && !causal))
    throw std::invalid_argument("paged_float_sdpa: a window needs the causal mask");
  if (bs % 32 != 0) return nullptr;
  if (D % kern->lanes != 0 || Dv % kern->lanes != 0) return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;
  auto prim = std::make_shared<PagedFloatSdpa>(mx::default_stream(mx::Device::cpu), scale, causal,
                                               window, kern);
  return std::make_unique<array>(mx::Shape{B, Hq, L, Dv}, mx::float32, std::move(prim),
                                 std::vector<array>{q, k_pool, v_pool, table, lens});
}

std::unique_ptr<array> paged_quantized_sdpa(const array& q, const array& kw, const array& ks,
                                            const array& kb, const array& vw, const array& vs,
                                            const array& vb, const array& table,
                                            const array& lens, float scale, bool causal,
                                            int32_t window, int32_t group, int32_t bits,
                                            uint8_t isa) {
  const Kernels* kern = select_quantized(isa);
  if (!kern) throw std::invalid_argument("this build has no kernel for the requested instruction set");
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (table.ndim() != 2 || table.dtype() != mx::int32 || lens.ndim() != 1 ||
      lens.dtype() != mx::int32 || q.ndim() != 4 || kw.ndim() != 4 || vw.ndim() != 4)
    throw std::invalid_argument("paged_quantized_sdpa: q, pools 4-D; table [B, blocks], lens [B] int32");
  if (window < 0 || (window > 0 && !causal))
    throw std::invalid_argument("paged_quantized_sdpa: a window needs the causal mask");
  if (bits != 4 && bits != 8) return nullptr;
  if (group != 32 && group != 64 && group != 128) return nullptr;
  if (group % (2 * kern->lanes) != 0) return nullptr;
  if (q.dtype() != mx::float32 || kw.dtype() != mx::uint32 || vw.dtype() != mx::uint32)
    return nullptr;
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int N = kw.shape(0), H = kw.shape(1), bs = kw.shape(2);
  const int Dv = static_cast<int64_t>(vw.shape(3)) * 32 / bits;
  if (table.shape(0) != B || lens.shape(0) != B || B < 1 || L < 1 || H < 1 || Hq % H != 0)
    throw std::invalid_argument("paged_quantized_sdpa: pools, table and queries do not match");
  if (static_cast<int64_t>(kw.shape(3)) * 32 / bits != D || D % group != 0 || Dv < 1 ||
      Dv % group != 0)
    return nullptr;
  if (!is_plane(vw, mx::uint32, N, H, bs, vw.shape(3)) ||
      !is_plane(ks, mx::float32, N, H, bs, D / group) ||
      !is_plane(kb, mx::float32, N, H, bs, D / group) ||
      !is_plane(vs, mx::float32, N, H, bs, Dv / group) ||
      !is_plane(vb, mx::float32, N, H, bs, Dv / group))
    return nullptr;
  if (bs % 32 != 0) return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;
  auto prim = std::make_shared<PagedQuantizedSdpa>(mx::default_stream(mx::Device::cpu), scale,
                                                   group, bits, causal, window, kern);
  return std::make_unique<array>(mx::Shape{B, Hq, L, Dv}, mx::float32, std::move(prim),
                                 std::vector<array>{q, kw, ks, kb, vw, vs, vb, table, lens});
}

std::unique_ptr<array> paged_turbo_sdpa(const array& q, const array& ki, const array& ks,
                                        const array& kz, const array& vi, const array& vs,
                                        const array& table, const array& lens,
                                        rust::Slice<const float> book, int32_t key_bits,
                                        int32_t value_bits, float scale, bool causal,
                                        int32_t window, uint8_t isa) {
  const TurboKernels* kern = select_turbo(isa);
  if (!kern) throw std::invalid_argument("this build has no kernel for the requested instruction set");
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (table.ndim() != 2 || table.dtype() != mx::int32 || lens.ndim() != 1 ||
      lens.dtype() != mx::int32 || q.ndim() != 4 || ki.ndim() != 4 || vs.ndim() != 4)
    throw std::invalid_argument("paged_turbo_sdpa: q, pools 4-D; table [B, blocks], lens [B] int32");
  if (window < 0 || (window > 0 && !causal))
    throw std::invalid_argument("paged_turbo_sdpa: a window needs the causal mask");
  if (!qsdpa::turbo_kernel_bits(key_bits, value_bits)) return nullptr;
  if (book.size() != (size_t{1} << value_bits)) return nullptr;
  if (q.dtype() != mx::float32) return nullptr;
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int N = ki.shape(0), H = ki.shape(1), bs = ki.shape(2), Dv = vs.shape(3) * 32;
  if (table.shape(0) != B || lens.shape(0) != B || B < 1 || L < 1 || H < 1 || Hq % H != 0)
    throw std::invalid_argument("paged_turbo_sdpa: pools, table and queries do not match");
  if (D < 32 || D % 32 != 0 || Dv < 32) return nullptr;
  const auto key_type = key_bits == 8 ? mx::int8 : mx::uint8;
  if (!is_plane(ki, key_type, N, H, bs, D * key_bits / 8) ||
      !is_plane(ks, mx::float16, N, H, bs, D / 32) || !is_plane(kz, mx::float16, N, H, bs, D / 32) ||
      !is_plane(vi, mx::uint8, N, H, bs, Dv * value_bits / 8) ||
      !is_plane(vs, mx::float16, N, H, bs, Dv / 32))
    return nullptr;
  if (bs % 32 != 0) return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;
  std::array<float, 16> cb{};
  std::copy(book.begin(), book.end(), cb.begin());
  auto prim = std::make_shared<PagedTurboSdpa>(mx::default_stream(mx::Device::cpu), scale,
                                               key_bits, value_bits, cb, causal, window, kern);
  return std::make_unique<array>(mx::Shape{B, Hq, L, Dv}, mx::float32, std::move(prim),
                                 std::vector<array>{q, ki, ks, kz, vi, vs, table, lens});
}

std::unique_ptr<array> paged_write(const array& pool, const array& rows, const array& dest,
                                   bool stock) {
  if (pool.ndim() != 4 || rows.ndim() != 2 || dest.ndim() != 1 || dest.dtype() != mx::int32 ||
      rows.shape(0) != dest.shape(0) || rows.shape(1) != pool.shape(3))
    throw std::invalid_argument("paged_write: pool [N, H, bs, X], rows [n, X], dest [n] int32");
  const array r = mx::astype(rows, pool.dtype());
  if (stock || mx::default_device() != mx::Device::cpu) {
    const auto& s = pool.shape();
    array flat = mx::reshape(pool, {s[0] * s[1] * s[2], s[3]});
    array upd = mx::reshape(r, {r.shape(0), 1, s[3]});
    return std::make_unique<array>(mx::reshape(mx::scatter(flat, dest, upd, 0), s));
  }
  std::vector<array> inputs{pool, mx::contiguous(r), mx::contiguous(dest)};
  return std::make_unique<array>(pool.shape(), pool.dtype(),
                                 std::make_shared<PagedWrite>(mx::default_stream(mx::Device::cpu)),
                                 std::move(inputs));
}

uint64_t paged_data_address(const array& a) {
  array e = a;
  e.eval();
  return reinterpret_cast<uint64_t>(e.data<uint8_t>());
}

uint8_t paged_node_isa(const array& a) { return qsdpa::node_isa<PagedFloatSdpa>(a); }

uint8_t paged_q_node_isa(const array& a) { return qsdpa::node_isa<PagedQuantizedSdpa>(a); }

uint8_t paged_t_node_isa(const array& a) { return qsdpa::node_isa<PagedTurboSdpa>(a); }

}  // namespace mlxrt::paged
