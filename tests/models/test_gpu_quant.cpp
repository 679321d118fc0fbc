// The CUDA fake quantization (models/kernels/FakeQuant.cu) against the CPU path: the same values
// bit for bit (both divide by the scale and round half to even), the same clipped gradient, the
// same range; and a QAT training step of the CNN on the GPU matching the CPU's.
#include <gtest/gtest.h>

#include <cstring>

#include "models/ModelConfig.h"
#include "models/quant/QuantizedModel.h"
#include "models/quant/Quantizer.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

const Device kGpu = Device::cuda(0);

void expectBitEqual(const Tensor& gpu, const Tensor& cpu, const char* what) {
  const Tensor back = gpu.to(Device::cpu());
  ASSERT_EQ(back.numel(), cpu.numel());
  EXPECT_EQ(std::memcmp(back.data<float>(), cpu.data<float>(), cpu.nbytes()), 0) << what;
}

TEST(GpuQuant, KernelsMatchTheCpuBitForBit) {
  Tensor w = test::randomTensor({37, 3, 3, 19}, 1, 0.2f);
  w.data<float>()[5] = 0.f;
  for (int64_t i = 0; i < 171; ++i)
    w.data<float>()[171 * 4 + i] = 0.f;  // an all-zero channel
  Tensor x = test::randomTensor({129, 301}, 2, 3.f);
  Tensor fw = Tensor::empty(w.shape(), DType::kF32), gfw = Tensor::empty(w.shape(), DType::kF32, kGpu);
  fakeQuantWeight(fw, w);
  Tensor gw = w.to(kGpu);
  fakeQuantWeight(gfw, gw);
  expectBitEqual(gfw, fw, "weights");
  const ActivationQParams p = activationQParams(-2.f, 2.5f);
  Tensor fx = Tensor::empty(x.shape(), DType::kF32), gfx = Tensor::empty(x.shape(), DType::kF32, kGpu);
  Tensor gx = x.to(kGpu);
  fakeQuantActivation(fx, x, p);
  fakeQuantActivation(gfx, gx, p);
  expectBitEqual(gfx, fx, "activations");
  Tensor g = test::randomTensor(x.shape(), 3), gg = g.to(kGpu);
  clipGradient(g, x, p);
  clipGradient(gg, gx, p);
  expectBitEqual(gg, g, "clipped gradient");
  const auto cpuRange = tensorRange(x), gpuRange = tensorRange(gx);
  EXPECT_EQ(cpuRange, gpuRange);
}

TEST(GpuQuant, QatCnnStepMatchesTheCpu) {
  ModelConfig mc;
  mc.type = "cnn";
  mc.convChannels = {4, 8};
  mc.fc = 16;
  const InputSpec in{12, 12, 1, 5};
  auto cpuModel = buildImageModel(mc, in), gpuModel = buildImageModel(mc, in);
  QuantOptions o;
  o.freezeStep = 10;
  QuantizedModel cq(*cpuModel, o), gq(*gpuModel, o);
  cpuModel->params().materialize(Device::cpu());
  gpuModel->params().materialize(kGpu);
  cpuModel->initParams(5);
  gpuModel->initParams(5);
  Batch b;
  b.inputs = Tensor::empty({8, 12, 12, 1}, DType::kU8);
  for (int64_t i = 0; i < b.inputs.numel(); ++i)
    b.inputs.data<uint8_t>()[i] = static_cast<uint8_t>((i * 53) % 256);
  b.targets = Tensor::empty({8}, DType::kI64);
  for (int64_t i = 0; i < 8; ++i)
    b.targets.data<int64_t>()[i] = i % 5;
  Batch gb;
  gb.inputs = b.inputs.to(kGpu);
  gb.targets = b.targets.to(kGpu);
  Context c, g;
  g.device = kGpu;
  cpuModel->params().zeroGrads();
  gpuModel->params().zeroGrads();
  const LossStats lc = cpuModel->forward(b, c);
  const LossStats lg = gpuModel->forward(gb, g);
  cpuModel->backward(c);
  gpuModel->backward(g);
  EXPECT_NEAR(lg.resolved().meanLoss(), lc.meanLoss(), 1e-3);
  // The observers saw the same ranges (to the GEMMs' rounding), so the quantizers agree.
  const Tensor lo = cq.packedLows(), glo = gq.packedLows();
  for (int64_t i = 0; i < lo.numel(); ++i)
    EXPECT_NEAR(glo.data<float>()[i], lo.data<float>()[i], 1e-3) << i;
  EXPECT_LT(test::relErr(gpuModel->params().flatGrads(), cpuModel->params().flatGrads()), 2e-2);
}

}  // namespace
}  // namespace mt
