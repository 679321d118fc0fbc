// The NCCL backend with several ranks (run under mpirun -np 2 or 4). On a one-GPU machine the ranks
// share the GPU with MT_NCCL_SHARE_GPU_FOR_TESTS=1 (GpuTestMain gives each its own NCCL host over
// sockets): correctness only, no timings. With one rank every test is skipped (test_nccl covers it).
//
// Besides the collectives' results, the findings of the multi-rank review, each with a test that
// failed (or hung) on the code before it:
//   1. the watchdog and the training thread share a communicator (NCCL allows one thread at a time;
//      ncclCommGetAsyncError frees group jobs): thousands of ops with the watchdog polling;
//   2. a peer that never issues the matching op: the issuing rank's wait is bounded;
//   3. the watchdog thread binds to the communicator's GPU (it frees finished ops' buffers);
//   6. a Work is "started" when its kernel is reached on the stream, not when the host issued it;
//      the fingerprint check (dist.fingerprint) runs on NCCL and names both sides of a mismatch;
//   7. a split that a rank never joins ends in a TimeoutError, and a refused split leaves the parent
//      usable.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>

#include "comm/Hierarchy.h"
#include "comm/NcclCommunicator.h"
#include "core/Timer.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

const Device kGpu = Device::cuda(0);

int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int worldSize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

#define SKIP_ON_ONE_RANK() \
  if (worldSize() < 2) GTEST_SKIP() << "needs several ranks (mpirun -np 2 or 4)"

// Rank r's data: r + 1 times a shared random vector, so every reduction has a closed form.
Tensor rankData(int64_t n, int rank, uint64_t seed) {
  Tensor t = test::randomTensor({n}, seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i)
    p[i] *= static_cast<float>(rank + 1);
  return t;
}

// A device tensor of n copies of v.
Tensor filled(int64_t n, float v) {
  Tensor t = Tensor::empty({n}, DType::kF32);
  t.fill_(v);
  return t.to(kGpu);
}

Tensor scaled(const Tensor& t, double factor) {
  Tensor out = t.clone();
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i)
    p[i] = static_cast<float>(p[i] * factor);
  return out;
}

CommOptions named(const std::string& name, int timeoutMs = 60000) {
  CommOptions o;
  o.name = name;
  o.timeout = std::chrono::milliseconds(timeoutMs);
  return o;
}

TEST(NcclRanks, CollectivesMatchTheirClosedForms) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank(), n = worldSize();
  NcclCommunicator c(MPI_COMM_WORLD, named("ranks"));
  ASSERT_EQ(c.size(), n);
  const double sumFactor = n * (n + 1) / 2.0;
  for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{(1 << 20) + 3}}) {
    const Tensor base = test::randomTensor({count}, 11);
    Tensor d = rankData(count, r, 11).to(kGpu);
    c.allReduce(d, ReduceOp::kSum)->wait(c.timeout());
    EXPECT_LT(test::relErr(d, scaled(base, sumFactor)), 1e-6) << "sum, count " << count;
    Tensor a = rankData(count, r, 11).to(kGpu);
    c.allReduce(a, ReduceOp::kAvg)->wait(c.timeout());
    EXPECT_LT(test::relErr(a, scaled(base, sumFactor / n)), 1e-6) << "avg, count " << count;
    // Reduce-scatter of n blocks, then all-gather back: the all-reduce again.
    Tensor in = rankData(count * n, r, 12).to(kGpu);
    Tensor slice = Tensor::zeros({count}, DType::kF32, kGpu);
    c.reduceScatter(in, slice, ReduceOp::kSum)->wait(c.timeout());
    Tensor full = Tensor::zeros({count * n}, DType::kF32, kGpu);
    c.allGather(slice, full)->wait(c.timeout());
    EXPECT_LT(test::relErr(full, scaled(test::randomTensor({count * n}, 12), sumFactor)), 1e-6)
        << "reduce-scatter + all-gather, count " << count;
  }
  Tensor b = rankData(777, r, 13).to(kGpu);
  c.broadcast(b, n - 1)->wait(c.timeout());
  EXPECT_LT(test::relErr(b, rankData(777, n - 1, 13)), 1e-7);
  EXPECT_DOUBLE_EQ(c.allReduceScalar(r + 1.0, ReduceOp::kSum), sumFactor);
  EXPECT_DOUBLE_EQ(c.allReduceScalar(r, ReduceOp::kMax), n - 1.0);
  c.barrierSync();
  // A ring of sends: each rank receives its left neighbour's data. Each op is its own kernel on
  // the comm stream, so the pairs go in an order both sides share (even ranks send first, odd ranks
  // receive first; n is even), as ncclSend/ncclRecv outside one group need.
  ASSERT_EQ(n % 2, 0);
  Tensor mine = rankData(4099, r, 14).to(kGpu), got = Tensor::zeros({4099}, DType::kF32, kGpu);
  auto sendIt = [&] { return c.send(mine.rawData(), 4099, DType::kF32, (r + 1) % n, kGpu); };
  auto recvIt = [&] { return c.recv(got.rawData(), 4099, DType::kF32, (r + n - 1) % n, kGpu); };
  std::shared_ptr<Work> first = r % 2 == 0 ? sendIt() : recvIt();
  std::shared_ptr<Work> second = r % 2 == 0 ? recvIt() : sendIt();
  first->wait(c.timeout());
  second->wait(c.timeout());
  EXPECT_EQ(test::relErr(got, rankData(4099, (r + n - 1) % n, 14)), 0.0);
  CudaRuntime::require().synchronize();
}

