#include "mlxrt/src/mlx/qmm.h"

#include <dlfcn.h>
#include <sched.h>
#if defined(__linux__)
#include <link.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include "mlx/backend/cpu/encoder.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mx = mlx::core;

namespace mlxrt::qmm {

size_t scratch_floats(int K) {
  (void)K;  // panels are blocked to kBlockK whatever K is
  // The rows a GEMM panel is transposed from, and a group of panels.
  static_assert(kPanelCacheFloats >= 2 * kMaxLanes * kBlockK, "one panel fits");
  return static_cast<size_t>(2 * kMaxLanes) * kGemmRowStride + kPanelCacheFloats;
}

namespace {

// ---------------------------------------------------------------------------
// Thread pool
//
// One job at a time, split into numbered chunks that the caller claims
// from the front and the workers from the back. Workers spin briefly after
// a job before sleeping, because a decode step issues hundreds of short
// matmuls separated by a few microseconds of other ops: waking a sleeping
// thread costs more than most of those matmuls. While they spin they
// request the part of the next matmul's weights they will compute.

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// An integer setting in [lo, 4096) from the environment, else `fallback`.
int env_int(const char* name, int fallback, int lo = 1) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == 0 && n >= lo && n < 4096) ? static_cast<int>(n) : fallback;
}

int cpu_count() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// What a worker requests into its L2 while it waits for the next job: the
// output columns of the next matmul that it will likely compute (their
// weights, scales and biases). Decode runs hundreds of matmuls a token,
// each reading its weights from DRAM, with a few microseconds of other
// ops between them in which the worker would only spin.
struct Prefetch {
  // Columns per step; the steps go from the last one down, each reading its
  // columns' weights, then their scales and biases.
  static constexpr int kStep = 32;
  static constexpr int kRanges = 3;
  const char* at[kRanges] = {};  // column 0's bytes in weights, scales, biases
  size_t per_col[kRanges] = {};  // bytes per output column of each (0: none)
  int steps = 0, end = 0;        // columns [end - steps * kStep, end)
  size_t step_bytes() const { return kStep * (per_col[0] + per_col[1] + per_col[2]); }
  size_t total() const { return steps * step_bytes(); }
};

class Pool {
 public:
  // Leaked on purpose: worker threads run until the process exits, and no
  // static destructor can race a matmul still running on an MLX stream.
  static Pool& get() {
    static Pool* pool = new Pool(env_int("MLXRT_QMM_THREADS", cpu_count()));
    return *pool;
  }

  int size() const { return workers_ + 1; }

  // Calls f(i) for i in [0, n) on the pool and the calling thread; returns
  // when all calls are done. The caller claims chunks from the front, the
  // workers from the back, so a worker's share of a job is predictable
  // (`then`: what to read ahead while waiting for the next one). A second
  // caller while a job runs (another MLX stream) does its work alone
  // instead of waiting.
  template <class F>
  void parallel_for(int n, F& f, const Prefetch& then = {}) {
    run(n, [](void* ctx, int i) { (*static_cast<F*>(ctx))(i); }, &f, then);
  }

 private:
  static constexpr int kMaxChunks = 0xffff;
  static constexpr auto kSpin = std::chrono::microseconds(200);

  struct Job {
    void (*fn)(void*, int);
    void* ctx;
    Prefetch then;
    std::atomic<int> done{0};
  };

  explicit Pool(int threads) : workers_(threads - 1) {
    for (int i = 0; i < workers_; ++i) std::thread([this] { worker(); }).detach();
  }

