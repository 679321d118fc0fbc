#pragma once
// Image input: u8 images [N,H,W,C] (the data file layout) to normalised f32
//   y = (x / 255 - mean) / std
// in the model's layout (NHWC as stored, NCHW transposed, or flattened to [N, H·W·C] for MLPs,
// in H,W,C order). No parameters and no input gradient (backward returns an undefined tensor).
// Already-f32 inputs (tests, other datasets) are taken as normalised and only re-laid out.

#include "models/Module.h"
#include "models/layers/KernelTypes.h"
#include "models/layers/Layout.h"

namespace mt {

void imageInputForward(Tensor& y, const Tensor& x, float mean, float stddev, ImageOutput out);

class ImageInput : public Module {
 public:
  ImageInput(ImageOutput out, float mean, float stddev) : out_(out), mean_(mean), std_(stddev) {}
  std::string kind() const override { return "image_input"; }
  // y = (x * scale - mean) / std on the file's u8 [N,H,W,C] images, then laid out as `output`.
  LayerAttributes attributes() const override {
    return {attrNumber("scale", 1.0 / 255.0), attrNumber("mean", mean_), attrNumber("std", std_),
            attrWord("output", out_ == ImageOutput::kFlat ? "flat_hwc" : out_ == ImageOutput::kNCHW ? "nchw" : "nhwc")};
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override { return Tensor(); }
  Shape outputShape(const Shape& in) const override;

 private:
  ImageOutput out_;
  float mean_, std_;
};

// Flatten all but the first dimension (a view).
class Flatten : public Module {
 public:
  std::string kind() const override { return "flatten"; }
  CachePlan cachePlan(const Shape&, const PlanContext&) const override {
    CachePlan p;
    p.outputAliasesInput = true;
    return p;
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  Shape outputShape(const Shape& in) const override;

 private:
  Shape inShape_;
};

}  // namespace mt
