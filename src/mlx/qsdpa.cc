#include "mlxrt/src/mlx/qsdpa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlxrt/src/mlx/pool.h"
#include "mlxrt/src/mlx/qmm.h"

namespace mx = mlx::core;

namespace mlxrt::qsdpa {

namespace {

const Kernels* compiled(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return kernels_avx512();
    case Isa::Avx2: return kernels_avx2();
    case Isa::Portable: return kernels_portable();
    default: return nullptr;
  }
}

const Kernels* select_kernels(uint8_t code) {
  const Kernels* k = compiled(select_isa(code));
  if (!k) throw std::invalid_argument("this build has no kernel for the requested instruction set");
  return k;
}

Plane plane(const Rows& w, const Rows& s, const Rows& b, int dim) {
  return Plane{w.data,
               reinterpret_cast<const float*>(s.data),
               reinterpret_cast<const float*>(b.data),
               {w.bh[0] * 4, w.bh[1] * 4},
               {s.bh[0], s.bh[1]},
               {b.bh[0], b.bh[1]},
               dim};
}

// Index of value d inside a kernel's value order: 4-bit values are permuted
// in each block of 2 * lanes (even d first, then odd d).
inline int kernel_pos(int d, int bits, int lanes) {
  if (bits != 4) return d;
  const int base = d - d % (2 * lanes), j = d - base;
  return base + (j % 2) * lanes + j / 2;
}

struct Task {
  const Split* s;
  int mblocks;  // row blocks per (b, h)
  int nchunks;  // chunks over T
  int per;      // chunks per task
  int splits;   // tasks per (b, h, row block): ceil(nchunks / per)
  int stride;   // floats per partial: rows * Dv accumulators, rows maxima, rows sums
  float* partials;  // splits > 1 only: one partial per task, merged afterwards
};

// Folds a chunk's (acc, mx, sum) into a running partial (flash attention's
// online softmax): both rescaled to the larger maximum. An empty chunk or
// partial has maximum -inf.
void fold(int rows, int dv, const float* acc, const float* mx, const float* sum, float* pacc,
          float* pmx, float* psum) {
  for (int r = 0; r < rows; ++r) {
    if (mx[r] == -std::numeric_limits<float>::infinity()) continue;
    float* a = pacc + static_cast<size_t>(r) * dv;
    const float* c = acc + static_cast<size_t>(r) * dv;
    if (pmx[r] == -std::numeric_limits<float>::infinity()) {
      std::memcpy(a, c, sizeof(float) * dv);
      pmx[r] = mx[r];
      psum[r] = sum[r];
      continue;
    }
    const float top = std::max(pmx[r], mx[r]);
    const float fa = std::exp(pmx[r] - top), fc = std::exp(mx[r] - top);
    for (int d = 0; d < dv; ++d) a[d] = fa * a[d] + fc * c[d];
    psum[r] = fa * psum[r] + fc * sum[r];
    pmx[r] = top;
  }
}

// Normalizes a block's accumulators into its output rows (back in value
// order: e.g. the kernels keep 4-bit values permuted like q).
void write_rows(const Split& p, int b, int h, int m0, int rows, const float* acc,
                const float* sum) {
  const int dv = p.dv;
  for (int r = 0; r < rows; ++r) {
    const int m = m0 + r;
    const size_t hq = static_cast<size_t>(h) * p.rep + m / p.L, heads = p.H * p.rep;
    const size_t b_row = static_cast<size_t>(b) * p.L + m % p.L;
    float* o = p.out + (p.heads_last ? b_row * heads + hq
                                     : (b * heads + hq) * p.L + m % p.L) * dv;
    const float* a = acc + static_cast<size_t>(r) * dv;
    for (int d = 0; d < dv; ++d) o[d] = a[p.order ? p.order[d] : d] / sum[r];
  }
}

// One (b, h, row block, range of key chunks): its partial, or with one
// split its output rows.
void run_task(const Task& job, int i) {
  const Split& p = *job.s;
  const int rows_max = p.rows, dv = p.dv;
  const int s = i % job.splits, mb = (i / job.splits) % job.mblocks;
  const int bh = i / (job.splits * job.mblocks), b = bh / p.H, h = bh % p.H;
  const int m0 = mb * rows_max, rows = std::min(rows_max, p.M - m0);
  thread_local std::vector<float> own;
  float* pacc = job.splits > 1 ? job.partials + static_cast<size_t>(i) * job.stride
                               : aligned(own, job.stride);
  float* pmx = pacc + static_cast<size_t>(rows_max) * dv;
  float* psum = pmx + rows_max;
  for (int r = 0; r < rows; ++r) pmx[r] = -std::numeric_limits<float>::infinity();

  // Under the causal mask, keys past every row's last visible one (and
  // with a window, before its first) add exactly 0 to rows that see some
  // key; rows that see none need all of them (their softmax is uniform).
  const int T = p.lens ? p.lens[b] : p.T;
  int begin = 0, end = T;
  if (p.causal) {
    auto last = [&](int m) { return T - p.L + m % p.L; };
    auto first = [&](int m) { return p.window > 0 ? std::max(0, last(m) - p.window + 1) : 0; };
    int lo = last(m0), hi = lo, from = first(m0);
    for (int m = m0; m < m0 + rows; ++m) {
      lo = std::min(lo, last(m));
      hi = std::max(hi, last(m));
      from = std::min(from, first(m));
    }
    if (lo >= 0) {
      begin = from;
      end = std::min(end, hi + 1);
    }
  }

  thread_local std::vector<float> buf;
  float* scratch = aligned(buf, p.scratch);
  thread_local std::vector<float> cbuf;
  float* cacc = aligned(cbuf, static_cast<size_t>(rows_max) * (dv + 2));
  float* cmx = cacc + static_cast<size_t>(rows_max) * dv;
  float* csum = cmx + rows_max;
  const int c1 = std::min(job.nchunks, (s + 1) * job.per);
  for (int c = s * job.per; c < c1; ++c) {
    if (c * p.chunk_keys >= end) break;
    const int t0 = std::max(begin, c * p.chunk_keys), t1 = std::min(end, (c + 1) * p.chunk_keys);
    if (t0 >= t1) continue;
    p.chunk(p.ctx, b, h, m0, rows, t0, t1, scratch, cacc, cmx, csum);
    fold(rows, dv, cacc, cmx, csum, pacc, pmx, psum);
  }
  if (job.splits == 1) write_rows(p, b, h, m0, rows, pacc, psum);
}

// Merges the partials of one (b, h, row block) into the output rows.
void merge(const Task& job, int i) {
  const Split& p = *job.s;
  const int rows_max = p.rows, dv = p.dv;
  const int mb = i % job.mblocks, bh = i / job.mblocks, b = bh / p.H, h = bh % p.H;
  const int m0 = mb * rows_max, rows = std::min(rows_max, p.M - m0);
  const float* first = job.partials + static_cast<size_t>(i) * job.splits * job.stride;
  std::vector<float> acc(static_cast<size_t>(rows_max) * (dv + 2));
  float* mx = acc.data() + static_cast<size_t>(rows_max) * dv;
  float* sum = mx + rows_max;
  std::fill(mx, mx + rows_max, -std::numeric_limits<float>::infinity());
  for (int s = 0; s < job.splits; ++s) {
    const float* part = first + static_cast<size_t>(s) * job.stride;
    const float* pmx = part + static_cast<size_t>(rows_max) * dv;
    fold(rows, dv, part, pmx, pmx + rows_max, acc.data(), mx, sum);
  }
  write_rows(p, b, h, m0, rows, acc.data(), sum);
}

// f(i) for i in [0, n) on the quantized matmul's pool, one item or more
// per piece (pool.h).
template <class F>
void parallel(int n, F& f) {
  parallel_ranges(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(static_cast<int>(i));
  });
}

