// comm_bench: nccl-tests-style sweep of collectives through meshtrain's Communicator, beside the raw
// library call (MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block) on the same buffers.
//
//   mpirun -np 4 build/bin/comm_bench [--op allreduce|allgather|reducescatter|hierarchical|all] [--min 1K]
//        [--max 64M] [--factor 2] [--iters 20] [--warmup 5] [--reps 5] [--backend mpi] [--node-ranks 2]
//
// --op hierarchical: comm/Hierarchy's all-reduce (node reduce-scatter, inter-node all-reduce, node
// all-gather, chained as the trainer issues them) against the flat all-reduce of the same
// Communicator on the same buffer (the "raw" columns then are that flat all-reduce), with nodes of
// --node-ranks ranks emulated on this machine.
//
// Per size: time per op (max over ranks, median of reps of `iters` ops each), algbw = bytes / time,
// busbw = algbw * 2(n-1)/n for all-reduce and (n-1)/n for all-gather and reduce-scatter (the
// nccl-tests definitions, where bytes is the full buffer: n x the per-rank part for the latter two).

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/Hierarchy.h"
#include "comm/MpiCommunicator.h"
#include "comm/MpiEnvironment.h"
#include "core/Timer.h"

namespace {

using namespace mt;

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  if (unit == "K" || unit == "k") v *= 1024;
  else if (unit == "M" || unit == "m") v *= 1024 * 1024;
  else if (unit == "G" || unit == "g") v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw ConfigError("comm_bench: bad size '" + s + "'");
  return static_cast<size_t>(v);
}

struct Args {
  std::string op = "allreduce", backend = "mpi";
  size_t minBytes = 1024, maxBytes = 64u << 20;
  int factor = 2, iters = 20, warmup = 5, reps = 5, nodeRanks = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError("comm_bench: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--op") a.op = next();
    else if (k == "--backend") a.backend = next();
    else if (k == "--min") a.minBytes = parseSize(next());
    else if (k == "--max") a.maxBytes = parseSize(next());
    else if (k == "--factor") a.factor = std::atoi(next().c_str());
    else if (k == "--iters") a.iters = std::atoi(next().c_str());
    else if (k == "--warmup") a.warmup = std::atoi(next().c_str());
    else if (k == "--reps") a.reps = std::atoi(next().c_str());
    else if (k == "--node-ranks") a.nodeRanks = std::atoi(next().c_str());
    else throw ConfigError("comm_bench: unknown option " + k);
  }
  if (a.factor < 2 || a.iters < 1 || a.reps < 1) throw ConfigError("comm_bench: --factor >= 2, --iters/--reps >= 1");
  if (a.op != "allreduce" && a.op != "allgather" && a.op != "reducescatter" && a.op != "hierarchical" && a.op != "all")
    throw ConfigError("comm_bench: --op must be allreduce, allgather, reducescatter, hierarchical or all");
  if (a.nodeRanks < 1) throw ConfigError("comm_bench: --node-ranks >= 1");
  if (a.backend != "mpi") throw ConfigError("comm_bench: --backend " + a.backend + " is not in this build");
  return a;
}

