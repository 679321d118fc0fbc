#pragma once
// CPU parallel loops over independent outputs (OpenMP). Work is split into fixed-size blocks that
// do not depend on the thread count, so any reduction done per block and then summed in block
// order gives bit-identical results for 1 or N threads (needed for exact resume and rank parity).

#include <omp.h>

#include <cstdint>

namespace mt {

template <typename F>
void parallelFor(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  if (n <= grain || omp_get_max_threads() == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t blocks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t lo = b * grain;
    int64_t hi = lo + grain < n ? lo + grain : n;
    fn(lo, hi);
  }
}

constexpr int64_t kReduceBlock = 256;  // rows per partial in deterministic reductions

}  // namespace mt
