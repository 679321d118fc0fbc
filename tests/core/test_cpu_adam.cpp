// core/optim/CpuAdam: every variant this CPU runs against the scalar reference, bit for bit (p, m,
// v and the bf16 copy), over odd lengths, unaligned starts, both gradient dtypes, with and without
// weight decay, over several steps (the bias corrections change); the copy against convertInto;
// 1 and 2 OpenMP threads; MT_CPU_ADAM's validation; the optimizer writing segments' copies.

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/Convert.h"
#include "core/optim/CpuAdam.h"
#include "core/optim/Optimizer.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<CpuAdamIsa> supportedVariants() {
  std::vector<CpuAdamIsa> out;
  for (const auto& e : cpuAdamIsas()) {
    if (cpuAdamSupported(e.value))
      out.push_back(e.value);
    else
      std::printf("[ note ] this CPU cannot run the %s variant: not tested here\n", e.name);
  }
  return out;
}

// One shard's buffers with `pad` leading elements, so the spans start `pad` floats past an
// allocation's (aligned) start.
struct Shard {
  std::vector<float> p, m, v, gf;
  std::vector<BFloat16> gb, copy;
  int64_t pad = 0, n = 0;

  Shard(int64_t n_, int64_t pad_, uint64_t seed) : pad(pad_), n(n_) {
    const size_t total = static_cast<size_t>(n + pad);
    p.resize(total), m.resize(total), v.resize(total), gf.resize(total), gb.resize(total), copy.resize(total);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < total; ++i) {
      p[i] = u(rng);
      m[i] = 0.1f * u(rng);
      v[i] = 0.01f * std::fabs(u(rng));  // a state from earlier steps
    }
    newGradient(seed + 1);
  }
  void newGradient(uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (size_t i = 0; i < gf.size(); ++i) {
      gf[i] = u(rng) * (i % 5 == 0 ? 1e-4f : 1.f);  // some small gradients: v near eps's scale
      gb[i] = BFloat16(gf[i]);
    }
  }
  AdamwSpans spans(bool bf16Grad, bool withCopy) {
    AdamwSpans s;
    s.p = p.data() + pad;
    s.gBf16 = bf16Grad;
    s.g = bf16Grad ? static_cast<const void*>(gb.data() + pad) : static_cast<const void*>(gf.data() + pad);
    s.m = m.data() + pad;
    s.v = v.data() + pad;
    s.copy = withCopy ? copy.data() + pad : nullptr;
    s.n = n;
    return s;
  }
};

// Bitwise equal over the span; reports the first difference.
void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what,
                    const std::string& where) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (bitsOf(a[i]) != bitsOf(b[i])) {
      ADD_FAILURE() << where << ": " << what << "[" << i << "] " << a[i] << " vs " << b[i];
      return;
    }
}

TEST(CpuAdam, EveryVariantEqualsTheScalarReferenceBitwise) {
  const std::vector<CpuAdamIsa> variants = supportedVariants();
  ASSERT_FALSE(variants.empty());
  for (int64_t n : {1, 7, 15, 16, 17, 1000003})
    for (int64_t pad : {0, 1, 3})
      for (bool bf16Grad : {false, true})
        for (float wd : {0.f, 0.1f}) {
          if (n > 1000 && pad == 1) continue;  // the long span: two starts are enough
          Shard ref(n, pad, static_cast<uint64_t>(n * 7 + pad));
          std::vector<Shard> runs(variants.size(), ref);
          for (int64_t step = 1; step <= 4; ++step) {
            const AdamwHyper h{1e-3f * static_cast<float>(step), wd, 0.9f, 0.999f, 1e-8f, step};
            cpuAdamw(ref.spans(bf16Grad, true), h, CpuAdamIsa::kScalar);
            for (size_t k = 0; k < variants.size(); ++k) {
              cpuAdamw(runs[k].spans(bf16Grad, true), h, variants[k]);
              const std::string where = std::string(cpuAdamIsaName(variants[k])) + " n=" + std::to_string(n) +
                                        " pad=" + std::to_string(pad) + (bf16Grad ? " bf16 g" : " f32 g") +
                                        " wd=" + std::to_string(wd) + " step " + std::to_string(step);
              expectSameBits(runs[k].p, ref.p, "p", where);
              expectSameBits(runs[k].m, ref.m, "m", where);
              expectSameBits(runs[k].v, ref.v, "v", where);
              for (int64_t i = 0; i < n + pad; ++i) {
                const uint16_t want = i < pad ? 0 : BFloat16::fromFloat(ref.p[static_cast<size_t>(i)]);
                if (runs[k].copy[static_cast<size_t>(i)].bits != want) {
                  ADD_FAILURE() << where << ": copy[" << i << "]";
                  break;
                }
              }
              runs[k].newGradient(static_cast<uint64_t>(step * 31 + n));
            }
            ref.newGradient(static_cast<uint64_t>(step * 31 + n));
          }
        }
}

