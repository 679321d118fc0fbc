#pragma once
// GPU memory allocators, owned by a CudaRuntime.
//
// CachingDeviceAllocator: cudaMalloc is slow and synchronises the device, so freed blocks are kept
// and reused. Sizes round up to 512 B below 1 MiB and to one of four classes per power of two above
// (waste <= 25%). Blocks below 1 MiB are reused by exact size class; larger ones come from
// segments (one cudaMalloc each) that core/BlockPool splits and merges again (best fit), so memory
// freed in one pattern of sizes serves another — the activations freed during backward hold the
// per-step gradient buffers made then — without reserving more. A block belongs to the stream it
// was allocated on and is reused by that stream at once (stream order makes it safe); a block also
// used on other streams (recordStream) waits for events on them before reuse. When cudaMalloc
// fails, the cache (wholly free segments and small blocks) is released and the call retried once;
// then OutOfMemoryError reports the request and the stats.
// A memory cap (bytes reserved at most) makes "train within N GiB" testable on a large GPU.
//
// PinnedHostAllocator: page-locked host memory (cudaHostAlloc) for fast, asynchronous copies,
// cached likewise; a freed block is reused once the copies issued on it have completed.
//
// ManagedAllocator: cudaMallocManaged, refusing any request larger than cudaMemGetInfo's free
// bytes (over-subscribed managed memory can hang the GPU); cached like pinned memory (cudaFree
// synchronises the device, which a per-batch free would do every step).

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/Allocator.h"
#include "core/BlockPool.h"

namespace mt {

class CachingDeviceAllocator final : public Allocator {
 public:
  explicit CachingDeviceAllocator(int device);
  ~CachingDeviceAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  Device device() const override { return Device::cuda(device_); }
  const char* name() const override { return "cuda-caching"; }
  AllocatorStats stats() const override;
  void resetPeak() override;

  // ptr (or any address inside one of this allocator's blocks) is also used on `stream`: the
  // block is not reused until the work queued there by then is done. Returns false when ptr is
  // not from this allocator.
  bool recordStream(const void* ptr, cudaStream_t stream);
  // `stream` is about to be destroyed, its work finished: no block records events on it any more.
  void forgetStream(cudaStream_t stream) noexcept;
  // Caps reserved bytes (0: no cap).
  void setMemoryCap(size_t bytes);
  size_t memoryCap() const { return cap_; }
  // Returns cached blocks to CUDA.
  void emptyCache();

 private:
  struct Block {
    void* ptr;
    size_t size;
    cudaStream_t stream;
    std::vector<cudaStream_t> otherStreams;
  };
  static bool isLarge(size_t size) { return size >= (size_t{1} << 20); }
  void releaseCachedLocked();
  void processPendingLocked();
  void recycleLocked(const Block& b);  // a freed block whose uses are all complete
  void* takeLocked(size_t size, cudaStream_t stream, size_t* got);
  void* mallocLocked(size_t size, size_t requested);

  int device_;
  size_t cap_ = 0;
  mutable std::mutex mutex_;
  std::map<void*, Block> live_;  // ordered: recordStream finds the block holding an interior pointer
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_;  // small: (stream, size) -> blocks
  std::unordered_map<void*, Block> freeBlocks_;                           // small
  BlockPool large_;
  std::vector<std::pair<Block, std::vector<cudaEvent_t>>> pending_;  // freed, waiting on events
  AllocatorStats stats_;
};

// Blocks the CPU writes and the GPU reads (pinned, managed): a freed block goes back to the cache
// once the GPU work queued on the freeing thread's stream has completed (an event), so a worker
// never overwrites a batch a kernel or copy still reads.
class EventGatedCache {
 public:
  EventGatedCache() = default;
  EventGatedCache(const EventGatedCache&) = delete;
  EventGatedCache& operator=(const EventGatedCache&) = delete;
  // A cached block of exactly `size` whose event completed, or nullptr. Caller holds no lock.
  void* take(size_t size);
  void give(void* ptr, size_t size) noexcept;
  // Every cached block, pending ones after their events (destruction).
  template <typename F>
  void releaseAll(F&& freeFn) {
    for (auto& p : pending_) {
      cudaEventSynchronize(p.event);
      cudaEventDestroy(p.event);
      freeFn(p.ptr);
    }
    for (auto& kv : free_)
      freeFn(kv.second);
    pending_.clear();
    free_.clear();
  }

 private:
  struct Pending {
    void* ptr;
    size_t size;
    cudaEvent_t event;
  };
  std::vector<Pending> pending_;
  std::multimap<size_t, void*> free_;
};

// Host-side memory the GPU reads (page-locked or managed), cached in an EventGatedCache: one
// template for both kinds, the CUDA calls supplied by Backing:
//   static constexpr const char* kName;  Device device() const;
//   void* allocate(size_t size, size_t requested, const AllocatorStats&) const;  // throws OutOfMemoryError
//   static void release(void* ptr) noexcept;
template <typename Backing>
class CachingHostAllocator final : public Allocator {
 public:
  explicit CachingHostAllocator(Backing backing = Backing()) : backing_(backing) {}
  ~CachingHostAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  Device device() const override { return backing_.device(); }
  const char* name() const override { return Backing::kName; }
  AllocatorStats stats() const override;
  void resetPeak() override;

 private:
  Backing backing_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;
  EventGatedCache cache_;
  AllocatorStats stats_;
};

// cudaHostAlloc: host memory, CPU-addressable, copied from asynchronously.
struct PinnedBacking {
  static constexpr const char* kName = "cuda-pinned";
  Device device() const { return Device::cpu(); }
  void* allocate(size_t size, size_t requested, const AllocatorStats& stats) const;
  static void release(void* ptr) noexcept;
};
// cudaMallocManaged on `deviceIndex`, refusing more than the GPU has free.
struct ManagedBacking {
  static constexpr const char* kName = "cuda-managed";
  int deviceIndex = 0;
  Device device() const { return Device::cuda(deviceIndex); }
  void* allocate(size_t size, size_t requested, const AllocatorStats& stats) const;
  static void release(void* ptr) noexcept;
};

using PinnedHostAllocator = CachingHostAllocator<PinnedBacking>;
using ManagedAllocator = CachingHostAllocator<ManagedBacking>;
extern template class CachingHostAllocator<PinnedBacking>;
extern template class CachingHostAllocator<ManagedBacking>;

}  // namespace mt
