#include "core/Threads.h"

#include <omp.h>
#include <sched.h>

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

int numThreads() {
  return gThreads;
}

int affinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

int coresPerRank(int ranksOnNode) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, ranksOnNode));
}

int defaultNumThreads(int ranksOnNode) {
  int64_t env = envInt(EnvParam::kNumThreads);
  if (env > 0) return static_cast<int>(env);
  const int n = coresPerRank(ranksOnNode);
  const int bound = affinityCores();
  return bound > 0 ? std::min(n, bound) : n;
}

}  // namespace mt
