// Parallel loops for mlxrt's CPU primitives other than the quantized
// matmul (attention, norms, RoPE, SwiGLU), on that matmul's thread pool:
// at prefill sizes the row-wise ones would otherwise run on the MLX stream
// thread alone while the pool's workers wait for the next matmul.
#pragma once

#include <algorithm>
#include <cstdint>

#include "mlxrt/src/mlx/qmm.h"

namespace mlxrt {

// f(begin, end) over [0, n) in pieces of at least `grain` items, spread
// over the pool; with fewer than two pieces' worth, f(0, n) on the calling
// thread. Each item must be independent of the others (the pieces run in
// any order), so the results are the same bits either way.
template <class F>
void parallel_ranges(int64_t n, int64_t grain, F&& f) {
  const int64_t pieces = std::min<int64_t>(n / std::max<int64_t>(grain, 1), 4096);
  if (pieces <= 1 || qmm::pool_threads() <= 1) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t per = (n + pieces - 1) / pieces;
  auto piece = [&](int g) {
    const int64_t b = g * per;
    f(b, std::min(n, b + per));
  };
  using P = decltype(piece);
  qmm::pool_for(static_cast<int>((n + per - 1) / per),
                [](void* ctx, int g) { (*static_cast<P*>(ctx))(g); }, &piece);
}

// Items per piece so that a piece holds about 16K floats of work: smaller
// pieces cost more in hand-offs than they save (decode's rows stay on the
// calling thread).
inline int64_t grain_for(int64_t floats_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(floats_per_item, 1));
}

}  // namespace mlxrt
