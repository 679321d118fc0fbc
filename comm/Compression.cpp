// The compression hooks of comm/Compression.h (which states the math).

#include "comm/Compression.h"

#include <algorithm>
#include <cmath>

#include "comm/CompressionOps.h"
#include "core/Random.h"
#include "core/Timer.h"

namespace mt {

const EnumTable<CompressionMethod>& compressionMethods() {
  static const EnumTable<CompressionMethod> kTable = {
      {CompressionMethod::kNone, "none"}, {CompressionMethod::kFp16, "fp16"},   {CompressionMethod::kBf16, "bf16"},
      {CompressionMethod::kPowerSgd, "powersgd"}, {CompressionMethod::kTopK, "topk"},
  };
  return kTable;
}

CompressionMethod parseCompressionMethod(const std::string& name) {
  CompressionMethod m;
  if (!parseEnum(compressionMethods(), name, &m))
    throw ConfigError("unknown compression method '" + name + "' (none, fp16, bf16, powersgd, topk)");
  return m;
}

const char* compressionMethodName(CompressionMethod m) { return enumName(compressionMethods(), m); }

namespace {

template <typename T>
T& slot(std::vector<T>& v, int index) {
  if (v.size() <= static_cast<size_t>(index)) v.resize(static_cast<size_t>(index) + 1);
  return v[static_cast<size_t>(index)];
}

void requireF32(const Tensor& grads, const std::string& who) {
  if (grads.dtype() != DType::kF32)
    throw ConfigError(who + " compression needs f32 gradients, this model's are " + dtypeName(grads.dtype()));
}

float* f32(Tensor& t, int64_t offset) {
  return t.data<float>() + offset;
}

}  // namespace

// ---- fp16 / bf16 ----

CastReducer::CastReducer(Communicator& comm, DType wire) : comm_(comm), wire_(wire) {
  MT_CHECK(wire == DType::kF16 || wire == DType::kBF16, "cast compression to ", dtypeName(wire));
}

std::string CastReducer::name() const {
  return wire_ == DType::kF16 ? "fp16" : "bf16";
}

void CastReducer::launch(const Bucket& bucket, Tensor grads) {
  requireF32(grads, name());
  Stopwatch sw;
  Tensor& buf = slot(buffers_, bucket.index);
  if (!buf.defined() || buf.numel() != grads.numel() || buf.device() != grads.device())
    buf = Tensor::empty({grads.numel()}, wire_, grads.device());
  scaleTensor(grads, 1.f / static_cast<float>(comm_.size()));
  convertInto(buf, grads);
  stats_.seconds += sw.elapsed();
  setWork(bucket.index, comm_.allReduce(buf, ReduceOp::kSum));
  stats_.bytesBefore += static_cast<int64_t>(grads.nbytes());
  stats_.bytesAfter += static_cast<int64_t>(buf.nbytes());
}

void CastReducer::wait(const Bucket& bucket, Tensor grads) {
  lastWork(bucket.index)->wait(comm_.timeout());
  Stopwatch sw;
  convertInto(grads, buffers_[static_cast<size_t>(bucket.index)]);
  stats_.seconds += sw.elapsed();
}

// ---- shared by PowerSGD and top-k ----

FeedbackReducer::FeedbackReducer(Communicator& comm, ParamTable& table, CompressionOptions options)
    : comm_(comm), table_(table), opt_(options) {
  MT_CHECK(table.materialized(), "compression over a table that is not materialized");
}

Tensor FeedbackReducer::error(int param) const {
  auto it = errors_.find(param);
  return it == errors_.end() ? Tensor() : it->second;
}

Tensor& FeedbackReducer::errorFor(int param) {
  Tensor& e = errors_[param];
  if (!e.defined()) {
    const Param& p = table_[static_cast<size_t>(param)];
    e = Tensor::zeros({p.numel()}, DType::kF32, table_.device());
  }
  return e;
}

int FeedbackReducer::paramIndex(const std::string& name) const {
  for (size_t i = 0; i < table_.size(); ++i)
    if (table_[i].name == name) return static_cast<int>(i);
  return -1;
}

bool FeedbackReducer::restoreInto(Tensor& slot, int param, const Tensor& value, int64_t numel,
                                  const Shape& shape) const {
  if (param < 0 || value.dtype() != DType::kF32 || value.numel() != numel) return false;
  slot = Tensor::empty(shape, DType::kF32, table_.device());
  slot.copyFrom(value.view(shape));
  return true;
}

std::vector<std::pair<std::string, Tensor>> FeedbackReducer::checkpointState() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& kv : errors_)
    out.emplace_back("error/" + table_[static_cast<size_t>(kv.first)].name, kv.second.to(Device::cpu()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool FeedbackReducer::restoreCheckpointState(const std::string& name, const Tensor& value) {
  if (name.rfind("error/", 0) != 0 || !opt_.errorFeedback) return false;
  const int pi = paramIndex(name.substr(6));
  if (pi < 0) return false;
  const int64_t n = table_[static_cast<size_t>(pi)].numel();
  Tensor restored;
  if (!restoreInto(restored, pi, value, n, {n})) return false;
  errors_[pi] = restored;
  return true;
}

void FeedbackReducer::launchPlain(const Bucket& bucket, Tensor grads) {
  slot(plain_, bucket.index) = 1;
  setWork(bucket.index, comm_.allReduce(grads, ReduceOp::kAvg));
  stats_.bytesBefore += static_cast<int64_t>(grads.nbytes());
  stats_.bytesAfter += static_cast<int64_t>(grads.nbytes());
}

bool FeedbackReducer::waitPlain(const Bucket& bucket) {
  char& plain = slot(plain_, bucket.index);
  if (!plain) return false;
  plain = 0;
  lastWork(bucket.index)->wait(comm_.timeout());
  return true;
}

// ---- PowerSGD ----

PowerSgdReducer::PowerSgdReducer(Communicator& comm, ParamTable& table, CompressionOptions options)
    : FeedbackReducer(comm, table, options) {
  if (opt_.rank < 1)
    throw ConfigError("compression.rank must be at least 1, got " + std::to_string(opt_.rank));
}

PowerSgdReducer::Plan PowerSgdReducer::plan(const Bucket& bucket) const {
  Plan pl;
  for (int pi : bucket.params) {
    const Param& p = table_[static_cast<size_t>(pi)];
    bool compress = false;
    Matrix m;
    if (p.shape.size() >= 2 && p.numel() > 0) {
      m.param = pi;
      m.rows = p.shape[0];
      m.cols = p.numel() / m.rows;
      m.rank = std::min<int64_t>({opt_.rank, m.rows, m.cols});
      compress = static_cast<double>((m.rows + m.cols) * m.rank) * opt_.minCompressionRate <
                 static_cast<double>(m.rows * m.cols);
    }
    if (compress) {
      m.pOffset = pl.pNumel;
      m.qOffset = pl.qNumel;
      pl.pNumel += m.rows * m.rank;
      pl.qNumel += m.cols * m.rank;
      pl.matrices.push_back(m);
    } else {
      pl.dense.push_back(pi);
      pl.denseNumel += p.numel();
    }
  }
  return pl;
}

Tensor& PowerSgdReducer::qFor(const Matrix& m) {
  Tensor& q = q_[m.param];
  if (q.defined() && opt_.warmStart) return q;
  // The same random start on every rank: it depends on the seed, the parameter and (without
  // warm start) the step only.
  Tensor host = Tensor::empty({m.cols, m.rank}, DType::kF32);
  Rng rng(opt_.seed ^ 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(opt_.warmStart ? 0 : step_ + 1),
          0x50534744ull + static_cast<uint64_t>(m.param));
  float* h = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i)
    h[i] = rng.normal();
  orthonormalizeColumns(h, m.cols, m.rank, Device::cpu());
  q = host.to(table_.device());
  return q;
}

std::vector<std::pair<std::string, Tensor>> PowerSgdReducer::checkpointState() const {
  auto out = FeedbackReducer::checkpointState();
  if (!opt_.warmStart) return out;  // Q is drawn afresh every step then
  std::vector<std::pair<std::string, Tensor>> qs;
  for (const auto& kv : q_)
    qs.emplace_back("q/" + table_[static_cast<size_t>(kv.first)].name, kv.second.to(Device::cpu()));
  std::sort(qs.begin(), qs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out.insert(out.end(), qs.begin(), qs.end());
  return out;
}

bool PowerSgdReducer::restoreCheckpointState(const std::string& name, const Tensor& value) {
  if (name.rfind("q/", 0) != 0) return FeedbackReducer::restoreCheckpointState(name, value);
  const int pi = paramIndex(name.substr(2));
  if (pi < 0 || !opt_.warmStart) return false;
  const Param& p = table_[static_cast<size_t>(pi)];
  if (p.shape.size() < 2 || p.numel() == 0) return false;
  // Q's shape under this run's compression.rank: another rank starts Q afresh.
  const int64_t rows = p.shape[0], cols = p.numel() / rows, rank = std::min<int64_t>({opt_.rank, rows, cols});
  return restoreInto(q_[pi], pi, value, cols * rank, {cols, rank});
}

void PowerSgdReducer::launch(const Bucket& bucket, Tensor grads) {
  requireF32(grads, "powersgd");
  if (!compressing()) {
    launchPlain(bucket, grads);
    return;
  }
  Stopwatch sw;
  const Device dev = grads.device();
  Pending& pd = slot(pending_, bucket.index);
  pd = Pending();
  pd.plan = plan(bucket);
  const Plan& pl = pd.plan;
  if (pl.denseNumel > 0) {
    pd.dense = Tensor::empty({pl.denseNumel}, DType::kF32, dev);
    int64_t off = 0;
    for (int pi : pl.dense) {
      Tensor g = paramGrad(pi);
      pd.dense.flatSlice(off, g.numel()).copyFrom(g.flat());
      off += g.numel();
    }
  }
  if (pl.pNumel > 0) pd.P = Tensor::empty({pl.pNumel}, DType::kF32, dev);
  for (const Matrix& m : pl.matrices) {
    Tensor g = paramGrad(m.param).flat();
    if (opt_.errorFeedback) addInto(g, errorFor(m.param));
    Tensor& q = qFor(m);
    matmulF32(Trans::kNo, Trans::kNo, m.rows, m.rank, m.cols, g.data<float>(), q.data<float>(), 0.f,
              f32(pd.P, m.pOffset), dev);
  }
  stats_.seconds += sw.elapsed();
  if (pl.denseNumel > 0) pd.denseWork = comm_.allReduce(pd.dense, ReduceOp::kAvg);
  if (pl.pNumel > 0) pd.pWork = comm_.allReduce(pd.P, ReduceOp::kAvg);
  setWork(bucket.index, pd.pWork ? pd.pWork : pd.denseWork);
  stats_.bytesBefore += static_cast<int64_t>(grads.nbytes());
  stats_.bytesAfter += (pl.pNumel + pl.qNumel + pl.denseNumel) * 4;
}

void PowerSgdReducer::wait(const Bucket& bucket, Tensor grads) {
  if (waitPlain(bucket)) return;
  Pending& pd = pending_.at(static_cast<size_t>(bucket.index));
  const Plan& pl = pd.plan;
  const Device dev = grads.device();
  if (pd.denseWork) {
    pd.denseWork->wait(comm_.timeout());
    int64_t off = 0;
    for (int pi : pl.dense) {
      Tensor g = paramGrad(pi).flat();
      g.copyFrom(pd.dense.flatSlice(off, g.numel()));
      off += g.numel();
    }
  }
  if (pd.pWork) {
    pd.pWork->wait(comm_.timeout());
    Stopwatch sw;
    pd.Q = Tensor::empty({pl.qNumel}, DType::kF32, dev);
    for (const Matrix& m : pl.matrices) {
      orthonormalizeColumns(f32(pd.P, m.pOffset), m.rows, m.rank, dev);
      const Tensor g = paramGrad(m.param);
      matmulF32(Trans::kYes, Trans::kNo, m.cols, m.rank, m.rows, g.data<float>(), f32(pd.P, m.pOffset), 0.f,
                f32(pd.Q, m.qOffset), dev);
    }
    stats_.seconds += sw.elapsed();
    auto qWork = comm_.allReduce(pd.Q, ReduceOp::kAvg);
    setWork(bucket.index, qWork);
    qWork->wait(comm_.timeout());
    sw.reset();
    for (const Matrix& m : pl.matrices) {
      Tensor g = paramGrad(m.param).flat();
      Tensor* e = nullptr;
      if (opt_.errorFeedback) {
        e = &errorFor(m.param);
        e->copyFrom(g);  // M, before it is replaced by its approximation
      }
      matmulF32(Trans::kNo, Trans::kYes, m.rows, m.cols, m.rank, f32(pd.P, m.pOffset), f32(pd.Q, m.qOffset),
                0.f, g.data<float>(), dev);
      if (e) subtractFrom(*e, g);
      q_[m.param].copyFrom(pd.Q.flatSlice(m.qOffset, m.cols * m.rank));
    }
    stats_.seconds += sw.elapsed();
  }
  pd = Pending();
}

// ---- top-k ----

TopKReducer::TopKReducer(Communicator& comm, ParamTable& table, CompressionOptions options)
    : FeedbackReducer(comm, table, options) {
  if (!(opt_.topkFraction > 0.0 && opt_.topkFraction <= 1.0))
    throw ConfigError("compression.topk_fraction must be in (0, 1], got " +
                      std::to_string(opt_.topkFraction));
  if (opt_.topkWarmupSteps < 0)
    throw ConfigError("compression.topk_warmup_steps must be >= 0, got " +
                      std::to_string(opt_.topkWarmupSteps));
}

double TopKReducer::fraction() const {
  const int64_t into = step_ - opt_.startIter;  // steps since compression started
  if (opt_.topkWarmupSteps <= 0 || into >= opt_.topkWarmupSteps) return opt_.topkFraction;
  // fraction^t for t from 1/W to 1: geometric, identical on every rank (it depends on the step only).
  const double t =
      static_cast<double>(std::max<int64_t>(into, 0) + 1) / static_cast<double>(opt_.topkWarmupSteps + 1);
  return std::pow(opt_.topkFraction, t);
}

int64_t TopKReducer::kFor(int64_t numel) const {
  const auto k = static_cast<int64_t>(std::ceil(fraction() * static_cast<double>(numel)));
  return std::clamp<int64_t>(k, numel > 0 ? 1 : 0, numel);
}

int64_t TopKReducer::kFor(const Bucket& bucket) const {
  return kFor(bucket.numel);
}

void TopKReducer::launch(const Bucket& bucket, Tensor grads) {
  requireF32(grads, "topk");
  if (!compressing()) {
    launchPlain(bucket, grads);
    return;
  }
  Stopwatch sw;
  const Device dev = grads.device();
  if (opt_.errorFeedback) {
    for (int pi : bucket.params) {
      Tensor g = paramGrad(pi).flat();
      addInto(g, errorFor(pi));
    }
  }
  // One selection over the whole bucket: measured better than a share per parameter (which
  // sends the small gradients of norms and biases at the expense of the large ones).
  const int64_t k = kFor(bucket);
  const int W = comm_.size();
  Pending& pd = slot(pending_, bucket.index);
  pd.idx = Tensor::empty({k}, DType::kI32, dev);
  pd.val = Tensor::empty({k}, DType::kF32, dev);
  topkByMagnitude(grads, k, pd.idx, pd.val);
  if (opt_.errorFeedback) {
    // What stays behind: M with the sent entries removed (the bucket is overwritten in wait()).
    scatterZero(grads, pd.idx);
    for (int pi : bucket.params)
      errorFor(pi).copyFrom(paramGrad(pi).flat());
  }
  pd.allIdx = Tensor::empty({k * W}, DType::kI32, dev);
  pd.allVal = Tensor::empty({k * W}, DType::kF32, dev);
  stats_.seconds += sw.elapsed();
  pd.idxWork = comm_.allGather(pd.idx, pd.allIdx);
  pd.valWork = comm_.allGather(pd.val, pd.allVal);
  setWork(bucket.index, pd.valWork);
  stats_.bytesBefore += static_cast<int64_t>(grads.nbytes());
  stats_.bytesAfter += k * 8;
}

void TopKReducer::wait(const Bucket& bucket, Tensor grads) {
  if (waitPlain(bucket)) return;
  Pending& pd = pending_.at(static_cast<size_t>(bucket.index));
  pd.idxWork->wait(comm_.timeout());
  pd.valWork->wait(comm_.timeout());
  Stopwatch sw;
  const int W = comm_.size();
  const int64_t k = pd.idx.numel();
  grads.zero_();
  // Rank by rank (indices are unique within one rank's set): no atomics, identical on all ranks.
  for (int r = 0; r < W; ++r)
    scatterAdd(grads, pd.allIdx.flatSlice(r * k, k), pd.allVal.flatSlice(r * k, k),
               1.f / static_cast<float>(W));
  stats_.seconds += sw.elapsed();
  pd = Pending();
}

std::unique_ptr<BucketReducer> makeBucketReducer(const CompressionOptions& o, Communicator& comm,
                                                 ParamTable& table) {
  switch (o.method) {
    case CompressionMethod::kNone:
      return std::make_unique<AllReduceReducer>(comm);
    case CompressionMethod::kFp16:
      return std::make_unique<CastReducer>(comm, DType::kF16);
    case CompressionMethod::kBf16:
      return std::make_unique<CastReducer>(comm, DType::kBF16);
    case CompressionMethod::kPowerSgd:
      return std::make_unique<PowerSgdReducer>(comm, table, o);
    case CompressionMethod::kTopK:
      return std::make_unique<TopKReducer>(comm, table, o);
  }
  return nullptr;
}

}  // namespace mt
