#include <gtest/gtest.h>

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
  Tensor buf = Tensor::zeros({5}, DType::kF32);
  t.setGradLayout({3, 0}, buf);  // b first, then a
  t[1].grad.data<float>()[0] = 7.f;
  t[0].grad.data<float>()[1] = 9.f;
  EXPECT_EQ(buf.data<float>()[0], 7.f);
  EXPECT_EQ(buf.data<float>()[4], 9.f);
  t.zeroGrads();
  EXPECT_EQ(buf.data<float>()[0], 0.f);
}

}  // namespace
}  // namespace mt
