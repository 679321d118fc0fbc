#pragma once
// Gradient compression for data parallelism: BucketReducers that send less than the f32 bucket.
//
//   fp16 / bf16  g <- cast_f32(allreduce_sum(cast_half(g / N))). 2x fewer bytes; dividing before
//                the cast keeps the sum of N ranks in range (as PyTorch's fp16_compress_hook).
//   powersgd     Vogels et al. 2019, rank r, as PyTorch's powerSGD_hook: each matrix-shaped
//                gradient (reshaped [shape0, numel/shape0]) with M = g + e (error feedback):
//                P = M Q; P <- allreduce_avg(P); P <- orthonormalize(P); Q = M^T P;
//                Q <- allreduce_avg(Q); g <- P Q^T; e <- M - P Q^T (the local M minus the
//                approximation of the average, as in the paper's and PyTorch's code; the e of
//                all ranks sum to what compression lost). Q is kept for the next step (warm start). Vectors
//                and matrices where (m+n) r * min_compression_rate >= m n are all-reduced uncompressed in one
//                packed buffer beside P.
//   topk         per bucket, M = g + e: the k = ceil(fraction * numel) entries largest in
//                magnitude are all-gathered as (index, value) from every rank;
//                g <- (1/N) sum_ranks scatter(index, value); e <- M with the sent entries zeroed.
//                Sparsity warm-up (Lin et al. 2018, DGC): over topk_warmup_steps after start_iter
//                the fraction falls geometrically from 1 to the target, so the error feedback never
//                has to carry the large early gradients at full sparsity.
//
// Error feedback keeps, per parameter, what the compressed gradient left out and adds it to the
// next step's gradient, so nothing is lost, only delayed. The first start_iter steps use the plain
// all-reduce (early gradients change fast, compression would slow convergence most then). All
// ranks take identical decisions (shapes, ranks, k and the random start of Q depend only on the
// configuration), so they issue identical collectives. Compression state (e per rank, Q) goes into
// checkpoints (checkpointState: "error/<param>", "q/<param>"), so a resumed run continues as the
// uninterrupted one would; launch/Checkpoint restarts e from zero when the world size changed.

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/EnumTable.h"
#include "comm/BucketReducer.h"
#include "core/ParamTable.h"

namespace mt {

enum class CompressionMethod { kNone, kFp16, kBf16, kPowerSgd, kTopK };

struct CompressionOptions {
  CompressionMethod method = CompressionMethod::kNone;
  int rank = 4;                     // powersgd: approximation rank
  int64_t startIter = 10;           // steps of plain all-reduce before compressing (powersgd, topk)
  double minCompressionRate = 2.0;  // powersgd: compress a matrix only when it saves this factor
  bool warmStart = true;            // powersgd: reuse last step's Q
  bool errorFeedback = true;        // powersgd, topk
  double topkFraction = 0.01;       // topk: fraction of each bucket's entries sent
  int64_t topkWarmupSteps = 0;      // topk: steps over which the fraction falls from 1 to topkFraction
  uint64_t seed = 0;                // powersgd: Q's random start
};

// none, fp16, bf16, powersgd, topk; anything else throws ConfigError.
const EnumTable<CompressionMethod>& compressionMethods();
CompressionMethod parseCompressionMethod(const std::string& name);
const char* compressionMethodName(CompressionMethod m);

// Casts to a 16-bit type around the all-reduce.
class CastReducer final : public BucketReducer {
 public:
  CastReducer(Communicator& comm, DType wire);
  std::string name() const override;
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;

 private:
  Communicator& comm_;
  DType wire_;
  std::vector<Tensor> buffers_;
};

// Base of the error-feedback compressors: plain all-reduce for the first start_iter steps,
// per-parameter error buffers, statistics.
class FeedbackReducer : public BucketReducer {
 public:
  FeedbackReducer(Communicator& comm, ParamTable& table, CompressionOptions options);
  void beginStep(int64_t step) override { step_ = step; }
  // The error-feedback residual of a parameter (undefined until it was first compressed).
  Tensor error(int param) const;
  std::vector<std::pair<std::string, Tensor>> checkpointState() const override;
  bool restoreCheckpointState(const std::string& name, const Tensor& value) override;

 protected:
  bool compressing() const { return step_ >= opt_.startIter; }
  Tensor& errorFor(int param);  // allocated (zeros) on first use
  void launchPlain(const Bucket& bucket, Tensor grads);
  bool waitPlain(const Bucket& bucket);  // true when the bucket went uncompressed
  Tensor paramGrad(int param) const { return table_[static_cast<size_t>(param)].grad; }
  // The index of parameter `name`, or -1.
  int paramIndex(const std::string& name) const;
  // Puts `value` into `slot` (allocated like the parameter's gradient) when it has `numel` elements.
  bool restoreInto(Tensor& slot, int param, const Tensor& value, int64_t numel, const Shape& shape) const;

  Communicator& comm_;
  ParamTable& table_;
  CompressionOptions opt_;
  int64_t step_ = 0;

 private:
  std::unordered_map<int, Tensor> errors_;
  std::vector<char> plain_;  // per bucket: went uncompressed this step
};

class PowerSgdReducer final : public FeedbackReducer {
 public:
  PowerSgdReducer(Communicator& comm, ParamTable& table, CompressionOptions options);
  std::string name() const override { return "powersgd"; }
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;
  std::vector<std::pair<std::string, Tensor>> checkpointState() const override;
  bool restoreCheckpointState(const std::string& name, const Tensor& value) override;

  struct Matrix {
    int param = 0;
    int64_t rows = 0, cols = 0, rank = 0;
    int64_t pOffset = 0, qOffset = 0;  // in the bucket's packed P and Q buffers
  };
  // How a bucket's parameters are treated: compressed matrices and the packed uncompressed rest.
  struct Plan {
    std::vector<Matrix> matrices;
    std::vector<int> dense;
    int64_t pNumel = 0, qNumel = 0, denseNumel = 0;
  };
  Plan plan(const Bucket& bucket) const;

 private:
  struct Pending {
    Plan plan;
    Tensor P, Q, dense;
    std::shared_ptr<Work> pWork, denseWork;
  };
  Tensor& qFor(const Matrix& m);
  std::unordered_map<int, Tensor> q_;  // per parameter: [cols, rank], warm start
  std::vector<Pending> pending_;
};

class TopKReducer final : public FeedbackReducer {
 public:
  TopKReducer(Communicator& comm, ParamTable& table, CompressionOptions options);
  std::string name() const override { return "topk"; }
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;
  double fraction() const;                   // of the current step (sparsity warm-up)
  int64_t kFor(int64_t numel) const;         // entries sent of a tensor of numel at the current step
  int64_t kFor(const Bucket& bucket) const;  // of a bucket

 private:
  struct Pending {
    Tensor idx, val, allIdx, allVal;
    std::shared_ptr<Work> idxWork, valWork;
  };
  std::vector<Pending> pending_;
};

// The reducer for a method (none: the plain averaging all-reduce).
std::unique_ptr<BucketReducer> makeBucketReducer(const CompressionOptions& options, Communicator& comm,
                                                 ParamTable& table);

}  // namespace mt