  void run(int n, void (*fn)(void*, int), void* ctx, const Prefetch& then) {
    std::unique_lock<std::mutex> lock(submit_, std::try_to_lock);
    if (!lock.owns_lock() || workers_ == 0 || n <= 1 || n > kMaxChunks) {
      for (int i = 0; i < n; ++i) fn(ctx, i);
      return;
    }
    Job job{fn, ctx, then};
    job_.store(&job, std::memory_order_release);
    const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    state_.store(gen << 32 | static_cast<uint64_t>(n) << 16);
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> g(sleep_mu_);
      cv_.notify_all();
    }
    work(gen, false, nullptr);
    for (unsigned spins = 1; job.done.load(std::memory_order_acquire) < n; ++spins) {
      if (spins % 64 == 0) std::this_thread::yield();  // a preempted worker may need this core
      cpu_relax();
    }
  }

  // Runs unclaimed chunks of job `gen` until none is left, from the front
  // or (`back`) from the back. The state word packs generation (32 bits),
  // the end and the start of the unclaimed chunks (16 bits each), so a
  // claim is only ever made against the job it belongs to. A worker's
  // first claim copies the job's `then` into `*then` (when it has one).
  void work(uint64_t gen, bool back, Prefetch* then) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (bool first = true;;) {
      const uint64_t end = (s >> 16) & 0xffff, start = s & 0xffff;
      if ((s >> 32) != gen || start >= end) return;
      const uint64_t claimed = back ? s - (uint64_t{1} << 16) : s + 1;
      if (!state_.compare_exchange_weak(s, claimed, std::memory_order_acq_rel)) continue;
      // The claimed chunk is not done, so the job (on the caller's stack) is
      // still alive and job_ still points at it.
      Job* job = job_.load(std::memory_order_acquire);
      if (first && then && job->then.total() > 0) *then = job->then;
      first = false;
      job->fn(job->ctx, static_cast<int>(back ? end - 1 : start));
      job->done.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  // Spins (requesting `ahead` from `*cursor` on into the cache, and yielding
  // the core to any other runnable thread, e.g. OpenBLAS's workers, which
  // otherwise wait for our time slice to end), then sleeps.
  uint64_t wait_for_job(uint64_t seen, const Prefetch& ahead, size_t* cursor) {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned spins = 0;; ++spins) {
      const uint64_t gen = state_.load(std::memory_order_acquire) >> 32;
      if (gen != seen) return gen;
      // Not while reading ahead: a yield can hand the core to the engine's
      // graph-building thread for a time slice (not yielding then measured
      // ~1.02x, docs/cpu-kernels.md).
      if ((spins & 63) == 63 && *cursor >= ahead.total()) {
        if (std::chrono::steady_clock::now() - start > kSpin) break;
        std::this_thread::yield();
      }
      if (!prefetch_some(ahead, cursor)) cpu_relax();
    }
    std::unique_lock<std::mutex> lock(sleep_mu_);
    sleepers_.fetch_add(1);  // seq_cst pairs with the load in run()
    uint64_t gen = seen;
    cv_.wait(lock, [&] { return (gen = state_.load() >> 32) != seen; });
    sleepers_.fetch_sub(1);
    return gen;
  }

  // Requests the next few cache lines of `ahead` from `*cursor` on into L2
  // and pauses once; false when all have been requested. Prefetches, not
  // loads, since they never fault: the plan may name the weights of a
  // model dropped since. Over a long run a tight loop of them outruns the
  // core's miss buffers, which then drop some (Zen 4, 256 KB from DRAM,
  // read after 20 us: 28 GB/s when prefetched in a tight loop, 61 with two
  // pauses per 8 lines, 74 when loaded); in decode's short gaps no pause
  // and one per 8 lines measured alike, more pauses less.
  static bool prefetch_some(const Prefetch& ahead, size_t* cursor) {
    constexpr size_t kLine = 64, kBatch = 8 * kLine;
    if (*cursor >= ahead.total()) return false;
    const size_t sb = ahead.step_bytes();
    const size_t col = ahead.end - (*cursor / sb + 1) * Prefetch::kStep;
    size_t c = *cursor % sb;
    int r = 0;
    while (c >= Prefetch::kStep * ahead.per_col[r]) c -= Prefetch::kStep * ahead.per_col[r++];
    const size_t n = std::min(kBatch, Prefetch::kStep * ahead.per_col[r] - c);
    const char* at = ahead.at[r] + col * ahead.per_col[r] + c;
    for (size_t i = 0; i < n; i += kLine) __builtin_prefetch(at + i, 0, 2);
    cpu_relax();
    *cursor += n;
    return true;
  }

  void worker() {
    static const bool read_ahead = env_int("MLXRT_QMM_READ_AHEAD", 1, 0) != 0;
    uint64_t seen = 0;
    Prefetch ahead;
    size_t cursor = 0;
    for (;;) {
      seen = wait_for_job(seen, ahead, &cursor);
      Prefetch next;
      work(seen, true, read_ahead ? &next : nullptr);
      if (next.total() > 0) ahead = next, cursor = 0;
    }
  }

  const int workers_;
  std::mutex submit_;
  std::atomic<uint64_t> state_{0};
  std::atomic<Job*> job_{nullptr};
  std::mutex sleep_mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

// ---------------------------------------------------------------------------
// Kernel selection

bool cpu_runs(Isa isa) {
  switch (isa) {
    case Isa::Portable: return true;
#if defined(__x86_64__)
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    default: return false;
  }
}

const Kernels* compiled(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return kernels_avx512();
    case Isa::Avx2: return kernels_avx2();
    case Isa::Portable: return kernels_portable();
    default: return nullptr;
  }
}

const Kernels* usable(Isa isa) { return cpu_runs(isa) ? compiled(isa) : nullptr; }

// The best variant, capped by MLXRT_QMM_ISA=portable|avx2|avx512 if set.
const Kernels* best_kernels() {
  static const Kernels* best = [] {
    int cap = static_cast<int>(Isa::Avx512);
    if (const char* v = std::getenv("MLXRT_QMM_ISA")) {
      std::string s(v);
      if (s == "portable") cap = static_cast<int>(Isa::Portable);
      if (s == "avx2") cap = static_cast<int>(Isa::Avx2);
    }
    for (int i = cap; i >= static_cast<int>(Isa::Portable); --i)
      if (auto k = usable(static_cast<Isa>(i))) return k;
    return kernels_portable();
  }();
  return best;
}

// The int8-activation kernel to run for variant `k`: its own, or for AVX-512
// without VNNI the AVX2 one.
const Kernels* q8_kernels(const Kernels* k) {
#if defined(__x86_64__)
  if (k->isa == Isa::Avx512 && !__builtin_cpu_supports("avx512vnni")) return usable(Isa::Avx2);
#endif
  return k;
}