// Everything eval_cpu's task needs, captured by value.
struct Inputs {
  array q, kw, ks, kb, vw, vs, vb, mask;
};

void compute(const Inputs& in, float* out, float scale, int group, int bits, MaskKind mask,
             const Kernels* k) {
  const int B = in.q.shape(0), Hq = in.q.shape(1), L = in.q.shape(2), D = in.q.shape(3);
  const int H = in.kw.shape(1), T = in.kw.shape(2), rep = Hq / H, M = rep * L;
  const int Dv = in.vw.shape(3) * 32 / bits;

  // q * scale (as mlx-lm's `queries *= scale`); 4-bit: permuted like the
  // keys' nibbles.
  std::vector<int> qpos(D);
  for (int d = 0; d < D; ++d) qpos[d] = kernel_pos(d, bits, k->lanes);
  std::vector<float> qbuf;
  const float* qp = group_queries(in.q, H, scale, qpos.data(), qbuf);

  const Rows kw(in.kw), ks(in.ks), kb(in.kb), vw(in.vw), vs(in.vs), vb(in.vb);
  Problem p{qp, plane(kw, ks, kb, D), plane(vw, vs, vb, Dv), B, H, M, L, T, group, bits, mask,
            nullptr, {0, 0, 0, 0}};
  set_mask(p, in.mask);

  run(p, k, rep, out);
}

