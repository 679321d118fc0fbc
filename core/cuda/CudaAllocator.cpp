#include "core/cuda/CudaAllocator.h"

#include <algorithm>

#include "core/Log.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaStream.h"
#include "core/cuda/DeviceBinding.h"

namespace mt {

namespace {
std::string oomMessage(const char* what, size_t bytes, const AllocatorStats& s, size_t cap) {
  std::string msg = std::string(what) + ": cannot allocate " + formatBytes(static_cast<int64_t>(bytes)) +
                    " (" + formatBytes(s.allocatedBytes) + " allocated, " + formatBytes(s.reservedBytes) +
                    " reserved";
  if (cap) msg += ", memory cap " + formatBytes(static_cast<int64_t>(cap));
  size_t freeB = 0, total = 0;
  if (cudaMemGetInfo(&freeB, &total) == cudaSuccess)
    msg += ", device free " + formatBytes(static_cast<int64_t>(freeB)) + " of " +
           formatBytes(static_cast<int64_t>(total));
  return msg + ")";
}
}  // namespace

CachingDeviceAllocator::CachingDeviceAllocator(int device) : device_(device) {}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : pending_)
    for (cudaEvent_t e : p.second)
      cudaEventDestroy(e);
  for (auto& kv : freeBlocks_)
    cudaFree(kv.first);
  // Live blocks belong to tensors that outlive the runtime: a bug, but not one to crash on here.
  for (auto& kv : live_)
    if (!isLarge(kv.second.size)) cudaFree(kv.first);
  for (void* seg : large_.segments())
    cudaFree(seg);
}

void CachingDeviceAllocator::recycleLocked(const Block& b) {
  if (isLarge(b.size)) {
    large_.give(b.ptr);
    return;
  }
  Block f = b;
  f.otherStreams.clear();
  free_[{f.stream, f.size}].push_back(f.ptr);
  freeBlocks_[f.ptr] = f;
}

void CachingDeviceAllocator::processPendingLocked() {
  for (size_t i = 0; i < pending_.size();) {
    bool done = true;
    for (cudaEvent_t e : pending_[i].second)
      done = done && cudaEventQuery(e) == cudaSuccess;
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : pending_[i].second)
      cudaEventDestroy(e);
    recycleLocked(pending_[i].first);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void CachingDeviceAllocator::releaseCachedLocked() {
  for (auto& kv : freeBlocks_) {
    cudaFree(kv.first);
    stats_.reservedBytes -= static_cast<int64_t>(kv.second.size);
  }
  freeBlocks_.clear();
  free_.clear();
  for (const auto& seg : large_.releasable()) {  // segments of which nothing is in use
    large_.removeSegment(seg.first);
    cudaFree(seg.first);
    stats_.reservedBytes -= static_cast<int64_t>(seg.second);
  }
}

// A cached block of `size` (small: that class; large: the best fit, split), or null.
void* CachingDeviceAllocator::takeLocked(size_t size, cudaStream_t stream, size_t* got) {
  *got = size;
  if (isLarge(size)) return large_.take(stream, size, got);
  auto it = free_.find({stream, size});
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  freeBlocks_.erase(ptr);
  return ptr;
}

// New device memory of `size` bytes (the cache released and the call retried once when short).
void* CachingDeviceAllocator::mallocLocked(size_t size, size_t requested) {
  if (cap_ && static_cast<size_t>(stats_.reservedBytes) + size > cap_) releaseCachedLocked();
  if (cap_ && static_cast<size_t>(stats_.reservedBytes) + size > cap_)
    throw OutOfMemoryError(oomMessage("CUDA out of memory under the memory cap", requested, stats_, cap_));
  void* ptr = nullptr;
  cudaError_t e = cudaMalloc(&ptr, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state of the failed call
    releaseCachedLocked();
    e = cudaMalloc(&ptr, size);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError(oomMessage("CUDA out of memory", requested, stats_, cap_));
  }
  CUDA_CHECK(e);
  stats_.reservedBytes += static_cast<int64_t>(size);
  return ptr;
}

void* CachingDeviceAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  requireThreadDevice(device_, "allocating GPU memory");
  const size_t size = roundAllocationSize(bytes);
  cudaStream_t stream = currentStream();
  std::lock_guard<std::mutex> lock(mutex_);
  processPendingLocked();
  size_t got = size;
  void* ptr = takeLocked(size, stream, &got);
  if (!ptr) {
    ptr = mallocLocked(size, bytes);
    if (isLarge(size)) {  // a segment of its own, taken whole
      large_.addSegment(ptr, size, stream);
      ptr = large_.take(stream, size, &got);
    }
  }
  live_[ptr] = Block{ptr, got, stream, {}};
  stats_.allocatedBytes += static_cast<int64_t>(got);
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.numAllocs++;
  return ptr;
}

