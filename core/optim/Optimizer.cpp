#include "core/optim/Optimizer.h"

#include <cmath>

#include "core/Convert.h"
#include "core/ParamTable.h"
#include "core/Parallel.h"
#include "core/optim/SplitOptimizer.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaOptim.h"
#endif

namespace mt {

namespace {

void checkSegment(const OptimSegment& s) {
  // No gradient: per-step gradient buffers between steps (rebound before the next step reads them).
  MT_CHECK(s.value.dtype() == DType::kF32 &&
               (!s.grad.defined() || (s.value.numel() == s.grad.numel() &&
                                      (s.grad.dtype() == DType::kF32 || s.grad.dtype() == DType::kBF16))),
           "optimizer segment ", s.value.str(), " / ", s.grad.str());
  // The device optimizers do not write copies.
  MT_CHECK(!s.copy.defined() || (s.copy.numel() == s.value.numel() && s.copy.dtype() == DType::kBF16 &&
                                 !s.copy.device().isCuda() && !s.value.device().isCuda()),
           "optimizer segment ", s.value.str(), " with copy ", s.copy.str());
}

}  // namespace

Optimizer::Optimizer(std::vector<OptimSegment> segs) : segments_(std::move(segs)) {
  for (const auto& s : segments_) {
    checkSegment(s);
    stateOffsets_.push_back(stateNumel_);
    stateNumel_ += s.value.numel();
  }
}

void Optimizer::rebind(std::vector<OptimSegment> segs) {
  MT_CHECK(segs.size() == segments_.size(), "rebind with ", segs.size(), " segments for ", segments_.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    MT_CHECK(segs[i].value.numel() == segments_[i].value.numel(), "rebind changes the size of segment ", i);
    checkSegment(segs[i]);
  }
  segments_ = std::move(segs);
}

void Optimizer::checkGrads(size_t first, size_t last) const {
  MT_CHECK(first <= last && last <= segments_.size(), "optimizer: segments [", first, ", ", last, ") of ",
           segments_.size());
  for (size_t i = first; i < last; ++i)
    MT_CHECK(segments_[i].grad.defined(), "optimizer step over segment ", i,
             " without a gradient (per-step gradients not rebound after backward)");
}

void Optimizer::step(float lr) {
  beginStep();
  stepSegments(lr, 0, segments_.size());
}

int64_t Optimizer::stateBytes() {
  int64_t b = 0;
  for (auto& kv : state()) b += static_cast<int64_t>(kv.second.nbytes());
  return b;
}

std::vector<std::string> Optimizer::stateNames() {
  std::vector<std::string> names;
  for (auto& kv : state()) names.push_back(kv.first);
  return names;
}

Tensor Optimizer::stateSlice(size_t kind, size_t segment) {
  auto kinds = state();
  MT_CHECK(kind < kinds.size() && segment < segments_.size(), "optimizer state ", kind, " of segment ", segment);
  return kinds[kind].second.flatSlice(stateOffsets_[segment], segments_[segment].value.numel());
}

namespace {

template <typename T>
std::vector<T> slice(const std::vector<T>& v, size_t first, size_t last) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(last));
}

inline float gradAt(const float* g, int64_t i) { return g[i]; }
inline float gradAt(const BFloat16* g, int64_t i) { return static_cast<float>(g[i]); }

template <typename G>
void sgdImpl(float* p, const G* g, float gradScale, float* buf, int64_t n, float lr, float wd, float momentum,
             bool nesterov, bool firstStep) {
  parallelFor(n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float gi = gradAt(g, i) * gradScale + wd * p[i];
      if (momentum != 0.f) {
        const float b = firstStep ? gi : momentum * buf[i] + gi;
        buf[i] = b;
        gi = nesterov ? gi + momentum * b : b;
      }
      p[i] -= lr * gi;
    }
  });
}

}  // namespace

void adamwUpdateCpu(float* p, const Tensor& g, float gradScale, float* m, float* v, int64_t n, float lr, float wd,
                    float beta1, float beta2, float eps, int64_t step, CpuAdamIsa isa, BFloat16* copy) {
  AdamwSpans s;
  s.p = p;
  s.g = g.rawData();
  s.gBf16 = g.dtype() == DType::kBF16;
  s.m = m;
  s.v = v;
  s.copy = copy;
  s.n = n;
  AdamwHyper h{lr, wd, beta1, beta2, eps, step};
  h.gradScale = gradScale;
  cpuAdamw(s, h, isa);
}

