#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"

namespace mt {
namespace {

TEST(CudaAllocator, SizeClasses) {
  EXPECT_EQ(roundAllocationSize(1), 512u);
  EXPECT_EQ(roundAllocationSize(1 << 20), 1u << 20);
  EXPECT_EQ(roundAllocationSize((1 << 20) + 1), (1u << 20) / 4 * 5);
  EXPECT_EQ(roundAllocationSize(3u << 20), 3u << 20);
  for (size_t b : {size_t{1} << 21, size_t{5000000}, size_t{123456789}}) {
    const size_t r = roundAllocationSize(b);
    EXPECT_GE(r, b);
    EXPECT_LE(r, b + b / 4 + 512);
  }
}

TEST(CudaAllocator, ReusesFreedBlocksOnTheSameStream) {
  CachingDeviceAllocator& a = CudaRuntime::require().allocator();
  a.emptyCache();
  const AllocatorStats before = a.stats();
  void* p = a.allocate(3 << 20);
  a.deallocate(p, 3 << 20);
  void* q = a.allocate((3 << 20) - 100);  // same size class
  EXPECT_EQ(p, q);
  EXPECT_EQ(a.stats().reservedBytes, before.reservedBytes + (3 << 20));
  a.deallocate(q, 0);
  a.emptyCache();
  EXPECT_EQ(a.stats().reservedBytes, before.reservedBytes);
}

// Large blocks are cut from freed segments (core/BlockPool): memory freed in one size serves
// requests of another without reserving more (per-step gradient buffers in the activations
// backward has freed), and goes back to CUDA once whole again.
TEST(CudaAllocator, FreedLargeBlocksServeOtherSizesWithoutReservingMore) {
  CachingDeviceAllocator& a = CudaRuntime::require().allocator();
  a.emptyCache();
  const AllocatorStats before = a.stats();
  std::vector<void*> act;
  for (int i = 0; i < 3; ++i)
    act.push_back(a.allocate(210u << 20));
  a.deallocate(act[1], 0);
  a.deallocate(act[2], 0);
  const int64_t reserved = a.stats().reservedBytes;
  std::vector<void*> grads;
  for (int i = 0; i < 4; ++i)
    grads.push_back(a.allocate(100u << 20));
  EXPECT_EQ(a.stats().reservedBytes, reserved);
  EXPECT_EQ(a.stats().allocatedBytes,
            before.allocatedBytes +
                static_cast<int64_t>(roundAllocationSize(210u << 20) + 4 * roundAllocationSize(100u << 20)));
  for (void* g : grads)
    CUDA_CHECK(cudaMemset(g, 1, 100u << 20));  // the memory is really there
  for (void* g : grads)
    a.deallocate(g, 0);
  a.deallocate(act[0], 0);
  a.emptyCache();
  EXPECT_EQ(a.stats().reservedBytes, before.reservedBytes);
  EXPECT_EQ(a.stats().allocatedBytes, before.allocatedBytes);
}

TEST(CudaAllocator, RecordedStreamsDelayReuse) {
  CudaRuntime& rt = CudaRuntime::require();
  CachingDeviceAllocator& a = rt.allocator();
  CudaStream other;
  void* p = a.allocate(1 << 22);
  EXPECT_TRUE(a.recordStream(static_cast<char*>(p) + 1000, other.get()));  // interior pointer
  int dummy = 0;
  EXPECT_FALSE(a.recordStream(&dummy, other.get()));
  // Keep `other` busy so the recorded event cannot have completed yet.
  void* big = a.allocate(256 << 20);
  for (int i = 0; i < 100; ++i)
    CUDA_CHECK(cudaMemsetAsync(big, i, 256 << 20, other.get()));
  a.deallocate(p, 0);
  void* q = a.allocate(1 << 22);
  EXPECT_NE(p, q);  // still in use on `other`
  other.synchronize();
  a.deallocate(q, 0);
  a.deallocate(big, 0);
}

TEST(CudaAllocator, CapAndOutOfMemoryAreClearErrors) {
  CachingDeviceAllocator& a = CudaRuntime::require().allocator();
  a.emptyCache();
  const size_t reserved = static_cast<size_t>(a.stats().reservedBytes);
  a.setMemoryCap(reserved + (64u << 20));
  void* p = a.allocate(32u << 20);
  try {
    a.allocate(64u << 20);
    ADD_FAILURE() << "no error above the cap";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("memory cap"), std::string::npos) << e.what();
  }
  a.deallocate(p, 0);
  a.setMemoryCap(0);
  EXPECT_THROW(a.allocate(size_t{1} << 50), OutOfMemoryError);  // a petabyte
  const AllocatorStats s = a.stats();
  EXPECT_GE(s.peakAllocatedBytes, 32 << 20);
}

TEST(CudaAllocator, TensorsOnTheDevice) {
  Tensor t = Tensor::empty({1000}, DType::kF32);
  for (int i = 0; i < 1000; ++i)
    t.data<float>()[i] = static_cast<float>(i);
  Tensor d = t.to(Device::cuda(0));
  EXPECT_TRUE(d.device().isCuda());
  Tensor e = d.clone();
  e.flatSlice(10, 5).zero_();
  Tensor back = e.to(Device::cpu());
  EXPECT_EQ(back.data<float>()[9], 9.f);
  EXPECT_EQ(back.data<float>()[12], 0.f);
  EXPECT_EQ(back.data<float>()[15], 15.f);
}

TEST(PinnedAndManaged, Basics) {
  CudaRuntime& rt = CudaRuntime::require();
  void* p = rt.pinned().allocate(1 << 20);
  cudaPointerAttributes attr{};
  CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  rt.pinned().deallocate(p, 1 << 20);
  size_t freeB = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&freeB, &total));
  EXPECT_THROW(rt.managed().allocate(freeB + (1u << 30)), OutOfMemoryError);
  void* m = rt.managed().allocate(1 << 20);
  static_cast<char*>(m)[0] = 7;  // host-accessible
  rt.managed().deallocate(m, 1 << 20);
}

}  // namespace
}  // namespace mt