double maxOverRanks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// Seconds per op of fn over `iters` calls, max over ranks.
template <typename F>
double timeOps(int iters, F&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  Stopwatch sw;
  for (int i = 0; i < iters; ++i) fn();
  return maxOverRanks(sw.elapsed() / iters);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment mpi(&argc, &argv);
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const Error& e) {
    if (mpi.rank() == 0) std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const int n = mpi.size();
  CommOptions o;
  o.name = "bench";
  MpiCommunicator comm(MPI_COMM_WORLD, o);
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  std::unique_ptr<NodeGroups> groups;
  if (a.op == "hierarchical") {
    if (n % a.nodeRanks != 0) {
      if (mpi.rank() == 0) std::fprintf(stderr, "comm_bench: --node-ranks %d does not divide %d ranks\n", a.nodeRanks, n);
      return 2;
    }
    groups = std::make_unique<NodeGroups>(comm, a.nodeRanks);
    groups->intraGather();  // collective: made here, on every rank, not inside a timed op
  }
  std::vector<std::string> ops = a.op == "all" ? std::vector<std::string>{"allreduce", "allgather", "reducescatter"}
                                               : std::vector<std::string>{a.op};
  if (mpi.rank() == 0) {
    std::printf("# comm_bench: %d ranks, backend %s, f32, iters %d, warmup %d, median of %d reps\n", n,
                a.backend.c_str(), a.iters, a.warmup, a.reps);
    if (groups) std::printf("# hierarchical: %d nodes of %d ranks; raw = the flat all-reduce of the same Communicator\n",
                            n / a.nodeRanks, a.nodeRanks);
    std::printf("# %-13s %12s %12s | %10s %9s %9s | %10s %9s %9s | %6s\n", "op", "size(B)", "count", "ours(us)",
                "algbw", "busbw", "raw(us)", "algbw", "busbw", "ours/raw");
  }
  for (const std::string& op : ops) {
    const bool reduceAll = op == "allreduce" || op == "hierarchical";
    const double busFactor = reduceAll ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
    for (size_t bytes = a.minBytes; bytes <= a.maxBytes; bytes *= static_cast<size_t>(a.factor)) {
      // bytes is the full buffer; all-gather / reduce-scatter move bytes/n per rank.
      size_t count = bytes / sizeof(float);
      if (op == "hierarchical") count = count / static_cast<size_t>(a.nodeRanks) * static_cast<size_t>(a.nodeRanks);
      else if (op != "allreduce") count = count / static_cast<size_t>(n) * static_cast<size_t>(n);
      if (count == 0) continue;
      const size_t per = count / static_cast<size_t>(n);
      std::vector<float> big(count, 1.f), small(std::max<size_t>(per, 1), 1.f);
      Tensor full, slice, gathered;
      if (groups) {
        full = Tensor::zeros({static_cast<int64_t>(count)}, DType::kF32);
        gathered = Tensor::zeros({static_cast<int64_t>(count)}, DType::kF32);
        slice = Tensor::zeros({static_cast<int64_t>(count) / a.nodeRanks}, DType::kF32);
      }
      auto ours = [&] {
        if (groups) {  // as HierarchicalReducer issues a bucket: three chained phases, one wait
          auto rs = groups->intra().reduceScatter(full, slice, ReduceOp::kSum);
          auto ar = groups->inter().allReduce(slice, ReduceOp::kSum, rs);
          groups->intraGather().allGather(slice, gathered, ar)->wait(comm.timeout());
        } else if (op == "allreduce") comm.allReduce(big.data(), count, DType::kF32, ReduceOp::kSum, Device::cpu())->wait(comm.timeout());
        else if (op == "allgather") comm.allGather(small.data(), big.data(), per, DType::kF32, Device::cpu())->wait(comm.timeout());
        else comm.reduceScatter(big.data(), small.data(), per, DType::kF32, ReduceOp::kSum, Device::cpu())->wait(comm.timeout());
      };
      auto lib = [&] {
        if (groups) comm.allReduce(full, ReduceOp::kSum)->wait(comm.timeout());
        else if (op == "allreduce") MPI_Allreduce(MPI_IN_PLACE, big.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, raw);
        else if (op == "allgather") MPI_Allgather(small.data(), static_cast<int>(per), MPI_FLOAT, big.data(), static_cast<int>(per), MPI_FLOAT, raw);
        else MPI_Reduce_scatter_block(big.data(), small.data(), static_cast<int>(per), MPI_FLOAT, MPI_SUM, raw);
      };
      for (int w = 0; w < a.warmup; ++w) {
        ours();
        lib();
      }
      std::vector<double> tOurs, tRaw;
      for (int r = 0; r < a.reps; ++r) {  // alternate, so drift affects both alike
        tRaw.push_back(timeOps(a.iters, lib));
        tOurs.push_back(timeOps(a.iters, ours));
      }
      const double to = median(tOurs), tr = median(tRaw);
      const double realBytes = static_cast<double>(count * sizeof(float));
      if (mpi.rank() == 0) {
        std::printf("  %-13s %12zu %12zu | %10.1f %9.3f %9.3f | %10.1f %9.3f %9.3f | %6.3f\n", op.c_str(),
                    count * sizeof(float), count, to * 1e6, realBytes / to / 1e9, realBytes / to / 1e9 * busFactor,
                    tr * 1e6, realBytes / tr / 1e9, realBytes / tr / 1e9 * busFactor, to / tr);
        std::fflush(stdout);
      }
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}