// From this many rows of x int8 activations run the variant's int8 GEMM,
// where it has one. Zen 5, one thread, SmolLM2-135M's shapes against the
// int8 direct tiles: at 32 rows 1.0-1.6x as fast, at 16 rows 0.65-1.1x
// (unpacking the panel is the GEMM's fixed cost, largest at K = 1,536).
constexpr int kQ8GemmRows = 24;

// Up to this many rows of x the direct path runs: the variant's default, or
// MLXRT_QMM_DIRECT_ROWS (tuning: both paths give the same bits).
int direct_limit(const Kernels& k) {
  static const int rows = env_int("MLXRT_QMM_DIRECT_ROWS", -1, 0);
  return rows >= 0 ? rows : k.direct_rows;
}

// Rows of x from which the packed tiles read a column tile's 4-bit weights
// unpacked to bytes (Problem::unpack4); MLXRT_QMM_UNPACK_ROWS overrides it
// for tuning and A/B runs (the same bits either way).
int unpack_rows() {
  static const int rows = env_int("MLXRT_QMM_UNPACK_ROWS", kPackedUnpackRows, 1);
  return rows;
}

// Whether the direct path may use wide decode tiles: yes, unless
// MLXRT_QMM_WIDE=0 (tuning and A/B runs: the same bits either way).
bool wide_tiles() {
  static const bool wide = env_int("MLXRT_QMM_WIDE", 1, 0) != 0;
  return wide;
}

const Kernels* select_kernels(uint8_t code) {
  if (code > static_cast<uint8_t>(Isa::Avx512))
    throw std::invalid_argument("unknown instruction set code " + std::to_string(code));
  auto isa = static_cast<Isa>(code);
  if (isa == Isa::Auto) return best_kernels();
  if (auto k = usable(isa)) return k;
  throw std::invalid_argument("this CPU or build cannot run the requested qmm instruction set");
}

// ---------------------------------------------------------------------------
// Running one problem

// x packed with more values than this is packed on the pool.
constexpr int64_t kParallelCopy = 1 << 15;

// Below this many multiply-adds a matmul runs on the calling thread alone:
// handing chunks to another core costs more than it saves.
constexpr double kParallelMacs = 1 << 17;

// A growable float buffer whose data starts on a cache line, so that vector
// loads from it never straddle two lines. (MLX's CPU arrays start 8 bytes
// past a 16-byte boundary; an unaligned x made the direct path up to 1.5x
// slower.)
class AlignedFloats {
 public:
  float* get(size_t n) {
    buf_.resize(n + kLine / sizeof(float));
    const auto p = reinterpret_cast<uintptr_t>(buf_.data());
    return reinterpret_cast<float*>((p + kLine - 1) & ~uintptr_t{kLine - 1});
  }

 private:
  static constexpr size_t kLine = 64;
  std::vector<float> buf_;
};

float* thread_scratch() {
  thread_local AlignedFloats buf;
  thread_local float* p = buf.get(scratch_floats(0) + 64);
  return p;
}

// The last output columns of `p` (weights, scales, biases; both layouts
// keep a column's bytes together, in column order, whole at every 32
// columns), about what the pool's worker computes of it (it claims chunks
// from the back), capped to fit its L2 beside other data.
Prefetch tail_of(const Problem& p) {
  constexpr size_t kMaxBytes = 512 * 1024;
  Prefetch t;
  if (p.N % Prefetch::kStep != 0) return t;
  const size_t s = static_cast<size_t>(p.K / p.group) * (p.stype == ScaleType::F32 ? 4 : 2);
  t.at[0] = reinterpret_cast<const char*>(p.w);
  t.at[1] = static_cast<const char*>(p.scales);
  t.at[2] = static_cast<const char*>(p.biases);
  t.per_col[0] = static_cast<size_t>(p.K) * p.bits / 8;
  t.per_col[1] = s;
  t.per_col[2] = p.biases ? s : 0;
  t.end = p.N;
  const int all = p.N / Prefetch::kStep;
  t.steps = std::min<int>(all / 2, static_cast<int>(kMaxBytes / t.step_bytes()));
  return t;
}

// What the worker should read ahead after `p`: the tail of the matmul that
// followed this one the last time it ran on this thread (a decode step
// runs the same matmuls in the same order every token). Learned per
// thread, keyed by the weights' address.
Prefetch read_ahead_after(const Problem& p) {
  thread_local const uint8_t* last = nullptr;
  thread_local std::unordered_map<const uint8_t*, Prefetch> next_of;
  if (next_of.size() > 4096) next_of.clear();  // models come and go
  if (last) next_of[last] = p.M <= 2 ? tail_of(p) : Prefetch{};
  last = p.w;
  const auto it = next_of.find(p.w);
  return it == next_of.end() ? Prefetch{} : it->second;
}