void sgdUpdateCpu(float* p, const Tensor& g, float gradScale, float* buf, int64_t n, float lr, float wd,
                  float momentum, bool nesterov, bool firstStep) {
  if (g.dtype() == DType::kBF16)
    sgdImpl(p, g.data<BFloat16>(), gradScale, buf, n, lr, wd, momentum, nesterov, firstStep);
  else
    sgdImpl(p, g.data<float>(), gradScale, buf, n, lr, wd, momentum, nesterov, firstStep);
}

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimConfig& c, std::vector<OptimSegment> segs) : Optimizer(std::move(segs)), cfg_(c) {
    Device d = segments_.empty() ? Device::cpu() : segments_[0].value.device();
    m_ = Tensor::zeros({stateNumel_}, DType::kF32, d);
    v_ = Tensor::zeros({stateNumel_}, DType::kF32, d);
    if (!d.isCuda()) isa_ = cpuAdamIsaFromEnv();  // a bad MT_CPU_ADAM is refused before training
  }
  void updateSegments(float lr, size_t first, size_t last, float gradScale) override {
    MT_CHECK(first <= last && last <= segments_.size() && steps_ > 0, "adamw: segments [", first, ", ", last,
             ") of ", segments_.size(), " at step ", steps_);
#ifdef MT_WITH_CUDA
    if (m_.device().isCuda()) {
      MT_CHECK(gradScale == 1.f, "adamw: a gradient scale on the device (scale the gradients in place)");
      const bool all = first == 0 && last == segments_.size();
      cuda::adamwMultiTensor(all ? segments_ : slice(segments_, first, last),
                             all ? stateOffsets_ : slice(stateOffsets_, first, last), m_, v_, lr, cfg_.weightDecay,
                             cfg_.beta1, cfg_.beta2, cfg_.eps, steps_);
      return;
    }
#endif
    for (size_t i = first; i < last; ++i) {
      auto& s = segments_[i];
      adamwUpdateCpu(s.value.data<float>(), s.grad, gradScale, m_.data<float>() + stateOffsets_[i],
                     v_.data<float>() + stateOffsets_[i], s.value.numel(), lr, s.decay ? cfg_.weightDecay : 0.f,
                     cfg_.beta1, cfg_.beta2, cfg_.eps, steps_, isa_,
                     s.copy.defined() ? s.copy.data<BFloat16>() : nullptr);
    }
  }
  std::vector<std::pair<std::string, Tensor>> state() override { return {{"exp_avg", m_}, {"exp_avg_sq", v_}}; }

 private:
  OptimConfig cfg_;
  Tensor m_, v_;
  CpuAdamIsa isa_ = CpuAdamIsa::kScalar;
};

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimConfig& c, std::vector<OptimSegment> segs) : Optimizer(std::move(segs)), cfg_(c) {
    Device d = segments_.empty() ? Device::cpu() : segments_[0].value.device();
    buf_ = Tensor::zeros({cfg_.momentum != 0.f ? stateNumel_ : 0}, DType::kF32, d);
  }
  void updateSegments(float lr, size_t firstSeg, size_t lastSeg, float gradScale) override {
    MT_CHECK(firstSeg <= lastSeg && lastSeg <= segments_.size() && steps_ > 0, "sgd: segments [", firstSeg, ", ",
             lastSeg, ") of ", segments_.size(), " at step ", steps_);
    const bool first = steps_ == 1;  // the momentum buffer starts as the first gradient
#ifdef MT_WITH_CUDA
    if (buf_.device().isCuda()) {
      MT_CHECK(gradScale == 1.f, "sgd: a gradient scale on the device (scale the gradients in place)");
      const bool all = firstSeg == 0 && lastSeg == segments_.size();
      cuda::sgdMultiTensor(all ? segments_ : slice(segments_, firstSeg, lastSeg),
                           all ? stateOffsets_ : slice(stateOffsets_, firstSeg, lastSeg), buf_, lr, cfg_.weightDecay,
                           cfg_.momentum, cfg_.nesterov, first);
      return;
    }
#endif
    for (size_t i = firstSeg; i < lastSeg; ++i) {
      auto& s = segments_[i];
      sgdUpdateCpu(s.value.data<float>(), s.grad, gradScale,
                   cfg_.momentum != 0.f ? buf_.data<float>() + stateOffsets_[i] : nullptr, s.value.numel(), lr,
                   s.decay ? cfg_.weightDecay : 0.f, cfg_.momentum, cfg_.nesterov, first);
      if (s.copy.defined()) {
        Tensor copy = s.copy;
        convertInto(copy, s.value);
      }
    }
  }
  std::vector<std::pair<std::string, Tensor>> state() override {
    if (buf_.numel() == 0) return {};  // plain SGD keeps no state
    return {{"momentum_buffer", buf_}};
  }

 private:
  OptimConfig cfg_;
  Tensor buf_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments) {
  std::vector<size_t> cuts;  // where a segment's device differs from the one before it
  for (size_t i = 1; i < segments.size(); ++i)
    if (segments[i].value.device() != segments[i - 1].value.device()) cuts.push_back(i);
  if (!cuts.empty()) return std::make_unique<SplitOptimizer>(cfg, std::move(segments), cuts);
  return makeSingleOptimizer(cfg, std::move(segments));
}

std::unique_ptr<Optimizer> makeSingleOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments) {
  if (cfg.type == "adamw") return std::make_unique<AdamW>(cfg, std::move(segments));
  if (cfg.type == "sgd") return std::make_unique<Sgd>(cfg, std::move(segments));
  throw ConfigError("optim.type: unknown optimizer '" + cfg.type + "' (expected sgd or adamw)");
}

std::vector<OptimSegment> segmentsOf(ParamTable& table) {
  std::vector<OptimSegment> out;
  for (size_t i = 0; i < table.size(); ++i) {
    Param& p = table[i];
    // (no gradient between steps where gradients live per step)
    out.push_back({p.value.view({p.numel()}), p.grad.defined() ? p.grad.view({p.numel()}) : Tensor(), p.decay,
                   p.offset});
  }
  return out;
}

}  // namespace mt