bool is_f32_plane(const array& s, int B, int H, int T, int cols) {
  return s.ndim() == 4 && s.dtype() == mx::float32 && s.shape(0) == B && s.shape(1) == H &&
         s.shape(2) == T && s.shape(3) == cols;
}

}  // namespace

float* aligned(std::vector<float>& buf, size_t n) {
  if (buf.size() < n + 16) buf.resize(n + 16);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
}

Rows::Rows(const array& a) {
  const auto& sh = a.shape();
  const auto& st = a.strides();
  const size_t item = a.itemsize();
  const bool rows_dense = st[3] == 1 && (sh[2] <= 1 || st[2] == sh[3]);
  if (rows_dense) {
    data = a.data<uint8_t>();
    bh[0] = st[0];
    bh[1] = st[1];
    return;
  }
  copy.resize(a.size() * item);
  const auto* src = a.data<uint8_t>();
  size_t i = 0;
  for (int b = 0; b < sh[0]; ++b)
    for (int h = 0; h < sh[1]; ++h)
      for (int t = 0; t < sh[2]; ++t)
        for (int d = 0; d < sh[3]; ++d, i += item)
          std::memcpy(&copy[i], src + (b * st[0] + h * st[1] + t * st[2] + d * st[3]) * item, item);
  data = copy.data();
  bh[0] = static_cast<int64_t>(sh[1]) * sh[2] * sh[3];
  bh[1] = static_cast<int64_t>(sh[2]) * sh[3];
}

// The same choice as the quantized matmul: Auto is the best variant the CPU
// runs (capped by MLXRT_QMM_ISA); naming one it cannot run is an error.
Isa select_isa(uint8_t code) {
  if (code > static_cast<uint8_t>(Isa::Avx512))
    throw std::invalid_argument("unknown instruction set code " + std::to_string(code));
  if (code == static_cast<uint8_t>(Isa::Auto)) code = qmm::best_isa();
  if (!qmm::isa_available(code))
    throw std::invalid_argument("this CPU or build cannot run the requested instruction set");
  return static_cast<Isa>(code);
}

MaskKind push_mask(array m, int B, int H, int L, int T, std::vector<array>& inputs) {
  if (m.ndim() > 4 || m.ndim() < 1) return MaskKind::None;
  while (m.ndim() < 4) m = mx::expand_dims(m, 0);
  if (m.shape(1) != 1 && m.shape(1) != H) return MaskKind::None;
  for (int a : {0, 2, 3})
    if (m.shape(a) != 1 && m.shape(a) != (a == 0 ? B : a == 2 ? L : T)) return MaskKind::None;
  auto kind = MaskKind::Bool;
  if (m.dtype() != mx::bool_) {
    kind = MaskKind::Additive;
    m = mx::astype(m, mx::float32);
  }
  inputs.push_back(mx::broadcast_to(m, {B, m.shape(1), L, T}));
  return kind;
}

bool mask_input(uint8_t mask_kind, const array& mask, int B, int H, int Hq, int L, int T,
                MaskKind& kind, std::vector<array>& inputs) {
  kind = mask_kind == 0 ? MaskKind::None : MaskKind::Causal;
  if (mask_kind != 2) return true;
  // mlx-lm lines a 3-D mask up with [rep, L, T] when rep > 1.
  if (mask.ndim() == 3 && Hq != H && mask.shape(0) != 1) return false;
  kind = push_mask(mask, B, H, L, T, inputs);
  return kind != MaskKind::None;
}