void run_problem(const Kernels& k, const Problem& p, bool q8) {
  Pool& pool = Pool::get();
  const int tile_n = p.gemm ? k.gemm_cols : k.tile_n;
  const int tiles = (p.N + tile_n - 1) / tile_n;
  const double macs = static_cast<double>(p.M) * p.N * p.K;
  // A few chunks per thread balance uneven progress (other load, SMT).
  int chunks = pool.size() > 1 && macs >= kParallelMacs ? std::min(tiles, pool.size() * 4) : 1;
  auto range = [&](int n0, int n1) {
    if (p.packed) {
      k.run_q8_packed(p, n0, n1, thread_scratch());
    } else if (q8 && p.gemm) {
      k.run_q8_gemm(p, n0, n1, thread_scratch());
    } else if (q8) {
      k.run_q8(p, n0, n1);
    } else {
      k.run(p, n0, n1, thread_scratch());
    }
  };
  if (chunks <= 1) {
    range(0, p.N);
    return;
  }
  const int per = (tiles + chunks - 1) / chunks;
  chunks = (tiles + per - 1) / per;
  auto body = [&](int c) {
    const int n0 = c * per * tile_n;
    range(n0, std::min(p.N, n0 + per * tile_n));
  };
  pool.parallel_for(chunks, body, read_ahead_after(p));
}

// x as seen by the kernel (see Problem::x): M rows of K, for 4-bit weights
// permuted in each block of 2*lanes values to [even k..., odd k...] (the
// order in which a vector unpacks low and high nibbles of `lanes` bytes);
// row-major, or in tiles of `tile_rows` rows stored k-major.
struct XView {
  const float* data;
  mx::Shape shape;
  mx::Strides strides;
  bool dense;
};

const float* row_ptr(const XView& x, int64_t m) {
  int64_t off = 0;
  for (int d = static_cast<int>(x.shape.size()) - 2; d >= 0; --d) {
    off += (m % x.shape[d]) * x.strides[d];
    m /= x.shape[d];
  }
  return x.data + off;
}

// Always a copy, aligned to a cache line (K is a multiple of 32, so every
// row and tile is aligned too); copying M x K floats is cheap next to the
// M x N x K product. `gemm` false: row-major; true: in tiles of the
// variant's `gemm_rows` (packed by its vector code when x's rows are
// contiguous, else by the scalar loop below).
const float* prepare_x(const Kernels& k, const XView& x, int M, int K, int bits, bool gemm,
                       AlignedFloats& buf) {
  const int lanes = k.lanes, tile_rows = gemm ? k.gemm_rows : 0;
  const int R = tile_rows ? tile_rows : 1;
  const int tiles = (M + R - 1) / R;
  float* out = buf.get(static_cast<size_t>(tiles) * R * K);
  if (bits != 4 && x.dense && !tile_rows) {
    std::memcpy(out, x.data, sizeof(float) * M * K);
    return out;
  }
  const int64_t sk = x.shape.empty() ? 1 : x.strides.back();
  // The R source rows of tile t (null past M: padding rows).
  auto rows_of = [&](int t, const float** src) {
    for (int r = 0; r < R; ++r) {
      const int m = t * R + r;
      src[r] = m >= M ? nullptr : x.dense ? x.data + static_cast<size_t>(m) * K : row_ptr(x, m);
    }
  };
  auto for_tiles = [&](auto& tile) {
    if (static_cast<int64_t>(M) * K >= kParallelCopy && tiles > 1) {
      Pool::get().parallel_for(tiles, tile);
    } else {
      for (int t = 0; t < tiles; ++t) tile(t);
    }
  };
  if (tile_rows && sk == 1) {
    auto packed = [&](int t) {
      const float* src[kMaxGemmRows];
      rows_of(t, src);
      k.pack_x_tile(src, K, bits, out + static_cast<size_t>(t) * K * R);
    };
    for_tiles(packed);
    return out;
  }
  // order[i]: the offset in a source row of the kernel's value i.
  thread_local std::vector<int64_t> order;
  order.resize(K);
  for (int b = 0; b < K; b += 2 * lanes) {
    for (int i = 0; i < 2 * lanes; ++i) {
      const int k = bits == 4 ? (i < lanes ? 2 * i : 2 * (i - lanes) + 1) : i;
      order[b + i] = (b + k) * sk;
    }
  }
  if (tile_rows) {
    // GEMM tiles: class-major inside each k-block (see Problem::x).
    thread_local std::vector<int64_t> by_class;
    by_class.resize(K);
    for (int k0 = 0; k0 < K; k0 += kBlockK) {
      const int per = (std::min(K, k0 + kBlockK) - k0) / lanes;
      for (int l = 0; l < lanes; ++l)
        for (int t = 0; t < per; ++t) by_class[k0 + l * per + t] = order[k0 + t * lanes + l];
    }
    order.swap(by_class);
  }
  const int64_t* ord = order.data();
  // One tile of R rows, written in order: [i][r] (R = 1: a row-major row).
  auto tile = [&](int t) {
    const float* src[kMaxGemmRows];
    rows_of(t, src);
    float* dst = out + static_cast<size_t>(t) * K * R;
    for (int i = 0; i < K; ++i, dst += R)
      for (int r = 0; r < R; ++r) dst[r] = src[r] ? src[r][ord[i]] : 0.0f;  // 0: padding
  };
  for_tiles(tile);
  return out;
}

// x quantized to int8 for Kernels::run_q8, in one cache-aligned buffer:
// per row, per block of 32 values (llama.cpp's Q8_0 rounding): d =
// max|x| / 127, xq = round(x / d) (half away from zero), the block sum of
// xq, and per weight group xs = sum of d * sum(xq) (the bias term uses the
// quantized x: then the result is exactly dequant(w) . dequant(x), whose
// error cancels better than with the exact sum of x, since b ~ -8 s).
// xq and xd8 are laid out as Problem says (per block, or split).
struct Q8X {
  int8_t* xq;
  float* xd8;
  int32_t* xqsum;
  float* xs;
  int xs_stride;
};