// gradScale (ZeRO-Offload's clip factor, applied as the update reads g): every variant gives bitwise
// what the step gives on gradients scaled in place first (f32: the same product, rounded once), and
// 1 changes nothing. Fails if a variant ignores the factor or applies it to m or v instead.
TEST(CpuAdam, GradScaleEqualsScalingTheGradientFirst) {
  for (CpuAdamIsa isa : supportedVariants())
    for (int64_t n : {17, 100003}) {
      const float c = 0.3173f;
      Shard fused(n, 1, 11), scaled = fused;
      for (size_t i = 0; i < scaled.gf.size(); ++i) scaled.gf[i] *= c;
      AdamwHyper h{1e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 3};
      cpuAdamw(scaled.spans(false, true), h, isa);
      h.gradScale = c;
      cpuAdamw(fused.spans(false, true), h, isa);
      const std::string where = std::string(cpuAdamIsaName(isa)) + " n=" + std::to_string(n);
      expectSameBits(fused.p, scaled.p, "p", where);
      expectSameBits(fused.m, scaled.m, "m", where);
      expectSameBits(fused.v, scaled.v, "v", where);
      Shard one(n, 1, 11), plain = one;
      h.gradScale = 1.f;
      cpuAdamw(one.spans(true, true), h, isa);
      h = AdamwHyper{1e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 3};
      cpuAdamw(plain.spans(true, true), h, isa);
      expectSameBits(one.p, plain.p, "p (scale 1)", where);
      EXPECT_NE(bitsOf(fused.p[5]), bitsOf(one.p[5])) << where << ": the factor changed nothing";
    }
}

// The kernel against the formula in double (PyTorch's AdamW): max|error| / max|p| < 1e-6.
TEST(CpuAdam, ReferenceMatchesTheFormulaInDouble) {
  const int64_t n = 4099;
  Shard s(n, 0, 5);
  std::vector<double> p(s.p.begin(), s.p.end()), m(s.m.begin(), s.m.end()), v(s.v.begin(), s.v.end());
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  for (int64_t t = 1; t <= 5; ++t) {
    cpuAdamw(s.spans(true, false), {static_cast<float>(lr), static_cast<float>(wd), 0.9f, 0.95f, 1e-8f, t},
             bestCpuAdamIsa());
    double worst = 0, scale = 0;  // max|error| / max|p|, as test::relErr
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = static_cast<float>(s.gb[i]);
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      p[i] -= lr / (1 - std::pow(b1, t)) * m[i] / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
      worst = std::max(worst, std::fabs(s.p[i] - p[i]));
      scale = std::max(scale, std::fabs(p[i]));
    }
    EXPECT_LT(worst / scale, 1e-6) << "step " << t;
    s.newGradient(static_cast<uint64_t>(100 + t));
  }
}

// The copy is convertInto's f32 -> bf16 bit for bit, on the values that stress rounding: ties to
// even either way, the largest finite floats (round to inf), subnormals, signed zeros, infinities,
// quiet and signalling NaNs with payloads, and random bit patterns. lr = wd = 0 and g = m = v = 0
// leave p as it is, so the copy is the conversion of these exact values.
TEST(CpuAdam, CopyIsTheBf16ConversionBitwise) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,
                                0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x00000001, 0x80000001, 0x007fffff,
                                0x00008000, 0x00018000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
                                0x7f800001, 0x7fa00000, 0xffffffff, 0x7fffffff, 0x3fffffff, 0xbf808000};
  std::mt19937 rng(7);
  while (bits.size() < 100003)
    bits.push_back(static_cast<uint32_t>(rng()));
  const int64_t n = static_cast<int64_t>(bits.size());
  for (CpuAdamIsa isa : supportedVariants()) {
    Tensor p = Tensor::empty({n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i)
      p.data<float>()[i] = floatOf(bits[static_cast<size_t>(i)]);
    Tensor g = Tensor::zeros({n}, DType::kF32), m = Tensor::zeros({n}, DType::kF32),
           v = Tensor::zeros({n}, DType::kF32), copy = Tensor::zeros({n}, DType::kBF16);
    AdamwSpans s;
    s.p = p.data<float>(), s.g = g.rawData(), s.m = m.data<float>(), s.v = v.data<float>();
    s.copy = copy.data<BFloat16>(), s.n = n;
    cpuAdamw(s, {0.f, 0.f, 0.9f, 0.999f, 1e-8f, 1}, isa);
    Tensor want = Tensor::empty({n}, DType::kBF16);
    convertInto(want, p);
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      const uint32_t in = bits[static_cast<size_t>(i)];
      // p = p·1 - 0: a signalling NaN comes out quiet (x86), everything else unchanged.
      const bool snan = (in & 0x7fffffffu) > 0x7f800000u && !(in & 0x00400000u);
      EXPECT_EQ(bitsOf(p.data<float>()[i]), snan ? in | 0x00400000u : in) << cpuAdamIsaName(isa) << " " << i;
      if (copy.data<BFloat16>()[i].bits != want.data<BFloat16>()[i].bits) {
        ++bad;
        ADD_FAILURE() << cpuAdamIsaName(isa) << ": bits 0x" << std::hex << in << " -> 0x"
                      << copy.data<BFloat16>()[i].bits << ", convertInto 0x" << want.data<BFloat16>()[i].bits;
      }
    }
  }
}