// Finding 1 (and 3): the watchdog polls the communicator every millisecond while the training thread
// issues; in NCCL 2.28 that poll joins and frees group jobs, so unserialised use corrupted state.
// Thousands of ops, each retaining its buffer so the watchdog frees it (on the right GPU).
TEST(NcclRanks, ThousandsOfOpsWhileTheWatchdogPolls) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank(), n = worldSize();
  const int64_t before = threadDeviceViolations();
  NcclCommunicator c(MPI_COMM_WORLD, named("busy"));
  const int kOps = 1000;
  double worst = 0;
  for (int i = 0; i < kOps; ++i) {
    Tensor t = filled(257, static_cast<float>(r + i % 7));
    c.allReduce(t, ReduceOp::kSum)->wait(c.timeout());  // t goes out of scope: the Work frees it
    if (i % 250 == 0) {
      const float want = static_cast<float>(n * (i % 7) + n * (n - 1) / 2);
      Tensor h = t.to(Device::cpu());
      worst = std::max(worst, static_cast<double>(std::fabs(h.data<float>()[256] - want)));
      // Let the watchdog catch up, racing the next issues.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  CudaRuntime::require().synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the watchdog completes the last ops
  EXPECT_EQ(worst, 0.0);
  EXPECT_EQ(c.opsIssued(), kOps);
  EXPECT_EQ(threadDeviceViolations() - before, 0) << firstThreadDeviceViolation();
}

// Finding 3's check itself: a thread that never bound to the GPU is caught when it allocates (it
// would have made a context on GPU 0 of an 8-GPU node), and a free from it is noted.
TEST(NcclRanks, UnboundThreadsAreCaught) {
  bool threw = false;
  const int64_t before = threadDeviceViolations();
  Tensor t = Tensor::zeros({16}, DType::kF32, kGpu);
  std::thread([&] {
    try {
      Tensor::zeros({16}, DType::kF32, kGpu);
    } catch (const InternalError& e) {
      threw = std::string(e.what()).find("bindThreadToDevice") != std::string::npos;
    }
    t = Tensor();  // the free is noted, and binds the thread
  }).join();
  EXPECT_TRUE(threw);
  EXPECT_EQ(threadDeviceViolations() - before, 1);
}

// Finding 2: a peer that never issues the matching op. The op's enqueue (or its kernel) cannot
// finish; the issuing rank's wait ends within the timeout with a TimeoutError naming the op, and
// the communicator is aborted (the job would end through the fatal handler). Before: a spin with
// no bound after ncclGroupEnd.
TEST(NcclRanks, APeerThatNeverIssuesTheOpEndsInATimeout) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank();
  std::string reported;
  {
    NcclCommunicator c(MPI_COMM_WORLD, named("lonely", 3000),
                       [&](const std::string& why) { reported = why; });
    if (r == 0) {
      Stopwatch sw;
      Tensor t = filled(1 << 16, 1.f);
      std::string what;
      try {
        auto w = c.allReduce(t, ReduceOp::kSum);
        // Enqueued: its kernel waits for the peers; the watchdog times it out.
        while (!w->isCompleted() && sw.elapsed() < 20)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (std::exception_ptr e = w->error()) std::rethrow_exception(e);
      } catch (const TimeoutError& e) {
        what = e.what();
      }
      std::printf("rank 0: %.1f s to: %s\n", sw.elapsed(), what.c_str());
      EXPECT_LT(sw.elapsed(), 15.0);
      EXPECT_NE(what.find("allreduce #0"), std::string::npos) << what;
      EXPECT_NE(reported.find("lonely"), std::string::npos) << reported;
      EXPECT_THROW(c.allReduce(t, ReduceOp::kSum), CommError);  // failed for good
    }
    MPI_Barrier(MPI_COMM_WORLD);  // rank 1.. never issued: their communicator is destroyed unused
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Finding 6: started means the comm stream reached the op's kernel. With the peers late, the first
// op is running (waiting for them) and the second is queued behind it; before, both said started
// at issue, so a timeout always blamed "waiting for peers".
TEST(NcclRanks, StartedMeansTheKernelWasReached) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank();
  NcclCommunicator c(MPI_COMM_WORLD, named("late"));
  // Connections made (NCCL connects each protocol's on its first use: the same size as below).
  Tensor warm = filled(1 << 18, 1.f);
  c.allReduce(warm, ReduceOp::kSum)->wait(c.timeout());
  CudaRuntime::require().synchronize();
  MPI_Barrier(MPI_COMM_WORLD);
  Tensor a = filled(1 << 18, 1.f), b = filled(1 << 18, 1.f);
  if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto wa = c.allReduce(a, ReduceOp::kSum);
  auto wb = c.allReduce(b, ReduceOp::kSum);
  if (r == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // the peers are still asleep
    const CollectiveRecord ra = wa->record(), rb = wb->record();
    EXPECT_NE(ra.startedUs, 0) << ra.str();
    EXPECT_EQ(ra.completedUs, 0) << ra.str();
    EXPECT_EQ(rb.startedUs, 0) << "the second op cannot have started: " << rb.str();
  }
  wa->wait(c.timeout());
  wb->wait(c.timeout());
  CudaRuntime::require().synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(wb->isCompleted());
  EXPECT_GE(wb->record().startedUs, wa->record().startedUs);
}

// Finding 6: dist.fingerprint on NCCL. Rank 1 issues a different count; every rank throws naming
// both sides, before the mismatched op runs (so the communicator stays usable).
TEST(NcclRanks, FingerprintNamesAMismatch) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank();
  CommOptions o = named("checked");
  o.fingerprint = true;
  NcclCommunicator c(MPI_COMM_WORLD, o);
  Tensor t = filled(1000, 1.f);
  c.allReduce(t, ReduceOp::kSum)->wait(c.timeout());  // agreeing ops pass
  std::string what;
  try {
    c.allReduce(t.rawData(), r == 1 ? 999 : 1000, DType::kF32, ReduceOp::kSum, kGpu);
  } catch (const CommError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("collective mismatch on communicator 'checked'"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 1 op #1=allreduce(count 999"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0 op #1=allreduce(count 1000"), std::string::npos) << what;
  Tensor u = filled(10, 1.f);
  c.allReduce(u, ReduceOp::kSum)->wait(c.timeout());
  EXPECT_EQ(u.to(Device::cpu()).data<float>()[9], static_cast<float>(worldSize()));
}

// Finding 7: splits. Colors group the ranks; a refused split leaves the parent usable; a split that
// one rank never joins ends in a TimeoutError on the others (before: a throw without an abort, with
// NCCL's thread later writing the child's handle into a dead stack slot).
TEST(NcclRanks, SplitsAndTheirErrors) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank(), n = worldSize();
  NcclCommunicator c(MPI_COMM_WORLD, named("parent", 4000));
  auto half = c.split(r % 2, r, named("parent.half", 4000));
  ASSERT_TRUE(half);
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  Tensor t = filled(333, static_cast<float>(r));
  half->allReduce(t, ReduceOp::kSum)->wait(half->timeout());
  float want = 0;
  for (int q = r % 2; q < n; q += 2)
    want += static_cast<float>(q);
  EXPECT_EQ(t.to(Device::cpu()).data<float>()[332], want);
  auto none = c.split(r == 0 ? -1 : 0, r, named("parent.some", 4000));  // rank 0 joins none
  EXPECT_EQ(none == nullptr, r == 0);
  CommOptions bad = named("parent.bad", 4000);
  bad.tuning.minCtas = 8;
  bad.tuning.maxCtas = 2;
  EXPECT_THROW(c.split(0, r, bad), Error);
  Tensor u = filled(5, 1.f);
  c.allReduce(u, ReduceOp::kSum)->wait(c.timeout());
  EXPECT_EQ(u.to(Device::cpu()).data<float>()[4], static_cast<float>(n));
  CudaRuntime::require().synchronize();
  MPI_Barrier(MPI_COMM_WORLD);
  // The last rank never joins: the others time out within the parent's timeout.
  if (r != n - 1) {
    Stopwatch sw;
    EXPECT_THROW(c.split(0, r, named("parent.never", 4000)), TimeoutError);
    std::printf("rank %d: split without rank %d ended after %.1f s\n", r, n - 1, sw.elapsed());
    EXPECT_LT(sw.elapsed(), 15.0);
    EXPECT_THROW(c.allReduce(u, ReduceOp::kSum), CommError);  // the parent was aborted
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The hierarchical all-reduce with real split node and rail communicators (2 x n/2) equals the flat
// one: three communicators whose kernels run at once (NCCL_LAUNCH_ORDER_IMPLICIT orders them).
TEST(NcclRanks, HierarchicalEqualsFlat) {
  SKIP_ON_ONE_RANK();
  const int r = worldRank(), n = worldSize();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  NcclCommunicator c(MPI_COMM_WORLD, named("hworld"));
  NodeGroups g(c, n / 2 > 0 ? n / 2 : 1);
  for (int64_t count : {int64_t{17}, int64_t{300001}}) {
    Tensor flat = rankData(count, r, 21).to(kGpu), hier = rankData(count, r, 21).to(kGpu);
    c.allReduce(flat, ReduceOp::kAvg)->wait(c.timeout());
    g.allReduce(hier, ReduceOp::kAvg);
    EXPECT_LT(test::relErr(hier, flat), 1e-6) << count;
  }
  CudaRuntime::require().synchronize();
}

}  // namespace
}  // namespace mt