// One block of 32 values quantized (llama.cpp's Q8_0 rounding, see Q8X);
// `nibble_order`: stored [even k, odd k]. Returns sum(xq); d in `*d_out`.
int32_t quantize_block(const float* xb, int64_t step, bool nibble_order, int8_t* dst,
                       float* d_out) {
  float amax = 0.0f;
  for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i * step]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int i = 0; i < kQ8Block; ++i) {
    // round(), half away from zero, without a libm call: truncate, then
    // step by the exact remainder.
    const float f = xb[i * step] * id;
    int v = static_cast<int>(f);
    const float rest = f - static_cast<float>(v);
    v += rest >= 0.5f ? 1 : rest <= -0.5f ? -1 : 0;
    sum += v;
    const int pos = nibble_order ? (i % 2) * (kQ8Block / 2) + i / 2 : i;
    dst[pos] = static_cast<int8_t>(v);
  }
  *d_out = d;
  return sum;
}

// `gemm`: for the int8 GEMM (x per block, never split).
Q8X prepare_q8(const Kernels& k, const XView& x, int M, int K, int bits, int group, bool gemm,
               AlignedFloats& buf) {
  const int nb = K / kQ8Block, xs_stride = (K / group + 15) / 16 * 16;
  // 4-bit weights on the dot-product tiles of a variant that takes x split
  // (Q8Split); otherwise row-major blocks with each d 8 times.
  const bool split = bits == 4 && k.q8_split_blocks > 0 && !gemm;
  const Q8Split sl{k.q8_split_blocks};
  const size_t row_bytes = split ? sl.row_bytes(K) : static_cast<size_t>(K);
  const size_t row_floats = split ? sl.row_floats(K) : static_cast<size_t>(nb) * 8;
  // Sizes in floats, each part a multiple of 16 floats (a cache line).
  auto line = [](size_t n) { return (n + 15) / 16 * 16; };
  const size_t n_xq = line((static_cast<size_t>(M) * row_bytes + kQ8Pad + 3) / 4);
  const size_t n_d8 = line(static_cast<size_t>(M) * row_floats + kQ8Pad);
  const size_t n_sum = line(static_cast<size_t>(M) * nb);
  const size_t n_xs = static_cast<size_t>(M) * xs_stride;
  float* base = buf.get(n_xq + n_d8 + n_sum + n_xs);
  Q8X q{reinterpret_cast<int8_t*>(base), base + n_xq,
        reinterpret_cast<int32_t*>(base + n_xq + n_d8), base + n_xq + n_d8 + n_sum, xs_stride};
  // The padding is read by whole-chunk loads at the last block; zeros keep
  // what it meets finite (it is multiplied by zero weights).
  std::memset(q.xq + static_cast<size_t>(M) * row_bytes, 0, kQ8Pad);
  std::memset(q.xd8 + static_cast<size_t>(M) * row_floats, 0, sizeof(float) * kQ8Pad);
  const int64_t sk = x.shape.empty() ? 1 : x.strides.back();
  const bool nibble_order = bits == 4;  // 4-bit weights: the order nibbles unpack in
  auto row = [&](int m) {
    const float* src = x.dense ? x.data + static_cast<size_t>(m) * K : row_ptr(x, m);
    const int64_t step = x.dense ? 1 : sk;
    float* xs = q.xs + static_cast<size_t>(m) * xs_stride;
    int8_t* xrow = q.xq + static_cast<size_t>(m) * row_bytes;
    float* drow = q.xd8 + static_cast<size_t>(m) * row_floats;
    std::memset(xs, 0, sizeof(float) * xs_stride);
    if (split && nb % sl.blocks != 0) {  // the last chunk's missing blocks
      std::memset(xrow + row_bytes - sl.chunk_bytes(), 0, sl.chunk_bytes());
      std::fill(drow + row_floats - sl.chunk_floats(), drow + row_floats, 0.0f);
    }
    for (int b = 0; b < nb; ++b) {
      const float* xb = src + static_cast<int64_t>(b) * kQ8Block * step;
      alignas(64) int8_t tmp[kQ8Block];
      int8_t* dst = split ? tmp : xrow + b * kQ8Block;
      float d;
      int32_t sum;
      if (k.quantize_q8_block && step == 1) {
        sum = k.quantize_q8_block(xb, nibble_order, dst, &d);
      } else {
        sum = quantize_block(xb, step, nibble_order, dst, &d);
      }
      if (split) {  // [even k | odd k] -> the chunk's even and odd halves
        const int c = b / sl.blocks, l = b % sl.blocks, half = kQ8Block / 2;
        int8_t* chunk = xrow + c * sl.chunk_bytes();
        std::memcpy(chunk + l * half, tmp, half);
        std::memcpy(chunk + sl.chunk_bytes() / 2 + l * half, tmp + half, half);
        std::fill_n(drow + c * sl.chunk_floats() + l * 4, 4, d);
      } else {
        std::fill_n(drow + static_cast<size_t>(b) * 8, 8, d);
      }
      q.xqsum[static_cast<size_t>(m) * nb + b] = sum;
      xs[b * kQ8Block / group] += d * static_cast<float>(sum);
    }
  };
  if (static_cast<int64_t>(M) * K >= kParallelCopy && M > 1) {
    Pool::get().parallel_for(M, row);
  } else {
    for (int m = 0; m < M; ++m) row(m);
  }
  return q;
}