// Each thread runs a contiguous range: 1 and 2 threads give the same bits.
TEST(CpuAdam, OneAndTwoThreadsAreIdentical) {
  const int saved = omp_get_max_threads();
  for (CpuAdamIsa isa : supportedVariants()) {
    Shard a(1000003, 1, 3), b = a;
    for (int64_t step = 1; step <= 2; ++step) {
      omp_set_num_threads(1);
      cpuAdamw(a.spans(true, true), {1e-3f, 0.1f, 0.9f, 0.999f, 1e-8f, step}, isa);
      omp_set_num_threads(2);
      cpuAdamw(b.spans(true, true), {1e-3f, 0.1f, 0.9f, 0.999f, 1e-8f, step}, isa);
    }
    expectSameBits(a.p, b.p, "p", cpuAdamIsaName(isa));
    expectSameBits(a.m, b.m, "m", cpuAdamIsaName(isa));
    expectSameBits(a.v, b.v, "v", cpuAdamIsaName(isa));
    EXPECT_EQ(std::memcmp(a.copy.data(), b.copy.data(), a.copy.size() * 2), 0) << cpuAdamIsaName(isa);
  }
  omp_set_num_threads(saved);
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(CpuAdam, EnvironmentChoosesAndValidatesTheVariant) {
  {
    ScopedEnv e("MT_CPU_ADAM", "auto");
    EXPECT_EQ(cpuAdamIsaFromEnv(), bestCpuAdamIsa());
  }
  for (CpuAdamIsa isa : supportedVariants()) {
    ScopedEnv e("MT_CPU_ADAM", cpuAdamIsaName(isa));
    EXPECT_EQ(cpuAdamIsaFromEnv(), isa);
  }
  {
    ScopedEnv e("MT_CPU_ADAM", "avx1024");
    try {
      cpuAdamIsaFromEnv();
      ADD_FAILURE() << "avx1024 accepted";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("MT_CPU_ADAM='avx1024'"), std::string::npos) << err.what();
    }
    // The CPU optimizer refuses it when it is made, before any step.
    Tensor p = Tensor::zeros({4}, DType::kF32), g = Tensor::zeros({4}, DType::kF32);
    EXPECT_THROW(makeOptimizer({"adamw"}, {{p, g, true}}), ConfigError);
  }
  for (const auto& e : cpuAdamIsas())
    if (!cpuAdamSupported(e.value)) {
      ScopedEnv env("MT_CPU_ADAM", e.name);
      EXPECT_THROW(cpuAdamIsaFromEnv(), ConfigError) << e.name;
    }
}

// An optimizer segment's copy is set to bf16 of the updated value, by AdamW (in its pass) and SGD.
TEST(CpuAdam, OptimizerWritesSegmentCopies) {
  for (const char* type : {"adamw", "sgd"}) {
    Tensor p = test::randomTensor({1031}, 1), g = test::randomTensor({1031}, 2);
    Tensor copy = Tensor::zeros({1031}, DType::kBF16);
    OptimSegment seg{p, g, true};
    seg.copy = copy;
    auto opt = makeOptimizer({type, 0.1f}, {seg});
    for (int step = 0; step < 3; ++step) {
      opt->step(1e-2f);
      Tensor want = Tensor::empty({1031}, DType::kBF16);
      convertInto(want, p);
      EXPECT_EQ(std::memcmp(copy.rawData(), want.rawData(), want.nbytes()), 0) << type << " step " << step;
    }
    // A copy of the wrong dtype or size is refused.
    OptimSegment bad{p, g, true};
    bad.copy = Tensor::zeros({1031}, DType::kF16);
    EXPECT_THROW(opt->rebind({bad}), InternalError);
    bad.copy = Tensor::zeros({1030}, DType::kBF16);
    EXPECT_THROW(makeOptimizer({type}, {bad}), InternalError);
  }
}

}  // namespace
}  // namespace mt
