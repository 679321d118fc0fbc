// Collectives of the MPI backend on 2 and 4 ranks: every op, dtype and reduce op; ordering of
// point-to-point; sub-communicators; timeouts; the fingerprint check.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm/MpiCommunicator.h"

namespace mt {
namespace {

using std::chrono::milliseconds;

class Collectives : public ::testing::Test {
 protected:
  void SetUp() override {
    CommOptions o;
    o.name = "test";
    o.timeout = std::chrono::seconds(60);
    comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, o);
    r_ = comm_->rank();
    n_ = comm_->size();
  }
  std::unique_ptr<MpiCommunicator> comm_;
  int r_ = 0, n_ = 1;
};

TEST_F(Collectives, AllReduceEveryDtypeAndOp) {
  const int64_t N = 1000;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    // f32 / f64 / i32 / i64: element i on rank r is (r + 1) * (i % 7)
    Tensor f = Tensor::empty({N}, DType::kF32), d = Tensor::empty({N}, DType::kF64);
    Tensor i32 = Tensor::empty({N}, DType::kI32), i64 = Tensor::empty({N}, DType::kI64);
    Tensor bf = Tensor::empty({N}, DType::kBF16), hf = Tensor::empty({N}, DType::kF16);
    for (int64_t i = 0; i < N; ++i) {
      const int v = (r_ + 1) * static_cast<int>(i % 7);
      f.data<float>()[i] = static_cast<float>(v);
      d.data<double>()[i] = v;
      i32.data<int32_t>()[i] = v;
      i64.data<int64_t>()[i] = v;
      bf.data<BFloat16>()[i] = BFloat16(static_cast<float>(v));
      hf.data<Float16>()[i] = Float16(static_cast<float>(v));
    }
    std::vector<std::shared_ptr<Work>> works;
    for (Tensor* t : {&f, &d, &i32, &i64, &bf, &hf}) works.push_back(comm_->allReduce(*t, op));
    for (auto& w : works) w->wait(comm_->timeout());
    const int sumRanks = n_ * (n_ + 1) / 2;
    for (int64_t i = 0; i < N; ++i) {
      const int base = static_cast<int>(i % 7);
      double expect = op == ReduceOp::kSum   ? sumRanks * base
                      : op == ReduceOp::kAvg ? sumRanks * base / static_cast<double>(n_)
                      : op == ReduceOp::kMax ? n_ * base
                                             : base;
      ASSERT_FLOAT_EQ(f.data<float>()[i], static_cast<float>(expect)) << reduceOpName(op);
      ASSERT_DOUBLE_EQ(d.data<double>()[i], expect);
      if (op != ReduceOp::kAvg) {
        ASSERT_EQ(i32.data<int32_t>()[i], static_cast<int32_t>(expect));
        ASSERT_EQ(i64.data<int64_t>()[i], static_cast<int64_t>(expect));
      }
      ASSERT_NEAR(static_cast<float>(bf.data<BFloat16>()[i]), expect, std::fabs(expect) * 0.01 + 1e-6);
      ASSERT_NEAR(static_cast<float>(hf.data<Float16>()[i]), expect, std::fabs(expect) * 0.002 + 1e-6);
    }
  }
}

TEST_F(Collectives, ReduceScatterAllGatherBroadcast) {
  const int64_t per = 333;
  Tensor in = Tensor::empty({per * n_}, DType::kF32), out = Tensor::empty({per}, DType::kF32);
  for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = static_cast<float>(i + r_);
  comm_->reduceScatter(in, out, ReduceOp::kSum)->wait(comm_->timeout());
  for (int64_t i = 0; i < per; ++i) {
    const int64_t g = r_ * per + i;
    ASSERT_FLOAT_EQ(out.data<float>()[i], static_cast<float>(n_ * g + n_ * (n_ - 1) / 2));
  }
  Tensor mine = Tensor::empty({per}, DType::kI64), all = Tensor::empty({per * n_}, DType::kI64);
  for (int64_t i = 0; i < per; ++i) mine.data<int64_t>()[i] = r_ * 1000 + i;
  comm_->allGather(mine, all)->wait(comm_->timeout());
  for (int rr = 0; rr < n_; ++rr)
    for (int64_t i = 0; i < per; ++i) ASSERT_EQ(all.data<int64_t>()[rr * per + i], rr * 1000 + i);
  Tensor b = Tensor::empty({5}, DType::kF32);
  b.fill_(static_cast<float>(r_));
  const int root = n_ - 1;
  comm_->broadcast(b, root)->wait(comm_->timeout());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.data<float>()[i], static_cast<float>(root));
  comm_->barrierSync();
  EXPECT_DOUBLE_EQ(comm_->allReduceScalar(r_ + 0.25, ReduceOp::kSum), n_ * (n_ - 1) / 2.0 + 0.25 * n_);
}

