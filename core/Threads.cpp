#include "core/Threads.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/EnvParams.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace mt {

namespace {
std::atomic<int> gThreads{1};
}

void setNumThreads(int n) {
  n = std::max(1, n);
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
  gThreads = n;
}

int numThreads() { return gThreads; }

int defaultNumThreads(int ranksOnNode) {
  int64_t env = envInt(EnvParam::kNumThreads);
  if (env > 0) return static_cast<int>(env);
  int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, ranksOnNode));
}

}  // namespace mt