ScaleType scale_type(mx::Dtype d) {
  if (d == mx::float32) return ScaleType::F32;
  if (d == mx::float16) return ScaleType::F16;
  if (d == mx::bfloat16) return ScaleType::BF16;
  throw std::invalid_argument("FastQuantizedMatmul: scales must be f32, f16 or bf16");
}

bool is_float_type(mx::Dtype d) {
  return d == mx::float32 || d == mx::float16 || d == mx::bfloat16;
}

// Cases the primitive handles; everything else goes to MLX's op. `b` null:
// biases implied by the scales (see Problem::biases).
bool supported(const array& x, const array& w, const array& s, const array* b, int group,
               int bits, const Kernels& k) {
  if (bits != 4 && bits != 8) return false;
  if (group != 32 && group != 64 && group != 128) return false;
  if (group % (2 * k.lanes) != 0) return false;
  if (w.ndim() != 2 || s.ndim() != 2 || (b && b->ndim() != 2) || x.ndim() < 1) return false;
  if (w.dtype() != mx::uint32 || !is_float_type(x.dtype())) return false;
  if (!is_float_type(s.dtype()) || (b && b->dtype() != s.dtype())) return false;
  const int64_t N = w.shape(0), K = x.shape(-1);
  const int64_t M = K > 0 ? static_cast<int64_t>(x.size()) / K : 0;
  return M > 0 && N > 0 && K > 0 && M * K < INT32_MAX && N < INT32_MAX && M * N < INT32_MAX;
}

// Whether the arrays fit together as `quantized_matmul(x, w, scales,
// biases, transpose = true)` needs (K = x's last dimension).
bool consistent(const array& x, const array& w, const array& s, const array* b, int group,
                int bits) {
  const int64_t K = x.shape(-1), N = w.shape(0);
  return static_cast<int64_t>(w.shape(1)) * 32 == K * bits && K % group == 0 &&
         s.shape(0) == N && s.shape(1) == K / group && (!b || b->shape() == s.shape());
}

// The packed form (Problem::packed): w [N/32, K/32, bits, 32] words,
// scales and biases [N/32, K/group, 32].
bool consistent_packed(const array& x, const array& w, const array& s, const array* b,
                       int group, int bits) {
  const int64_t K = x.shape(-1);
  return x.ndim() >= 1 && K > 0 && K % group == 0 && w.ndim() == 4 &&
         w.shape(1) * kQ8Block == K && w.shape(2) == bits && w.shape(3) == kPackedCols &&
         s.ndim() == 3 && s.shape(0) == w.shape(0) && s.shape(1) == K / group &&
         s.shape(2) == kPackedCols && (!b || b->shape() == s.shape()) &&
         static_cast<int64_t>(x.size()) / K * w.shape(0) * kPackedCols < INT32_MAX;
}

// Weights are normally evaluated, dense arrays loaded from a file; anything
// else gets MLX's contiguous copy first, because eval_cpu reads them raw.
array dense(const array& a) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return mx::contiguous(a);
}

}  // namespace

// ---------------------------------------------------------------------------
// The primitive

void FastQuantizedMatmul::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  const array& w = inputs[1];
  const array& s = inputs[2];
  // No fourth input: biases implied by the scales (a symmetric format).
  const array* b = inputs.size() > 3 ? &inputs[3] : nullptr;
  if (x.dtype() != mx::float32) throw std::invalid_argument("FastQuantizedMatmul: x must be f32");
  if (!w.flags().row_contiguous || !s.flags().row_contiguous ||
      (b && !b->flags().row_contiguous))
    throw std::invalid_argument("FastQuantizedMatmul: weights must be row-contiguous");
  if (packed_ ? !consistent_packed(x, w, s, b, group_, bits_)
              : !consistent(x, w, s, b, group_, bits_))
    throw std::invalid_argument("FastQuantizedMatmul: inconsistent shapes");
  const int K = x.shape(-1), N = packed_ ? w.shape(0) * kPackedCols : w.shape(0);
  const int M = static_cast<int>(x.size() / K);

  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  enc.dispatch([xv = XView{x.data<float>(), x.shape(), x.strides(), x.flags().row_contiguous},
                w = w.data<uint8_t>(), sp = s.data<void>(),
                bp = b ? b->data<void>() : nullptr,
                st = scale_type(s.dtype()), o = out.data<float>(), M, N, K,
                group = group_, bits = bits_, k = kernels_, q8 = q8_, packed = packed_]() {
    thread_local AlignedFloats xbuf;
    if (packed) {
      const Q8X xq = prepare_q8(*k, xv, M, K, bits, group, true, xbuf);
      Problem p{nullptr, w,        sp,       bp,    o,     M,           N, K, group, bits, st,
                xq.xq,   xq.xd8, xq.xqsum, xq.xs, xq.xs_stride};
      p.gemm = p.packed = true;
      p.unpack4 = M >= unpack_rows();
      run_problem(*k, p, true);
      return;
    }
    if (q8) {
      const bool gemm = k->run_q8_gemm && M >= kQ8GemmRows;
      const Q8X xq = prepare_q8(*k, xv, M, K, bits, group, gemm, xbuf);
      Problem p{nullptr, w,        sp,       bp,    o,     M,           N, K, group, bits, st,
                xq.xq,   xq.xd8, xq.xqsum, xq.xs, xq.xs_stride};
      p.gemm = gemm;
      run_problem(*k, p, true);
      return;
    }
    const bool gemm = M > direct_limit(*k);
    const float* xp = prepare_x(*k, xv, M, K, bits, gemm, xbuf);
    Problem p{xp, w, sp, bp, o, M, N, K, group, bits, st};
    p.gemm = gemm;
    p.wide = wide_tiles();
    run_problem(*k, p, false);
  });
}

