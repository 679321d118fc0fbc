#pragma once
// A cache of library plans (cuBLASLt matmul descriptors, cuDNN convolution descriptors) chosen by
// one CudaRuntime's handles: kept in that runtime's components (core/ComponentSet.h) and destroyed
// with it, before the handles. Plan::release() frees a plan's descriptors and must not throw.

#include <map>
#include <mutex>

namespace mt {

template <typename Key, typename Plan>
struct PlanCache {
  std::mutex mutex;  // held while looking up or inserting (plans are created once per shape)
  std::map<Key, Plan> plans;
  PlanCache() = default;
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;
  ~PlanCache() {
    for (auto& kv : plans)
      kv.second.release();
  }
};

}  // namespace mt
