#pragma once
// Softmax cross-entropy over the last dimension, mean over valid rows (target != ignoreIndex):
//   p = softmax(z),  loss = -(1/V) sum_valid log p[target]
//   dz = scale · (p - onehot(target)) / V     (overwrites; ignored rows get 0)
// `scale` is the loss scale of mixed precision (1 in f32). Also counts argmax == target.

#include <cstdint>

#include "core/Tensor.h"

namespace mt {

struct LossStats {
  double lossSum = 0.0;  // sum over valid rows of -log p[target]
  int64_t correct = 0;
  int64_t count = 0;     // valid rows
  double meanLoss() const { return count ? lossSum / static_cast<double>(count) : 0.0; }
};

constexpr int64_t kIgnoreIndex = -100;  // PyTorch's default ignore_index

// logits [N, C] f32, targets [N] i64 or i32. dlogits may be null (evaluation). `valid` is the
// number of valid rows the mean is taken over: the local count normally, or a global count
// when a mean over several ranks or micro-batches is wanted.
// validClasses < C: only the first validClasses columns are classes (a vocabulary padded for
// alignment); the rest take no part in the softmax and get zero gradient. dlogits may alias logits.
LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean = -1, int64_t validClasses = -1);
int64_t countValidTargets(const Tensor& targets);

}  // namespace mt
