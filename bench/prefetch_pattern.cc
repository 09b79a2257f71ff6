// The memory access pattern of the quantized matmul's decode tiles, alone:
// a tile of R weight rows (576 bytes each, SmolLM2-135M's 8-bit LM head)
// read 32 bytes per row in turn, so R short interleaved streams, with a
// software prefetch of each address `ahead` rows further into L1
// (prefetcht0), into L2 (prefetcht1, prefetcht2) or none; and a plain
// sequential read of the same bytes as the reference. Read bandwidth in
// GB/s per thread, best of `rounds` (the variants alternated), from a
// buffer larger than the last-level cache. This is why the decode kernels
// prefetch into L2 (src/mlx/qmm_impl.h, kPrefetchLocality).
// Built and run by `scripts/bench.sh prefetch_pattern`; prints one JSON object.
//
//   prefetch_pattern [--rounds N]
#include "cpuinfo.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kRowBytes = 576;
constexpr size_t kBufferBytes = size_t{192} << 20;  // 6x a 32 MiB L3

// Locality as __builtin_prefetch takes it: 3 = prefetcht0 (L1), 2 =
// prefetcht1, 1 = prefetcht2 (L2 on x86); -1 = no prefetch.
template <int R, int LOCALITY>
uint64_t read_tiles(const uint8_t* buf, size_t rows, int ahead) {
  uint64_t acc = 0;
  for (size_t n = 0; n + R <= rows; n += R) {
    for (size_t g = 0; g < kRowBytes; g += 32) {
      for (int j = 0; j < R; ++j) {
        const uint8_t* p = buf + (n + j) * kRowBytes + g;
        if constexpr (LOCALITY >= 0) __builtin_prefetch(p + ahead * kRowBytes, 0, LOCALITY);
        uint64_t v[4];
        std::memcpy(v, p, sizeof v);
        acc += v[0] ^ v[1] ^ v[2] ^ v[3];
      }
    }
  }
  return acc;
}

struct Variant {
  const char* name;
  uint64_t (*fn)(const uint8_t*, size_t, int);
  int ahead;
};
// The kernel's distances: two 4-row tiles, one and a half 8-row tiles.
const Variant kVariants[] = {
    {"sequential", read_tiles<1, -1>, 0},
    {"tile4_none", read_tiles<4, -1>, 8},
    {"tile4_t0", read_tiles<4, 3>, 8},
    {"tile4_t1", read_tiles<4, 2>, 8},
    {"tile4_t2", read_tiles<4, 1>, 8},
    {"tile8_none", read_tiles<8, -1>, 12},
    {"tile8_t0", read_tiles<8, 3>, 12},
    {"tile8_t1", read_tiles<8, 2>, 12},
    {"tile8_t2", read_tiles<8, 1>, 12},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  const size_t rows = kBufferBytes / kRowBytes;
  std::printf("{\"benchmark\": \"prefetch_pattern\", \"cpu\": \"%s\", \"cpu_generation\": "
              "{\"vendor\": \"%s\", \"family\": \"%s\", \"model\": \"%s\"}, "
              "\"compiler\": \"g++ %s -O2\", \"row_bytes\": %zu, \"buffer_bytes\": %zu, "
              "\"rounds\": %d, \"unit\": \"GB/s per thread, best of rounds\", "
              "\"provenance\": {\"mlxrt\": {\"kernels\": \"the quantized matmul's decode-tile "
              "access pattern, no arithmetic: tile4_* and tile8_* (prefetch t0 = L1, t1 and t2 = "
              "L2, none)\", \"scale_dtype\": \"none (bytes only)\"}, \"reference\": "
              "{\"kernels\": \"sequential: one row after another, no software prefetch\", "
              "\"scale_dtype\": \"none (bytes only)\"}}",
              cpuinfo_field("model name").c_str(), cpuinfo_field("vendor_id").c_str(),
              cpuinfo_field("cpu family").c_str(), cpuinfo_field("model\t").c_str(), __VERSION__,
              kRowBytes, kBufferBytes, rounds);
  for (int threads : {1, 2}) {
    // Each thread its own buffer (decode's two threads read different rows).
    std::vector<std::vector<uint8_t>> bufs(threads, std::vector<uint8_t>(kBufferBytes, 1));
    double best[kNumVariants];
    std::fill(best, best + kNumVariants, 0.0);
    std::vector<uint64_t> sinks(threads, 0);
    for (int r = 0; r < rounds; ++r) {
      for (int vi = 0; vi < kNumVariants; ++vi) {
        const Variant& v = kVariants[r % 2 ? kNumVariants - 1 - vi : vi];
        std::vector<double> gbs(threads);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t) {
          ts.emplace_back([&, t] {
            const auto t0 = std::chrono::steady_clock::now();
            sinks[t] += v.fn(bufs[t].data(), rows, v.ahead);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            gbs[t] = rows * kRowBytes / s / 1e9;
          });
        }
        for (auto& t : ts) t.join();
        const int at = static_cast<int>(&v - kVariants);
        best[at] = std::max(best[at], *std::min_element(gbs.begin(), gbs.end()));
      }
    }
    std::printf(", \"threads_%d\": {", threads);
    for (int vi = 0; vi < kNumVariants; ++vi)
      std::printf("%s\"%s\": %.2f", vi ? ", " : "", kVariants[vi].name, best[vi]);
    std::printf("}");
    uint64_t sink = 0;
    for (uint64_t s : sinks) sink ^= s;
    if (sink == 42) std::printf(" ");  // keeps the reads
  }
  std::printf("}\n");
  return 0;
}
