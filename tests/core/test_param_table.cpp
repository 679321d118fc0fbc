#include <gtest/gtest.h>

#include "core/Allocator.h"
#include "core/ParamTable.h"

namespace mt {
namespace {

TEST(ParamTable, FlatLayoutInRegistrationOrder) {
  ParamTable t;
  t.beginUnit(0);
  Param& w = t.add("fc1.weight", {4, 3});
  Param& b = t.add("fc1.bias", {4}, false);
  t.beginUnit(1);
  Param& w2 = t.add("fc2.weight", {2, 4});
  EXPECT_THROW(t.add("fc1.bias", {1}), InternalError);
  t.materialize(Device::cpu());
  EXPECT_THROW(t.add("late", {1}), InternalError);
  EXPECT_EQ(t.numel(), 12 + 4 + 8);
  EXPECT_EQ(t.numUnits(), 2);
  EXPECT_EQ(t.unitParams(0).size(), 2u);
  EXPECT_EQ(b.offset, 12);
  // Storage is aligned: each parameter starts at a multiple of kParamAlign elements.
  EXPECT_EQ(w2.value.rawData(), static_cast<char*>(t.flatValues().rawData()) + 2 * kParamAlign * sizeof(float));
  EXPECT_EQ(t.storageNumel(), 3 * kParamAlign);
  EXPECT_TRUE(w.grad.sharesStorageWith(t.flatGrads()));
  EXPECT_FALSE(b.decay);
}

TEST(ParamTable, GradLayoutCanBeReordered) {
  ParamTable t;
  t.add("a", {2});
  t.add("b", {3});
  t.materialize(Device::cpu());
  t.setGradLayout({3, 0}, {{0, 3}, {3, 2}});  // b first, then a, a group each
  t[1].grad.data<float>()[0] = 7.f;
  t[0].grad.data<float>()[1] = 9.f;
  Tensor buf = t.flatGrads();
  EXPECT_EQ(buf.numel(), 5);
  EXPECT_EQ(buf.data<float>()[0], 7.f);
  EXPECT_EQ(buf.data<float>()[4], 9.f);
  EXPECT_EQ(t.gradSlice(3, 2).data<float>()[1], 9.f);
  t.zeroGrads();
  EXPECT_EQ(buf.data<float>()[0], 0.f);
  // A gradient across a group boundary, or groups with a gap, are refused.
  EXPECT_THROW(t.setGradLayout({2, 0}, {{0, 3}, {3, 2}}), InternalError);
  EXPECT_THROW(t.setGradLayout({3, 0}, {{0, 2}, {3, 2}}), InternalError);
}

// Per-step gradients: a group's buffer exists from the first needGrads of one of its units to
// dropGrads, starts at zero every step, and nothing else keeps memory.
TEST(ParamTable, PerStepGradsAreMadeWhenNeededAndDropped) {
  ParamTable t;
  t.beginUnit(0);
  Param& a = t.add("a", {2});
  t.beginUnit(1);
  Param& b = t.add("b", {3});
  Param& c = t.add("c", {4});
  t.materialize(Device::cpu());
  ASSERT_EQ(t.gradGroups().size(), 2u);  // a group per unit
  EXPECT_EQ(t.gradGroups()[1].offset, kParamAlign);
  EXPECT_EQ(t.residentGradBytes(), 3 * kParamAlign * 4);
  t.setGradLifetime(GradLifetime::kPerStep);
  EXPECT_FALSE(a.grad.defined());
  EXPECT_FALSE(t.flatGrads().defined());
  EXPECT_EQ(t.residentGradBytes(), 0);
  EXPECT_EQ(t.gradBytes(), 3 * kParamAlign * 4);
  const int64_t before = cpuAllocator().stats().allocatedBytes;
  t.needGrads(1);
  EXPECT_FALSE(a.grad.defined());
  ASSERT_TRUE(b.grad.defined() && c.grad.defined());
  EXPECT_EQ(t.residentGradBytes(), 2 * kParamAlign * 4);
  EXPECT_EQ(cpuAllocator().stats().allocatedBytes - before, 2 * kParamAlign * 4);
  EXPECT_TRUE(c.grad.sharesStorageWith(b.grad));
  EXPECT_EQ(c.grad.data<float>()[3], 0.f);
  c.grad.data<float>()[3] = 5.f;
  t.needGrads(1);  // made once a step: what backward wrote stays
  EXPECT_EQ(c.grad.data<float>()[3], 5.f);
  EXPECT_EQ(t.gradSlice(2 * kParamAlign, 4).data<float>()[3], 5.f);
  EXPECT_THROW(t.gradSlice(0, 2), InternalError);  // unit 0's group was not made
  t.needAllGrads();
  ASSERT_TRUE(a.grad.defined());
  EXPECT_FALSE(a.grad.sharesStorageWith(b.grad));
  t.zeroGrads();  // per step: drops
  EXPECT_FALSE(b.grad.defined());
  EXPECT_EQ(t.residentGradBytes(), 0);
  EXPECT_EQ(cpuAllocator().stats().allocatedBytes, before);
  t.needGrads(1);
  EXPECT_EQ(c.grad.data<float>()[3], 0.f);  // zeroed when made again
  t.dropGrads();
  t.setGradLifetime(GradLifetime::kPersistent);
  EXPECT_TRUE(a.grad.defined() && c.grad.sharesStorageWith(t.flatGrads()));
}

}  // namespace
}  // namespace mt
