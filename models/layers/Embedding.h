#pragma once
// Embedding: y[n,:] = W[idx[n], :]   (W [V, D], idx i32 or i64 of any shape; y = idx.shape + [D])
// Backward: dW[idx[n], :] += dy[n, :]  (accumulates; the CPU path splits D across threads so each
// row is summed in index order — deterministic).

#include "models/Module.h"

namespace mt {

void embeddingForward(Tensor& y, const Tensor& idx, const Tensor& w);
void embeddingBackward(Tensor& dw, const Tensor& dy, const Tensor& idx);

class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim) : v_(vocab), d_(dim) {}
  std::string kind() const override { return "embedding"; }
  void registerParams(ParamTable& table, const std::string& prefix) override;
  void initParams(Rng& rng) override;  // N(0, 1) like torch.nn.Embedding
  Tensor forward(const Tensor& idx, Context& ctx) override;
  // Returns an undefined tensor: indices have no gradient.
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::vector<Param*> params() override { return {w_}; }
  Shape outputShape(const Shape& in) const override;
  void clearCache() override { idx_ = Tensor(); }
  Param* weight() const { return w_; }

 private:
  int64_t v_, d_;
  Param* w_ = nullptr;
  Tensor idx_;
};

}  // namespace mt