void FastQuantizedMatmul::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("FastQuantizedMatmul has no GPU implementation");
}

bool FastQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const FastQuantizedMatmul*>(&other);
  return o && o->group_ == group_ && o->bits_ == bits_ && o->kernels_ == kernels_ &&
         o->q8_ == q8_ && o->packed_ == packed_;
}

std::vector<mx::Shape> FastQuantizedMatmul::output_shapes(const std::vector<array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[1].shape(0) * (packed_ ? kPackedCols : 1);
  return {shape};
}

// ---------------------------------------------------------------------------
// Bridge functions

namespace {

// The bridge functions' common part; `biases` null: implied by the scales.
std::unique_ptr<array> build(const array& x, const array& w, const array& scales,
                             const array* biases, int32_t group_size, int32_t bits, uint8_t isa,
                             bool int8_x) {
  const Kernels* k = select_kernels(isa);
  if (int8_x) k = q8_kernels(k);
  const bool fast = mx::default_device() == mx::Device::cpu && k &&
                    supported(x, w, scales, biases, group_size, bits, *k);
  // The primitive's f32 [..., N] output for f32 `xf`.
  auto node = [&](const array& xf) {
    auto prim = std::make_shared<FastQuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                      group_size, bits, k, int8_x);
    std::vector<array> inputs{xf, dense(w), dense(scales)};
    if (biases) inputs.push_back(dense(*biases));
    mx::Shape shape = xf.shape();
    shape.back() = w.shape(0);
    return array(std::move(shape), mx::float32, std::move(prim), std::move(inputs));
  };
  // f32 x that fits: the primitive alone (building MLX's op too, only for
  // its checks, cost decode time: decode runs ~120 of these per token).
  if (fast && x.dtype() == mx::float32 && consistent(x, w, scales, biases, group_size, bits))
    return std::make_unique<array>(node(x));
  // Otherwise MLX's op first: it validates everything (an error is thrown
  // here) and gives the output dtype. Without stored biases it gets the
  // implied ones, -2^(bits-1) * scales (exact in any float type).
  const array implied =
      biases ? *biases
             : mx::multiply(scales, mx::array(-std::ldexp(1.0f, bits - 1), scales.dtype()));
  array ref = mx::quantized_matmul(x, w, scales, implied, true, group_size, bits, "affine");
  if (!fast) return std::make_unique<array>(std::move(ref));
  // Half-precision x: the primitive on an f32 copy, cast back.
  array out = node(mx::astype(x, mx::float32));
  if (ref.dtype() != mx::float32) out = mx::astype(out, ref.dtype());
  return std::make_unique<array>(std::move(out));
}

}  // namespace

std::unique_ptr<array> fast_quantized_matmul(const array& x, const array& w,
                                             const array& scales, const array& biases,
                                             int32_t group_size, int32_t bits, uint8_t isa,
                                             bool int8_x) {
  return build(x, w, scales, &biases, group_size, bits, isa, int8_x);
}

std::unique_ptr<array> fast_quantized_matmul_symmetric(const array& x, const array& w,
                                                       const array& scales, int32_t group_size,
                                                       int32_t bits, uint8_t isa, bool int8_x) {
  return build(x, w, scales, nullptr, group_size, bits, isa, int8_x);
}