void CachingDeviceAllocator::deallocate(void* ptr, size_t) noexcept {
  if (!ptr) return;
  noteThreadDevice(device_, "freeing GPU memory");  // the events below are recorded on this device
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  Block b = it->second;
  live_.erase(it);
  stats_.allocatedBytes -= static_cast<int64_t>(b.size);
  if (b.otherStreams.empty()) {
    recycleLocked(b);
    return;
  }
  std::vector<cudaEvent_t> events;
  for (cudaStream_t s : b.otherStreams) {
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(e, s) == cudaSuccess)
      events.push_back(e);
  }
  pending_.emplace_back(b, std::move(events));
}

bool CachingDeviceAllocator::recordStream(const void* ptr, cudaStream_t stream) {
  requireThreadDevice(device_, "recording a stream's use of GPU memory");
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(const_cast<void*>(ptr));
  if (it == live_.begin()) return false;
  --it;
  const char* base = static_cast<const char*>(it->first);
  if (static_cast<const char*>(ptr) >= base + it->second.size) return false;
  if (stream == it->second.stream) return true;
  auto& os = it->second.otherStreams;
  if (std::find(os.begin(), os.end(), stream) == os.end()) os.push_back(stream);
  return true;
}

void CachingDeviceAllocator::forgetStream(cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& kv : live_) {
    auto& os = kv.second.otherStreams;
    os.erase(std::remove(os.begin(), os.end(), stream), os.end());
  }
}

void CachingDeviceAllocator::setMemoryCap(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  cap_ = bytes;
}

void CachingDeviceAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  processPendingLocked();
  releaseCachedLocked();
}

AllocatorStats CachingDeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingDeviceAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
}

void* EventGatedCache::take(size_t size) {
  for (size_t i = 0; i < pending_.size();) {
    if (cudaEventQuery(pending_[i].event) == cudaSuccess) {
      cudaEventDestroy(pending_[i].event);
      free_.emplace(pending_[i].size, pending_[i].ptr);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  auto it = free_.find(size);
  if (it == free_.end()) return nullptr;
  void* ptr = it->second;
  free_.erase(it);
  return ptr;
}

void EventGatedCache::give(void* ptr, size_t size) noexcept {
  // Copies or kernels reading this block may still be queued on the current stream.
  cudaEvent_t e;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
      cudaEventRecord(e, currentStream()) == cudaSuccess) {
    pending_.push_back({ptr, size, e});
  } else {
    free_.emplace(size, ptr);
  }
}

void* PinnedBacking::allocate(size_t size, size_t requested, const AllocatorStats& stats) const {
  void* ptr = nullptr;
  cudaError_t e = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError(oomMessage("pinned host memory", requested, stats, 0));
  }
  CUDA_CHECK(e);
  return ptr;
}
void PinnedBacking::release(void* ptr) noexcept {
  cudaFreeHost(ptr);
}

void* ManagedBacking::allocate(size_t size, size_t, const AllocatorStats&) const {
  size_t freeB = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&freeB, &total));
  if (size > freeB)
    throw OutOfMemoryError("managed memory: refusing " + formatBytes(static_cast<int64_t>(size)) +
                           ", more than the " + formatBytes(static_cast<int64_t>(freeB)) +
                           " the GPU has free (over-subscription can hang it)");
  void* ptr = nullptr;
  CUDA_CHECK(cudaMallocManaged(&ptr, size, cudaMemAttachGlobal));
  return ptr;
}
void ManagedBacking::release(void* ptr) noexcept {
  cudaFree(ptr);
}

template <typename Backing>
CachingHostAllocator<Backing>::~CachingHostAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.releaseAll([](void* p) { Backing::release(p); });
  for (auto& kv : live_)
    Backing::release(kv.first);
}

template <typename Backing>
void* CachingHostAllocator<Backing>::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  requireThreadDevice(-1, "allocating pinned or managed host memory");
  const size_t size = roundAllocationSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = cache_.take(size);
  if (!ptr) {
    ptr = backing_.allocate(size, bytes, stats_);
    stats_.reservedBytes += static_cast<int64_t>(size);
  }
  live_[ptr] = size;
  stats_.allocatedBytes += static_cast<int64_t>(size);
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.numAllocs++;
  return ptr;
}

template <typename Backing>
void CachingHostAllocator<Backing>::deallocate(void* ptr, size_t) noexcept {
  if (!ptr) return;
  noteThreadDevice(-1, "freeing pinned or managed host memory");  // records an event
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  stats_.allocatedBytes -= static_cast<int64_t>(it->second);
  cache_.give(ptr, it->second);
  live_.erase(it);
}

template <typename Backing>
AllocatorStats CachingHostAllocator<Backing>::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

template <typename Backing>
void CachingHostAllocator<Backing>::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
}

template class CachingHostAllocator<PinnedBacking>;
template class CachingHostAllocator<ManagedBacking>;

}  // namespace mt
