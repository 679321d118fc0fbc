#pragma once
// Softmax cross-entropy over the last dimension, mean over valid rows (target != ignoreIndex):
//   p = softmax(z),  loss = -(1/V) sum_valid log p[target]
//   dz = scale · (p - onehot(target)) / V     (overwrites; ignored rows get 0)
// `scale` is the loss scale of mixed precision (1 in f32). Also counts argmax == target.

#include <cstdint>

#include <memory>
#include <vector>

#include "core/Device.h"
#include "core/Tensor.h"

namespace mt {

class LossSink;

struct LossStats {
  double lossSum = 0.0;  // sum over valid rows of -log p[target]
  int64_t correct = 0;
  int64_t count = 0;     // valid rows
  // Sums still on the GPU (a forward under Context::deferLoss): part of these statistics until
  // resolved() reads them back (the one host synchronisation, at a log point).
  std::vector<std::shared_ptr<LossSink>> pending;
  double meanLoss() const { return count ? lossSum / static_cast<double>(count) : 0.0; }
  LossStats& operator+=(const LossStats& o);
  LossStats resolved() const;  // these statistics with every pending sum read back
};

constexpr int64_t kIgnoreIndex = -100;  // PyTorch's default ignore_index

// The statistics of several softmaxCrossEntropy calls (the chunks of one batch) summed where they
// are computed and read back once: on the GPU one host synchronisation per batch, not per chunk.
// An out-of-range target found in any chunk is raised by finish().
class LossSink {
 public:
  // badFlag (optional, i32 [1] on d): a flag of the caller's that stays set across batches, so an
  // out-of-range target in a batch whose statistics are never read is still raised at the next
  // finish() of any batch.
  explicit LossSink(Device d, Tensor badFlag = Tensor());
  LossStats finish();

  // Filled by softmaxCrossEntropy: device sums (f64 loss, correct, count) and the bad-target flag
  // (i32) on the GPU; host sums on the CPU.
  Tensor sums, bad;
  LossStats host;
  int64_t classes = 0;
};

// logits [N, C] f32, targets [N] i64 or i32. dlogits may be null (evaluation). `valid` is the
// number of valid rows the mean is taken over: the local count normally, or a global count
// when a mean over several ranks or micro-batches is wanted.
// validClasses < C: only the first validClasses columns are classes (a vocabulary padded for
// alignment); the rest take no part in the softmax and get zero gradient. dlogits may alias logits.
// sink: the statistics are added to it (read with sink->finish()) and the returned ones are zero.
LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean = -1, int64_t validClasses = -1, LossSink* sink = nullptr);
int64_t countValidTargets(const Tensor& targets);

}  // namespace mt