namespace {

const Kernels* packed_kernels() {
  const Kernels* k = q8_kernels(best_kernels());
  return k && k->run_q8_packed && k->gemm_cols == kPackedCols ? k : nullptr;
}

// Packed panels back to MLX's layout: w [N, K/8], scales [N, K/group].
array unpack_words(const array& w) {
  return mx::reshape(mx::transpose(w, {0, 3, 1, 2}), {w.shape(0) * kPackedCols, -1});
}
array unpack_groups(const array& s) {
  return mx::reshape(mx::transpose(s, {0, 2, 1}), {s.shape(0) * kPackedCols, -1});
}

std::unique_ptr<array> build_packed(const array& x, const array& w, const array& scales,
                                    const array* biases, int32_t group_size) {
  if (w.ndim() != 4 || scales.ndim() != 3 || (biases && biases->ndim() != 3))
    throw std::invalid_argument("fast_quantized_matmul_packed: w must be 4-D, scales 3-D");
  const Kernels* k = packed_kernels();
  const int bits = w.shape(2);  // words per block of 32 values
  if (mx::default_device() == mx::Device::cpu && k && is_float_type(x.dtype()) &&
      w.dtype() == mx::uint32 && is_float_type(scales.dtype()) &&
      (!biases || biases->dtype() == scales.dtype()) && (bits == 4 || bits == 8) &&
      (group_size == 32 || group_size == 64 || group_size == 128) &&
      consistent_packed(x, w, scales, biases, group_size, bits)) {
    auto prim = std::make_shared<FastQuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                      group_size, bits, k, true, true);
    // Half-precision x: the primitive on an f32 copy, cast back to the
    // type MLX's op would give (as `build` does).
    const bool half = x.dtype() != mx::float32;
    std::vector<array> inputs{half ? mx::astype(x, mx::float32) : x, dense(w), dense(scales)};
    if (biases) inputs.push_back(dense(*biases));
    mx::Shape shape = x.shape();
    shape.back() = w.shape(0) * kPackedCols;
    array out(std::move(shape), mx::float32, std::move(prim), std::move(inputs));
    if (half) out = mx::astype(out, mx::promote_types(x.dtype(), scales.dtype()));
    return std::make_unique<array>(std::move(out));
  }
  // Anything else (another device, a bad shape, which MLX's op then
  // reports): the layers in MLX's layout.
  const array wr = unpack_words(w), sr = unpack_groups(scales);
  if (!biases) return build(x, wr, sr, nullptr, group_size, bits, 0, true);
  const array br = unpack_groups(*biases);
  return build(x, wr, sr, &br, group_size, bits, 0, true);
}

}  // namespace

std::unique_ptr<array> fast_quantized_matmul_packed(const array& x, const array& w,
                                                    const array& scales, const array& biases,
                                                    int32_t group_size) {
  return build_packed(x, w, scales, &biases, group_size);
}

std::unique_ptr<array> fast_quantized_matmul_packed_symmetric(const array& x, const array& w,
                                                              const array& scales,
                                                              int32_t group_size) {
  return build_packed(x, w, scales, nullptr, group_size);
}

bool packed_weights_usable(int32_t bits) {
  // MLXRT_QMM_PACKED=0 keeps MLX's layout (A/B runs of the same binary).
  static const bool on = env_int("MLXRT_QMM_PACKED", 1, 0) != 0;
  return on && (bits == 4 || bits == 8) && mx::default_device() == mx::Device::cpu &&
         packed_kernels() != nullptr;
}

uint8_t best_isa() { return static_cast<uint8_t>(best_kernels()->isa); }

bool int8_gemm_available() {
  const Kernels* k = q8_kernels(best_kernels());
  return k && k->run_q8_gemm;
}

bool isa_available(uint8_t isa) {
  if (isa == static_cast<uint8_t>(Isa::Auto)) return true;
  if (isa > static_cast<uint8_t>(Isa::Avx512)) return false;
  return usable(static_cast<Isa>(isa)) != nullptr;
}

uint8_t fast_node_isa(const array& a) {
  if (!a.has_primitive()) return 0;
  auto* p = dynamic_cast<FastQuantizedMatmul*>(&a.primitive());
  return p ? static_cast<uint8_t>(p->isa()) | (p->int8_x() ? kInt8Flag : 0) : 0;
}

size_t pool_threads() { return static_cast<size_t>(Pool::get().size()); }

void pool_for(int n, void (*fn)(void*, int), void* ctx) {
  auto body = [&](int i) { fn(ctx, i); };
  Pool::get().parallel_for(n, body);
}

#if defined(__linux__)
namespace {

// Objects in the order the dynamic linker loaded them (the main program and
// the vDSO, which have no file name, are skipped).
std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && info->dlpi_name[0] == '/')
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        return 0;
      },
      &names);
  return names;
}

// Whether the object at `path` itself defines `sym` (dlsym on a handle also
// searches the object's dependencies, so check where the hit lives).
bool defines(const std::string& path, const char* sym) {
  void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return false;
  void* p = dlsym(h, sym);
  Dl_info info;
  bool own = p && dladdr(p, &info) && info.dli_fname && path == info.dli_fname;
  dlclose(h);
  return own;
}

}  // namespace

// The first loaded object that defines `cblas_sgemm`: the one libmlx binds
// to when both sit in its lookup scope, which holds whenever libmlx was
// loaded together with this library (as dependencies of one executable or
// one dlopen) - the setups build.rs arranges. A host that loaded libmlx on
// its own earlier (e.g. Python that imported mlx first) keeps the wheel's
// reference BLAS, and this reports that too, since it was loaded first.
rust::String blas_library() {
  for (const auto& name : loaded_objects())
    if (defines(name, "cblas_sgemm")) return rust::String(name);
  return rust::String();
}
#else
// (macOS wheels use Accelerate; no query there.)
rust::String blas_library() { return rust::String(); }
#endif

int32_t blas_threads() {
  std::string lib(blas_library());
  void* h = lib.empty() ? nullptr : dlopen(lib.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return -1;
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(dlsym(h, "openblas_get_num_threads"));
  int n = get ? get() : -1;
  dlclose(h);
  return n;
}

}  // namespace mlxrt::qmm
