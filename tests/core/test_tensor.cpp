#include <gtest/gtest.h>

#include "core/Tensor.h"

namespace mt {
namespace {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 6}, DType::kF32);
  EXPECT_TRUE(t.isContiguous());
  EXPECT_EQ(t.numel(), 24);
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.dim(1), 12);
  v.data<float>()[5] = 3.f;
  EXPECT_EQ(t.data<float>()[5], 3.f);
  Tensor row = t.narrow(0, 2, 1);
  EXPECT_TRUE(row.isContiguous());
  EXPECT_EQ(row.data<float>() - t.data<float>(), 12);
  Tensor col = t.narrow(1, 1, 2);
  EXPECT_FALSE(col.isContiguous());
  Tensor s = t.flatSlice(4, 8);
  EXPECT_EQ(s.shape(), (Shape{8}));
  EXPECT_TRUE(s.sharesStorageWith(t));
}

TEST(Tensor, ChecksMisuse) {
  Tensor t = Tensor::zeros({3, 5}, DType::kF32);
  EXPECT_THROW(t.view({4, 4}), InternalError);
  EXPECT_THROW(t.narrow(0, 2, 2), InternalError);
  EXPECT_THROW(t.data<int32_t>(), InternalError);
  EXPECT_THROW(t.narrow(1, 0, 2).view({6}), InternalError);
}

TEST(Tensor, ConvertsAndClones) {
  Tensor t = Tensor::empty({3}, DType::kF32);
  t.data<float>()[0] = 1.5f;
  t.data<float>()[1] = -2.25f;
  t.data<float>()[2] = 1e-3f;
  Tensor b = t.toDType(DType::kBF16).toDType(DType::kF32);
  EXPECT_EQ(b.data<float>()[0], 1.5f);
  EXPECT_NEAR(b.data<float>()[2], 1e-3f, 1e-5f);
  Tensor c = t.clone();
  EXPECT_FALSE(c.sharesStorageWith(t));
  EXPECT_EQ(c.data<float>()[1], -2.25f);
}

TEST(Allocator, TracksBytesAndPeak) {
  CpuAllocator a;
  a.resetPeak();
  void* p = a.allocate(1000);
  void* q = a.allocate(24);
  EXPECT_EQ(a.stats().allocatedBytes, 1024);
  a.deallocate(p, 1000);
  EXPECT_EQ(a.stats().allocatedBytes, 24);
  EXPECT_EQ(a.stats().peakAllocatedBytes, 1024);
  a.deallocate(q, 24);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
}

}  // namespace
}  // namespace mt
