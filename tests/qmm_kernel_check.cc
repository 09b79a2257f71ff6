// Standalone check of the quantized-matmul kernels (no MLX, no Rust) against
// a naive dequantize-then-dot reference in double precision. The Rust tests
// (src/mlx/qmm_tests.rs) compare with MLX itself; this one exists to test
// the portable variant on other architectures, e.g. aarch64 under qemu:
//
//   aarch64-linux-gnu-g++ -std=c++20 -O2 -static -I<dir holding mlxrt/src/mlx>
//       tests/qmm_kernel_check.cc src/mlx/qmm_portable.cc -o check && qemu-aarch64 ./check
//
// (on x86-64 add src/mlx/qmm_avx2.cc src/mlx/qmm_avx512.cc to check all three).
// The include path must map "mlxrt/src/mlx/..." to src/mlx, e.g. a symlink
// mlxrt -> the repository root.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mlxrt/src/mlx/qmm_kernels.h"

namespace mlxrt::qmm {
size_t scratch_floats(int) { return static_cast<size_t>(kPanelRows) * kBlockK; }
#if !defined(__x86_64__)
const Kernels* kernels_avx512() { return nullptr; }
const Kernels* kernels_avx2() { return nullptr; }
#endif
}  // namespace mlxrt::qmm

using namespace mlxrt::qmm;

namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds v to the nearest value representable in `st` (f16 values are kept in
// the normal range by construction) and returns its 16-bit encoding.
uint16_t to_half_bits(float v, ScaleType st, float* rounded) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (st == ScaleType::BF16) {
    *rounded = bits_to_float(u & 0xffff0000u);
    return static_cast<uint16_t>(u >> 16);
  }
  const uint32_t sign = (u >> 16) & 0x8000;
  const int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) {  // too small for a normal half: use zero
    *rounded = bits_to_float(sign << 16);
    return static_cast<uint16_t>(sign);
  }
  const uint32_t man = (u >> 13) & 0x3ff;  // truncation is fine: any f16 works
  const uint16_t h = static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | man);
  *rounded = bits_to_float((sign << 16) | (static_cast<uint32_t>(exp + 112) << 23) | (man << 13));
  return h;
}

int quant(const std::vector<uint8_t>& w, int bits, int K, int n, int k) {
  if (bits == 8) return w[static_cast<size_t>(n) * K + k];
  return (w[static_cast<size_t>(n) * K / 2 + k / 2] >> (4 * (k & 1))) & 15;
}

// Returns the number of mismatching outputs of one case.
int check_case(const Kernels& kern, int bits, int group, int M, int N, ScaleType st) {
  const int K = group * 3, G = K / group;
  std::vector<uint8_t> w(static_cast<size_t>(N) * K * bits / 8);
  for (auto& b : w) b = static_cast<uint8_t>(std::rand());
  std::vector<float> s(N * G), b(N * G);
  std::vector<uint16_t> sh(N * G), bh(N * G);
  for (int i = 0; i < N * G; ++i) {
    s[i] = (std::rand() % 1000) / 1e4f + 0.01f;
    b[i] = (std::rand() % 1000) / 1e3f - 0.5f;
    if (st != ScaleType::F32) {
      sh[i] = to_half_bits(s[i], st, &s[i]);
      bh[i] = to_half_bits(b[i], st, &b[i]);
    }
  }
  std::vector<float> x(static_cast<size_t>(M) * K);
  for (auto& v : x) v = (std::rand() % 2001) / 1000.f - 1.f;

  // The kernel wants 4-bit x permuted per block of 2*lanes: evens, then odds.
  std::vector<float> xp(x);
  const int L = kern.lanes;
  if (bits == 4)
    for (int m = 0; m < M; ++m)
      for (int b0 = 0; b0 < K; b0 += 2 * L)
        for (int i = 0; i < L; ++i) {
          xp[m * K + b0 + i] = x[m * K + b0 + 2 * i];
          xp[m * K + b0 + L + i] = x[m * K + b0 + 2 * i + 1];
        }
  std::vector<float> out(static_cast<size_t>(M) * N, -999.f), scratch(scratch_floats(K) + 64);
  const bool f32 = st == ScaleType::F32;
  Problem p{xp.data(), w.data(), f32 ? static_cast<const void*>(s.data()) : sh.data(),
            f32 ? static_cast<const void*>(b.data()) : bh.data(), out.data(), M, N, K, group,
            bits, st};
  kern.run(p, 0, N, scratch.data());

  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double wv = static_cast<double>(s[n * G + k / group]) * quant(w, bits, K, n, k) +
                          b[n * G + k / group];
        want += x[m * K + k] * wv;
        mag += std::fabs(x[m * K + k] * wv);
      }
      const double got = out[m * N + n];
      if (!(std::fabs(got - want) <= 1e-6 * mag)) {
        if (bad++ < 3)
          std::printf("isa=%d bits=%d group=%d M=%d N=%d scales=%d [%d,%d]: %g vs %g\n",
                      static_cast<int>(kern.isa), bits, group, M, N, static_cast<int>(st), m, n,
                      got, want);
      }
    }
  return bad;
}

}  // namespace

int main() {
  int cases = 0, bad = 0;
  for (const Kernels* k : {kernels_portable(), kernels_avx2(), kernels_avx512()}) {
    if (!k) continue;
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (int M : {1, 2, 3, 5, 9})
          for (int N : {1, 7, 13})
            for (ScaleType st : {ScaleType::F32, ScaleType::F16, ScaleType::BF16}) {
              bad += check_case(*k, bits, group, M, N, st);
              ++cases;
            }
  }
  std::printf("%d cases, %d mismatching outputs\n", cases, bad);
  return bad != 0;
}