void set_mask(Problem& p, const array& mask) {
  if (p.mask != MaskKind::Bool && p.mask != MaskKind::Additive) return;
  p.mask_data = p.mask == MaskKind::Bool ? static_cast<const void*>(mask.data<bool>())
                                         : static_cast<const void*>(mask.data<float>());
  const auto& ms = mask.strides();
  p.mask_stride[0] = ms[0];
  p.mask_stride[1] = mask.shape(1) == 1 ? 0 : ms[1];
  p.mask_stride[2] = ms[2];
  p.mask_stride[3] = ms[3];
}

float* group_queries(const array& q, int H, float scale, const int* pos, std::vector<float>& buf) {
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int rep = Hq / H, M = rep * L;
  float* out = aligned(buf, static_cast<size_t>(B) * H * M * D);
  const auto& qs = q.strides();
  const float* qd = q.data<float>();
  for (int b = 0; b < B; ++b)
    for (int hq = 0; hq < Hq; ++hq)
      for (int l = 0; l < L; ++l) {
        const float* src = qd + b * qs[0] + hq * qs[1] + l * qs[2];
        const int m = (hq % rep) * L + l;
        float* dst = out + ((static_cast<size_t>(b) * H + hq / rep) * M + m) * D;
        for (int d = 0; d < D; ++d) dst[pos ? pos[d] : d] = src[d * qs[3]] * scale;
      }
  return out;
}

// Flash-decoding split: the keys of each (b, h, row block) go to `splits`
// tasks, enough that every thread has several (decode has only B * H row
// blocks), each folding its chunks as it goes; chunks shrink for short T so
// that there are that many.
void flash_attention(const Split& s) {
  const int threads = static_cast<int>(qmm::pool_threads());
  const int mblocks = (s.M + s.rows - 1) / s.rows;
  const int64_t blocks = static_cast<int64_t>(s.B) * s.H * mblocks;
  const int want = static_cast<int>(std::max<int64_t>(1, (8 * threads + blocks - 1) / blocks));
  Split p = s;
  while (p.chunk_keys > 32 && (p.T + p.chunk_keys - 1) / p.chunk_keys < want) p.chunk_keys /= 2;
  const int nchunks = (p.T + p.chunk_keys - 1) / p.chunk_keys;
  const int per = (nchunks + std::min(want, nchunks) - 1) / std::min(want, nchunks);
  const int splits = (nchunks + per - 1) / per;
  const int stride = p.rows * (p.dv + 2);
  const int tasks = static_cast<int>(blocks) * splits;
  // Reused, not zeroed: a task writes its partial's rows before merge reads
  // them (fold copies the first chunk; rows with no chunk keep -inf maxima,
  // which merge skips). A fresh zero-filled vector per call was ~2% of the
  // stream thread's decode samples, in memset.
  thread_local std::vector<float> pbuf;
  float* partials = splits > 1 ? aligned(pbuf, static_cast<size_t>(tasks) * stride) : nullptr;
  Task job{&p, mblocks, nchunks, per, splits, stride, partials};
  auto body = [&](int i) { run_task(job, i); };
  parallel(tasks, body);
  if (splits > 1) {
    auto combine = [&](int i) { merge(job, i); };
    parallel(static_cast<int>(blocks), combine);
  }
}

void run(const Problem& p, const Kernels* k, int rep, float* out) {
  // The kernels' value order (4-bit: permuted like q).
  std::vector<int> order(p.v.dim);
  for (int d = 0; d < p.v.dim; ++d) order[d] = kernel_pos(d, p.bits, k->lanes);
  const std::pair<const Problem*, const Kernels*> ctx{&p, k};
  Split s{p.B, p.H, p.M, p.L, p.T, p.v.dim, k->rows, p.mask == MaskKind::Causal, kScratchFloats,
          kChunk,
          [](const void* c, int b, int h, int m0, int rows, int t0, int t1, float* scratch,
             float* acc, float* mx, float* sum) {
            const auto* pk = static_cast<const std::pair<const Problem*, const Kernels*>*>(c);
            pk->second->chunk(*pk->first, b, h, m0, rows, t0, t1, scratch, acc, mx, sum);
          },
          &ctx, order.data(), rep, out};
  s.window = p.window;
  s.heads_last = p.heads_last;
  flash_attention(s);
}

