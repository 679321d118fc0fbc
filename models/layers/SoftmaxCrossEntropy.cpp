#include "models/layers/SoftmaxCrossEntropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"

namespace mt {

namespace {
inline int64_t targetAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI64 ? t.data<int64_t>()[i] : static_cast<int64_t>(t.data<int32_t>()[i]);
}
}  // namespace

LossStats& LossStats::operator+=(const LossStats& o) {
  lossSum += o.lossSum;
  correct += o.correct;
  count += o.count;
  pending.insert(pending.end(), o.pending.begin(), o.pending.end());
  return *this;
}

LossStats LossStats::resolved() const {
  LossStats s;
  s.lossSum = lossSum, s.correct = correct, s.count = count;
  for (const auto& p : pending) {
    const LossStats r = p->finish();
    s.lossSum += r.lossSum, s.correct += r.correct, s.count += r.count;
  }
  return s;
}

LossSink::LossSink(Device d, Tensor badFlag) {
  if (!d.isCpu()) {
    sums = Tensor::zeros({3}, DType::kF64, d);
    bad = badFlag.defined() ? badFlag : Tensor::zeros({1}, DType::kI32, d);
  }
}

LossStats LossSink::finish() {
  LossStats s = host;
  if (sums.defined()) {
    Tensor hb = bad.to(Device::cpu());
    if (hb.data<int32_t>()[0])
      throw DataError("a target is out of range for " + std::to_string(classes) + " classes");
    Tensor hs = sums.to(Device::cpu());
    s.lossSum += hs.data<double>()[0];
    s.correct += static_cast<int64_t>(hs.data<double>()[1]);
    s.count += static_cast<int64_t>(hs.data<double>()[2]);
  }
  return s;
}

int64_t countValidTargets(const Tensor& targets) {
  MT_CHECK(targets.device().isCpu(), "countValidTargets on ", targets.str());
  int64_t v = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) v += targetAt(targets, i) != kIgnoreIndex;
  return v;
}

LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean, int64_t validClasses, LossSink* sink) {
  const int64_t stride = logits.dim(-1), N = logits.numel() / stride;
  const int64_t C = validClasses > 0 ? validClasses : stride;
  MT_CHECK(targets.numel() == N, "cross-entropy: ", N, " rows of logits, ", targets.numel(), " targets");
  MT_CHECK(targets.dtype() == DType::kI64 || targets.dtype() == DType::kI32, "targets must be integer, got ",
           targets.str());
#ifdef MT_WITH_CUDA
  if (logits.device().isCuda())
    return cuda::softmaxCrossEntropy(logits, targets, dlogits, scale, validForMean, validClasses, sink);
#endif
  MT_CHECK(logits.device().isCpu(), "softmaxCrossEntropy on ", logits.device().str(), " without CUDA");
  for (int64_t r = 0; r < N; ++r) {
    const int64_t t = targetAt(targets, r);
    if (t != kIgnoreIndex && (t < 0 || t >= C))
      throw DataError("target " + std::to_string(t) + " out of range for " + std::to_string(C) + " classes");
  }
  const int64_t valid = validForMean >= 0 ? validForMean : countValidTargets(targets);
  const float* z = logits.data<float>();
  float* dz = dlogits ? dlogits->data<float>() : nullptr;
  const float inv = valid > 0 ? scale / static_cast<float>(valid) : 0.f;
  const int64_t blocks = (N + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> lossPart(static_cast<size_t>(blocks), 0.0);
  std::vector<int64_t> correctPart(static_cast<size_t>(blocks), 0), countPart(static_cast<size_t>(blocks), 0);
  parallelFor(blocks, 1, [&](int64_t blo, int64_t bhi) {
    for (int64_t blk = blo; blk < bhi; ++blk) {
      const int64_t r1 = std::min(N, (blk + 1) * kReduceBlock);
      for (int64_t r = blk * kReduceBlock; r < r1; ++r) {
        const float* row = z + r * stride;
        const int64_t t = targetAt(targets, r);
        float mx = -INFINITY;
        int64_t arg = 0;
        for (int64_t c = 0; c < C; ++c)
          if (row[c] > mx) mx = row[c], arg = c;
        double sum = 0.0;
        for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(row[c] - mx));
        const double logSum = std::log(sum);
        if (t == kIgnoreIndex) {
          if (dz)
            for (int64_t c = 0; c < stride; ++c) dz[r * stride + c] = 0.f;
          continue;
        }
        lossPart[static_cast<size_t>(blk)] += logSum - static_cast<double>(row[t] - mx);
        correctPart[static_cast<size_t>(blk)] += arg == t;
        countPart[static_cast<size_t>(blk)] += 1;
        if (dz) {
          for (int64_t c = 0; c < C; ++c) {
            const float p = static_cast<float>(std::exp(static_cast<double>(row[c] - mx) - logSum));
            dz[r * stride + c] = (p - (c == t ? 1.f : 0.f)) * inv;
          }
          for (int64_t c = C; c < stride; ++c) dz[r * stride + c] = 0.f;
        }
      }
    }
  });
  LossStats s;
  for (int64_t b = 0; b < blocks; ++b) {
    s.lossSum += lossPart[static_cast<size_t>(b)];
    s.correct += correctPart[static_cast<size_t>(b)];
    s.count += countPart[static_cast<size_t>(b)];
  }
  if (sink) {
    sink->host.lossSum += s.lossSum;
    sink->host.correct += s.correct;
    sink->host.count += s.count;
    return LossStats{};
  }
  return s;
}

}  // namespace mt
