// The quantized-matmul kernel alone (no MLX, no thread pool): the direct
// (decode) path's narrow tiles (4 weight rows) against its wide ones
// (Problem::wide, 8 rows on AVX-512) in the same run, on SmolLM2-135M's
// decode shapes with GGUF's f16 scales, reading the weights from DRAM
// (a ring of copies larger than the last-level cache) on 1 and 2 threads.
// Built and run by `scripts/bench.sh qmm_kernel` (g++, this file plus the
// kernel variant it names); prints one JSON object.
//
//   qmm_kernel [--isa avx512|avx2|portable] [--rounds N]
#include "mlxrt/src/mlx/qmm_kernels.h"
#include "cpuinfo.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace mlxrt::qmm;

namespace {

struct Shape {
  const char* name;
  int K, N, bits;
};
// SmolLM2-135M's decode matmuls: q/k/v stacked, o, gate/up stacked, down, LM head.
const Shape kShapes[] = {{"qkv 576->960", 576, 960, 4},
                         {"o 576->576", 576, 576, 4},
                         {"gate_up 576->3072", 576, 3072, 4},
                         {"down 1536->576", 1536, 576, 4},
                         {"lm_head 576->49152 (8-bit)", 576, 49152, 8}};
// Weights read per timing pass, spread over copies: ~3x a 32 MiB L3.
constexpr double kRingBytes = 96e6;

struct Weights {
  std::vector<uint8_t> w;
  std::vector<uint16_t> s, b;
};

uint32_t next(uint32_t& x) {
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return x;
}

// Seconds per call of `k` over the ring of copies (~300 MB read per
// thread), on `threads` threads that each run the whole matmul (decode
// streams sharing the memory bus, as the engine's two pool threads do).
double time_calls(const Kernels& k, const Shape& sh, const std::vector<Weights>& ring,
                  double bytes, bool wide, int threads) {
  const int iters = std::max<int>(3 * ring.size(), static_cast<int>(300e6 / bytes));
  std::vector<double> per(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<float> x(sh.K, 0.25f), out(sh.N);
      Problem p{x.data(), nullptr, nullptr, nullptr, out.data(), 1, sh.N, sh.K, 32, sh.bits,
                ScaleType::F16};
      p.wide = wide;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        const Weights& c = ring[(i + t * ring.size() / 2) % ring.size()];
        p.w = c.w.data();
        p.scales = c.s.data();
        p.biases = c.b.data();
        k.run(p, 0, sh.N, nullptr);  // the direct path: no scratch
      }
      per[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    });
  }
  for (auto& t : ts) t.join();
  return *std::max_element(per.begin(), per.end());
}

}  // namespace

int main(int argc, char** argv) {
  std::string isa = "avx512";
  int rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--isa")) isa = argv[i + 1];
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  const Kernels* k = isa == "avx512" ? kernels_avx512() : isa == "avx2" ? kernels_avx2() : kernels_portable();
  if (!k) {
    std::fprintf(stderr, "no %s kernels in this build\n", isa.c_str());
    return 2;
  }
  const std::string cpu = cpuinfo_field("model name");
  // Both sides are this kernel; they differ in the decode tile only.
  std::printf("{\"benchmark\": \"qmm_kernel\", \"isa\": \"%s\", \"cpu\": \"%s\", "
              "\"compiler\": \"g++ %s -O2\", \"rows_of_x\": 1, \"rounds\": %d, "
              "\"provenance\": {\"mlxrt\": {\"kernels\": \"mlxrt qmm %s, wide decode tiles\", "
              "\"scale_dtype\": \"f16\"}, \"reference\": {\"kernels\": \"mlxrt qmm %s, narrow "
              "decode tiles (4 weight rows)\", \"scale_dtype\": \"f16\"}}, \"shapes\": [",
              isa.c_str(), cpu.c_str(), __VERSION__, rounds, isa.c_str(), isa.c_str());
  uint32_t seed = 12345;
  for (size_t si = 0; si < sizeof(kShapes) / sizeof(kShapes[0]); ++si) {
    const Shape& sh = kShapes[si];
    const int groups = sh.K / 32;
    const size_t wbytes = static_cast<size_t>(sh.N) * sh.K * sh.bits / 8;
    const double bytes = wbytes + 4.0 * sh.N * groups;  // + f16 scales and biases
    const int copies = std::max(2, static_cast<int>(kRingBytes / bytes));
    std::vector<Weights> ring(copies);
    for (auto& c : ring) {
      c.w.resize(wbytes);
      for (auto& v : c.w) v = static_cast<uint8_t>(next(seed));
      // Small positive scales, negative biases: finite, typical magnitudes.
      c.s.resize(static_cast<size_t>(sh.N) * groups);
      c.b.resize(c.s.size());
      for (auto& v : c.s) v = static_cast<uint16_t>(0x2000 + (next(seed) & 0x3ff));
      for (auto& v : c.b) v = static_cast<uint16_t>(0xa000 + (next(seed) & 0x3ff));
    }
    std::printf("%s\n  {\"shape\": \"%s\", \"weight_bytes\": %.0f", si ? "," : "", sh.name, bytes);
    for (int threads : {1, 2}) {
      // Best of `rounds`, the two tilings alternated (ABBA) against drift.
      double narrow = 1e9, wide = 1e9;
      for (int r = 0; r < rounds; ++r) {
        for (bool w : {r % 2 == 0, r % 2 != 0}) {
          double& best = w ? wide : narrow;
          best = std::min(best, time_calls(*k, sh, ring, bytes, w, threads));
        }
      }
      std::printf(", \"threads_%d\": {\"narrow_us\": %.3f, \"wide_us\": %.3f, \"narrow_gbs_per_thread\": %.2f, "
                  "\"wide_gbs_per_thread\": %.2f, \"wide_speedup\": %.3f}",
                  threads, narrow * 1e6, wide * 1e6, bytes / narrow / 1e9, bytes / wide / 1e9,
                  narrow / wide);
    }
    std::printf("}");
    std::fflush(stdout);
  }
  std::printf("\n]}\n");
  return 0;
}
