#pragma once
// Allocators hand out raw memory for tensors. The CPU allocator is process-wide (it owns no GPU
// resource); device, pinned and managed allocators are owned by a CudaRuntime (core/cuda) and
// registered here for the lifetime of that runtime, so Tensor::empty(shape, dtype, device) can find
// them without a singleton owning GPU memory.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/Device.h"

namespace mt {

struct AllocatorStats {
  int64_t allocatedBytes = 0;  // held by live tensors
  int64_t reservedBytes = 0;   // obtained from the system (>= allocated for caching allocators)
  int64_t peakAllocatedBytes = 0;
  int64_t numAllocs = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemoryError with the requested size and current stats when memory is exhausted.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void resetPeak() = 0;
};

// 64-byte aligned host memory with allocation statistics (for the memory accounting).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  Device device() const override { return Device::cpu(); }
  const char* name() const override { return "cpu"; }
  AllocatorStats stats() const override;
  void resetPeak() override;

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> count_{0};
};

CpuAllocator& cpuAllocator();

// The allocator used for new tensors on a device. CUDA devices have none until a CudaRuntime
// registers its pool; asking then throws with a message saying so.
Allocator& allocatorFor(Device device);
void registerDeviceAllocator(int deviceIndex, Allocator* allocator);  // nullptr unregisters

std::string formatBytes(int64_t bytes);

// The caching device allocator's size class of a request (core/cuda/CudaAllocator): 512 B steps
// below 1 MiB, four classes per power of two above. Here so `trainer plan` counts what it counts.
size_t roundAllocationSize(size_t bytes);

}  // namespace mt