void QuantizedSdpa::eval_cpu(const std::vector<array>& inputs, array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  auto weak = [&](int i) { return array::unsafe_weak_copy(inputs[i]); };
  Inputs in{weak(0), weak(1), weak(2), weak(3), weak(4), weak(5), weak(6),
            inputs.size() > 7 ? weak(7) : weak(0)};
  enc.dispatch([in = std::move(in), o = out.data<float>(), scale = scale_, group = group_,
                bits = bits_, mask = mask_, k = kernels_]() {
    compute(in, o, scale, group, bits, mask, k);
  });
}

void QuantizedSdpa::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("QuantizedSdpa has no GPU implementation");
}

bool QuantizedSdpa::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const QuantizedSdpa*>(&other);
  return o && o->scale_ == scale_ && o->group_ == group_ && o->bits_ == bits_ &&
         o->mask_ == mask_ && o->kernels_ == kernels_;
}

std::vector<mx::Shape> QuantizedSdpa::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[4].shape(3) * 32 / bits_;
  return {shape};
}

std::unique_ptr<array> quantized_sdpa(const array& q, const array& kw, const array& ks,
                                      const array& kb, const array& vw, const array& vs,
                                      const array& vb, float scale, uint8_t mask_kind,
                                      const array& mask, int32_t group_size, int32_t bits,
                                      uint8_t isa) {
  const Kernels* k = select_kernels(isa);
  if (mask_kind > 2) throw std::invalid_argument("unknown mask kind " + std::to_string(mask_kind));
  if (mx::default_device() != mx::Device::cpu) return nullptr;
  if (bits != 4 && bits != 8) return nullptr;
  if (group_size != 32 && group_size != 64 && group_size != 128) return nullptr;
  if (group_size % (2 * k->lanes) != 0) return nullptr;
  if (q.ndim() != 4 || q.dtype() != mx::float32 || kw.ndim() != 4 || vw.ndim() != 4 ||
      kw.dtype() != mx::uint32 || vw.dtype() != mx::uint32)
    return nullptr;
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int H = kw.shape(1), T = kw.shape(2);
  if (B < 1 || L < 1 || T < 1 || H < 1 || Hq % H != 0) return nullptr;
  if (static_cast<int64_t>(kw.shape(3)) * 32 / bits != D || D % group_size != 0) return nullptr;
  const int Dv = static_cast<int64_t>(vw.shape(3)) * 32 / bits;
  if (Dv < 1 || Dv % group_size != 0) return nullptr;
  if (kw.shape(0) != B || vw.shape(0) != B || vw.shape(1) != H || vw.shape(2) != T) return nullptr;
  if (!is_f32_plane(ks, B, H, T, D / group_size) || !is_f32_plane(kb, B, H, T, D / group_size) ||
      !is_f32_plane(vs, B, H, T, Dv / group_size) || !is_f32_plane(vb, B, H, T, Dv / group_size))
    return nullptr;
  if (static_cast<int64_t>(B) * Hq * L * std::max(D, Dv) >= INT32_MAX) return nullptr;

  MaskKind kind;
  std::vector<array> inputs{q, kw, ks, kb, vw, vs, vb};
  if (!mask_input(mask_kind, mask, B, H, Hq, L, T, kind, inputs)) return nullptr;
  auto prim = std::make_shared<QuantizedSdpa>(mx::default_stream(mx::Device::cpu), scale,
                                              group_size, bits, kind, k);
  return std::make_unique<array>(mx::Shape{B, Hq, L, Dv}, mx::float32, std::move(prim),
                                 std::move(inputs));
}

uint8_t qsdpa_node_isa(const array& a) { return node_isa<QuantizedSdpa>(a); }

}  // namespace mlxrt::qsdpa