TEST_F(Collectives, SendRecvInAnyOrderDoesNotDeadlock) {
  // Everyone sends to the right first, then receives from the left: with large messages a
  // serialised backend would deadlock here.
  const int64_t N = 1 << 20;
  Tensor s = Tensor::empty({N}, DType::kF32), rcv = Tensor::empty({N}, DType::kF32);
  s.fill_(static_cast<float>(r_));
  auto sw = comm_->send(s.rawData(), N, DType::kF32, (r_ + 1) % n_, Device::cpu());
  auto rw = comm_->recv(rcv.rawData(), N, DType::kF32, (r_ + n_ - 1) % n_, Device::cpu());
  rw->wait(comm_->timeout());
  sw->wait(comm_->timeout());
  EXPECT_EQ(rcv.data<float>()[N - 1], static_cast<float>((r_ + n_ - 1) % n_));
}

TEST_F(Collectives, SequenceNumbersAndHistory) {
  const int64_t before = comm_->opsIssued();
  Tensor t = Tensor::zeros({10}, DType::kF32);
  auto w1 = comm_->allReduce(t, ReduceOp::kSum);
  auto w2 = comm_->allReduce(t, ReduceOp::kSum);
  EXPECT_EQ(w2->seq(), w1->seq() + 1);
  EXPECT_EQ(w1->seq(), before);
  w2->wait(comm_->timeout());
  EXPECT_TRUE(w1->isCompleted());  // ops complete in issue order
  auto recent = comm_->recentOps();
  ASSERT_FALSE(recent.empty());
  EXPECT_EQ(recent.back().seq, w2->seq());
  EXPECT_EQ(recent.back().bytes, 40u);
  EXPECT_GT(recent.back().completedUs, 0);
}

TEST_F(Collectives, SplitMakesIndependentGroups) {
  auto sub = comm_->split(r_ % 2, r_, "parity");
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), (n_ + 1 - r_ % 2) / 2);
  EXPECT_EQ(sub->rank(), r_ / 2);
  Tensor t = Tensor::empty({1}, DType::kI32);
  t.data<int32_t>()[0] = r_;
  sub->allReduceSync(t, ReduceOp::kSum);
  int expect = 0;
  for (int q = r_ % 2; q < n_; q += 2) expect += q;
  EXPECT_EQ(t.data<int32_t>()[0], expect);
  auto none = comm_->split(r_ == 0 ? 0 : -1, 0, "only0");
  EXPECT_EQ(static_cast<bool>(none), r_ == 0);
}

TEST_F(Collectives, TimeoutNamesTheOpAndLaterCompletes) {
  Tensor t = Tensor::empty({256}, DType::kF32);
  t.fill_(1.f);
  if (r_ == 0) {
    auto w = comm_->allReduce(t, ReduceOp::kSum);
    try {
      w->wait(milliseconds(300));
      ADD_FAILURE() << "no timeout";
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
      EXPECT_NE(msg.find("of 1024 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("communicator 'test'"), std::string::npos) << msg;
      EXPECT_EQ(e.exitCode(), ExitCode::kCommFailure);
    }
    w->wait(comm_->timeout());  // the others join late: the op still completes
  } else {
    std::this_thread::sleep_for(milliseconds(800));
    comm_->allReduce(t, ReduceOp::kSum)->wait(comm_->timeout());
  }
  EXPECT_EQ(t.data<float>()[0], static_cast<float>(n_));
}

TEST_F(Collectives, FingerprintCatchesMismatchedOps) {
  CommOptions o;
  o.name = "checked";
  o.fingerprint = true;
  o.timeout = std::chrono::seconds(60);
  MpiCommunicator checked(MPI_COMM_WORLD, o);
  Tensor t = Tensor::zeros({r_ == 1 ? 11 : 10}, DType::kF32);
  try {
    checked.allReduce(t, ReduceOp::kSum)->wait(checked.timeout());
    ADD_FAILURE() << "mismatch not detected";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("collective mismatch on communicator 'checked'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1=allreduce(count 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0=allreduce(count 10"), std::string::npos) << msg;
  }
  // Matching ops pass the check.
  Tensor ok = Tensor::zeros({4}, DType::kF32);
  checked.allReduce(ok, ReduceOp::kSum)->wait(checked.timeout());
}

TEST_F(Collectives, AbortFailsQueuedAndFutureOps) {
  CommOptions o;
  o.name = "doomed";
  MpiCommunicator doomed(MPI_COMM_WORLD, o);
  doomed.abort("rank 3 lost (test)");
  Tensor t = Tensor::zeros({4}, DType::kF32);
  EXPECT_THROW(doomed.allReduce(t, ReduceOp::kSum)->wait(milliseconds(1000)), PeerLostError);
}

}  // namespace
}  // namespace mt
