#include "core/Allocator.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/Check.h"

namespace mt {

void* CpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    throw OutOfMemoryError("host allocation of " + formatBytes(static_cast<int64_t>(bytes)) + " failed (" +
                           formatBytes(allocated_.load()) + " already allocated)");
  int64_t now = allocated_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  count_.fetch_add(1);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t bytes) noexcept {
  if (!ptr) return;
  std::free(ptr);
  allocated_.fetch_sub(static_cast<int64_t>(bytes));
}

AllocatorStats CpuAllocator::stats() const {
  AllocatorStats s;
  s.allocatedBytes = allocated_.load();
  s.reservedBytes = s.allocatedBytes;
  s.peakAllocatedBytes = peak_.load();
  s.numAllocs = count_.load();
  return s;
}

void CpuAllocator::resetPeak() {
  peak_ = allocated_.load();
}

size_t roundAllocationSize(size_t bytes) {
  if (bytes == 0) return 0;
  constexpr size_t kSmall = 1u << 20;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  size_t p = 1;
  while (p * 2 <= bytes)
    p *= 2;  // p <= bytes < 2p
  for (size_t q = 4; q <= 8; ++q) {
    const size_t c = p / 4 * q;
    if (c >= bytes) return c;
  }
  return 2 * p;
}

CpuAllocator& cpuAllocator() {
  static CpuAllocator instance;
  return instance;
}

namespace {
constexpr int kMaxDevices = 64;
std::mutex gRegistryMutex;
std::array<Allocator*, kMaxDevices> gDeviceAllocators{};
}  // namespace

void registerDeviceAllocator(int deviceIndex, Allocator* allocator) {
  MT_CHECK(deviceIndex >= 0 && deviceIndex < kMaxDevices, "device index ", deviceIndex);
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  gDeviceAllocators[static_cast<size_t>(deviceIndex)] = allocator;
}

Allocator& allocatorFor(Device device) {
  if (device.isCpu()) return cpuAllocator();
  MT_CHECK(device.index >= 0 && device.index < kMaxDevices, "device index ", device.index);
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  Allocator* a = gDeviceAllocators[static_cast<size_t>(device.index)];
  if (!a)
    throw InternalError("no allocator for " + device.str() +
                        ": create a CudaRuntime for this device before allocating on it");
  return *a;
}

std::string formatBytes(int64_t bytes) {
  char buf[32];
  double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024)
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace mt
