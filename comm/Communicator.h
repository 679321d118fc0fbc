#pragma once
// The Communicator: collectives and point-to-point over raw buffers (pointer, count, dtype, device),
// each returning an asynchronous Work.
//
// THE CONTRACT: all ranks of a communicator issue the same collectives in the same order, with the
// same count, dtype, reduce op and root. Nothing in the fast path checks this — a rank that
// deviates makes the others hang until the timeout or reduces garbage. With MT_DEBUG_FINGERPRINT=1
// (or dist.fingerprint = true) every collective is preceded by a check that all ranks agree on
// (op, count, dtype, root), and a mismatch is an error naming both sides.
//
// Ops on one communicator start in issue order. Buffers must stay alive and untouched until the
// Work completes. Device buffers are accepted by every backend (the MPI backend stages them
// through pinned host memory).

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/CommTuning.h"
#include "comm/FaultInjection.h"
#include "comm/Work.h"
#include "core/Device.h"
#include "core/Tensor.h"

namespace mt {

struct CommOptions {
  std::string name = "world";
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  bool fingerprint = false;  // check op agreement before every collective (debug)
  CommTuning tuning;         // NCCL's per-communicator config (other backends ignore it)
};

class Communicator {
 public:
  explicit Communicator(CommOptions options)
      : options_(std::move(options)), faults_(FaultPlan::fromEnvironment()) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual const char* backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual std::shared_ptr<Work> allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) = 0;
  // in holds size() * countPerRank elements; rank r receives the reduction of block r into out.
  virtual std::shared_ptr<Work> reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype,
                                              ReduceOp op, Device device) = 0;
  // out holds size() * countPerRank elements, block r from rank r.
  virtual std::shared_ptr<Work> allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                          Device device) = 0;
  virtual std::shared_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Device device) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;
  // Point-to-point. On NCCL each is its own kernel on the communicator's stream, so two ranks
  // exchanging data must order their sends and receives alike (one sends first while the other
  // receives), or both wait in their sends.
  virtual std::shared_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, Device device) = 0;
  virtual std::shared_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, Device device) = 0;
  // Collective over this communicator: ranks passing the same color form a new communicator,
  // ranked by key (then by rank here), with `options` (name, timeout, tuning). color < 0: this rank
  // joins none (returns nullptr).
  virtual std::unique_ptr<Communicator> split(int color, int key, CommOptions options) = 0;
  // The same with this communicator's options (tuning included, as NCCL's split inherits its
  // parent's config) under another name.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) {
    CommOptions o = options_;
    o.name = name;
    return split(color, key, std::move(o));
  }
  // Fails queued and future ops with PeerLostError(reason); in-flight ops fail when they can.
  virtual void abort(const std::string& reason) = 0;

  // Tensor conveniences (contiguous tensors).
  std::shared_ptr<Work> allReduce(Tensor& t, ReduceOp op);
  std::shared_ptr<Work> reduceScatter(const Tensor& in, Tensor& out, ReduceOp op);
  std::shared_ptr<Work> allGather(const Tensor& in, Tensor& out);
  std::shared_ptr<Work> broadcast(Tensor& t, int root);
  // Chained ops: the op starts once `after` (an op of another communicator of the same backend,
  // e.g. the previous phase of a hierarchical reduction) has completed, and the caller does not
  // wait for it (MPI: this communicator's progress thread waits; NCCL: its stream waits on the
  // op's event). A null `after` is the plain op.
  std::shared_ptr<Work> allReduce(Tensor& t, ReduceOp op, const std::shared_ptr<Work>& after);
  std::shared_ptr<Work> allGather(const Tensor& in, Tensor& out, const std::shared_ptr<Work>& after);
  // Blocking helpers with the communicator's timeout.
  void allReduceSync(Tensor& t, ReduceOp op);
  double allReduceScalar(double v, ReduceOp op);
  void barrierSync();

  const CommOptions& options() const { return options_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  void setTimeout(std::chrono::milliseconds t) { options_.timeout = t; }
  const std::string& name() const { return options_.name; }
  // The last ops of this communicator, oldest first (failure dumps).
  std::vector<CollectiveRecord> recentOps();
  int64_t opsIssued();

 protected:
  // Issues one op of this communicator (`issue`) ordered after `dep`. The default waits for dep on
  // the host first: right for backends whose ops complete when issued (local).
  virtual std::shared_ptr<Work> issueAfter(const std::shared_ptr<Work>& dep,
                                           const std::function<std::shared_ptr<Work>()>& issue);
  // For backends that order a chained op themselves (MPI, NCCL): their issueAfter() is this, which
  // runs `issue` with `dep` pending for the calling thread, and the backend takes it
  // (takePendingAfter) where `issue` creates the op.
  std::shared_ptr<Work> issueWithPendingAfter(const std::shared_ptr<Work>& dep,
                                              const std::function<std::shared_ptr<Work>()>& issue);
  static std::shared_ptr<Work> takePendingAfter();
  // The fault MT_TEST_FAULT injects into this rank's op `seq` (testing only; see FaultInjection.h).
  InjectedFault faultFor(int64_t seq) const { return faults_.at(options_.name, rank(), seq); }
  // Backends call this for every op they create, in issue order (W: the backend's Work type).
  template <typename W = Work>
  std::shared_ptr<W> newWork(CollectiveOp op, size_t bytes, DType dtype) {
    std::lock_guard<std::mutex> lock(historyMutex_);
    auto w = std::make_shared<W>(nextSeq_++, op, bytes, dtype, options_.name);
    history_.push_back(w);
    if (history_.size() > kHistory) history_.pop_front();
    return w;
  }

 private:
  static constexpr size_t kHistory = 32;
  CommOptions options_;
  FaultPlan faults_;
  std::mutex historyMutex_;
  std::deque<std::shared_ptr<Work>> history_;
  int64_t nextSeq_ = 0;
};

// World size 1: collectives complete at once (in place or a copy).
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(CommOptions options = {}) : Communicator(std::move(options)) {}
  // The Tensor conveniences of the base class stay visible next to the overrides.
  using Communicator::allGather;
  using Communicator::allReduce;
  using Communicator::broadcast;
  using Communicator::reduceScatter;
  using Communicator::split;
  const char* backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<Work> allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) override;
  std::shared_ptr<Work> reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype, ReduceOp op,
                                      Device device) override;
  std::shared_ptr<Work> allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                  Device device) override;
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Device device) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, Device device) override;
  std::shared_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, Device device) override;
  std::unique_ptr<Communicator> split(int color, int key, CommOptions options) override;
  void abort(const std::string& reason) override {}

 private:
  std::shared_ptr<Work> done(CollectiveOp op, size_t bytes, DType dtype);
};

}  // namespace mt
