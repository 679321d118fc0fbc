// trainer: the meshtrain training program.
//   trainer [--config FILE.ini] [--section.key=value ...]   train (defaults: Fashion-MNIST MLP)
//   trainer --help | --help-env | --help-nccl | --devices | --config-reference (the README's key table)
//   trainer --version   version, git commit, and the CUDA/NCCL/cuDNN/MPI/HDF5 built with and run with
//   trainer topo --file X.xml [--json] [--fabric ...] [--ranks N]   topology summary, rank layout
//   trainer predict --topo X.xml [--profile P] ...                       scaling prediction
//   trainer export --checkpoint DIR --out FILE [--format h5|onnx]        consolidated parameters / ONNX model
//   trainer logits --checkpoint DIR --out FILE.h5 [--count N] ...       the trainer's forward on test samples
//   trainer plan --config X.ini [--ranks N] [--gpu-memory GIB]          memory plan per rank
// Exit codes: 0 ok, 1 internal/library failure, 2 bad input (config, data), 3 lost peer/timeout.

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/MpiEnvironment.h"
#include "core/EnvParams.h"
#include "core/Files.h"
#include "core/Log.h"
#include "launch/Checkpoint.h"
#include "launch/CommandArgs.h"
#include "launch/Config.h"
#include "launch/ExportCommand.h"
#include "launch/Failure.h"
#include "launch/Plan.h"
#include "launch/RankDiscovery.h"
#include "launch/RunMetrics.h"
#include "launch/SetupAgreement.h"
#include "launch/Signals.h"
#include "launch/Trainer.h"
#include "launch/Version.h"
#include "topo/CostModel.h"
#include "topo/NcclLog.h"
#include "topo/Profile.h"
#include "topo/RankLayout.h"
#include "topo/Topology.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaMemory.h"
#endif

namespace {

void printEnvHelp() {
  std::printf("environment variables read by meshtrain:\n");
  for (const auto& p : mt::envParamTable()) std::printf("  %-22s default %-6s %s\n", p.name, p.defaultValue, p.help);
}

}  // namespace

const char* const kTopoUsage =
    "usage: trainer topo --file X.xml [--json] [--fabric ib|roce|efa|socket] [--ranks N [--ranks-per-node K]]\n"
    "  the GPUs, NICs, PCI switches, NUMA nodes, rails and fabric of an NCCL topology file\n"
    "  (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE format); --json for a machine-readable form;\n"
    "  --ranks: where N ranks land on nodes built like the file (K per node, default its GPU count):\n"
    "  each rank's GPU, rail NIC(s) and NIC binding, the intra-node groups and one group per rail\n"
    "       trainer topo --nccl-log FILE\n"
    "  what NCCL chose, as JSON, from its NCCL_DEBUG=INFO output (version, network, NICs, the machine\n"
    "  as it saw it, per communicator its rings and trees): what topo.report puts in nccl_report.json\n";
const char* const kPredictUsage =
    "usage: trainer predict --topo X.xml [--profile NAME|PATH] [--params N] [--grad-bytes B]\n"
    "         [--compute-ms C] [--backward-fraction F] [--bucket-mb M] [--nodes 1,2,4,...]\n"
    "         [--intra-gbs G] [--csv] [--hierarchical]\n"
    "  the fabric cost model: all-reduce bandwidth, exposed communication, step time and scaling\n"
    "  efficiency per node count for a model of N parameters (default 124e6, B = 2 bytes each);\n"
    "  --hierarchical: also the flat all-reduce against topo.hierarchical's node/rail/node phases.\n"
    "  Ranges: N in (0, 1e15], B in (0, 16], C (ms) in (0, 1e9], F (backward's share of C) in (0, 1],\n"
    "  M in (0, 1048576], G (GB/s) in (0, 1e6], nodes 1..1048576 each\n";
bool wantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// trainer topo --file X.xml [--json] [--fabric ib|roce|efa|socket] [--ranks N [--ranks-per-node K]]
int topoCommand(const std::vector<std::string>& args) {
  std::string file, fabric, ncclLog;
  bool json = false;
  int ranks = 0, ranksPerNode = 0;
  auto count = [](const std::string& flag, const std::string& v) {
    return static_cast<int>(mt::integerOption("topo", flag, v, 1, 1000000));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (i + 1 < args.size()) return args[++i];
      throw mt::ConfigError("topo: " + flag + " needs a value");
    };
    if (a == "--json") json = true;
    else if (a.rfind("--nccl-log", 0) == 0) ncclLog = value("--nccl-log");
    else if (a.rfind("--file", 0) == 0) file = value("--file");
    else if (a.rfind("--fabric", 0) == 0) fabric = value("--fabric");
    else if (a.rfind("--ranks-per-node", 0) == 0) ranksPerNode = count("--ranks-per-node", value("--ranks-per-node"));
    else if (a.rfind("--ranks", 0) == 0) ranks = count("--ranks", value("--ranks"));
    else
      throw mt::ConfigError("topo: unknown argument '" + a +
                            "' (usage: trainer topo --file X.xml [--json] [--ranks N [--ranks-per-node K]] | "
                            "--nccl-log FILE; --help)");
  }
  if (!ncclLog.empty()) {  // what NCCL chose, read from its NCCL_DEBUG=INFO output
    std::string text, why;
    if (!mt::readWholeFile(ncclLog, &text, &why))
      throw mt::ConfigError("topo: --nccl-log " + ncclLog + ": cannot read it: " + why);
    // A log is bytes, not UTF-8: a stray byte is written as U+FFFD (a strict dump() threw on it).
    std::cout << mt::toJson(mt::parseNcclDebugLog(text))
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return 0;
  }
  if (file.empty()) throw mt::ConfigError("topo: --file X.xml is required");
  mt::Topology t = mt::Topology::load(file);
  if (!fabric.empty()) {
    mt::Fabric f;
    if (!mt::parseFabric(fabric, &f)) throw mt::ConfigError("topo: --fabric must be ib, roce, efa or socket");
    t.setFabric(f);
  }
  std::cout << (json ? t.json() + "\n" : t.summary());
  if (ranks > 0) std::cout << mt::layoutRanks(t, ranks, ranksPerNode).summary();
  return 0;
}

// trainer predict --topo X.xml [--profile NAME|PATH] [--params N] [--grad-bytes B] [--compute-ms C]
//   [--backward-fraction F] [--bucket-mb M] [--nodes 1,2,4,...] [--intra-gbs G] [--csv] [--hierarchical]
struct PredictArgs {
  std::string topo, profileName;
  std::vector<int64_t> nodesList = {1, 2, 4, 8, 16, 32, 64};
  double params = 124e6, gradBytes = 2, computeMs = 100, backwardFraction = 2.0 / 3.0, bucketMb = 25, intraGBs = 0;
  bool csv = false, hierarchical = false;
};

PredictArgs parsePredictArgs(const std::vector<std::string>& args) {
  PredictArgs p;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.size()) throw mt::ConfigError("predict: " + a + " needs a value");
      return args[++i];
    };
    // Every number finite and in its usage range: nan parameters printed a table of zeros, 1e9
    // nodes a negative GPU count, a backward fraction of 5 a step with more overlap than compute.
    auto number = [&](double hi) { return mt::numberOption("predict", a, next(), 0, hi, /*loOpen=*/true); };
    if (a == "--topo")
      p.topo = next();
    else if (a == "--profile")
      p.profileName = next();
    else if (a == "--params")
      p.params = number(1e15);
    else if (a == "--grad-bytes")
      p.gradBytes = number(16);
    else if (a == "--compute-ms")
      p.computeMs = number(1e9);
    else if (a == "--backward-fraction")
      p.backwardFraction = number(1);
    else if (a == "--bucket-mb")
      p.bucketMb = number(1 << 20);
    else if (a == "--nodes")
      p.nodesList = mt::integerListOption("predict", a, next(), 1, 1 << 20);
    else if (a == "--intra-gbs")
      p.intraGBs = number(1e6);  // files without NVLink (Azure's) on NVSwitch machines
    else if (a == "--csv")
      p.csv = true;
    else if (a == "--hierarchical")
      p.hierarchical = true;
    else
      throw mt::ConfigError("predict: unknown argument '" + a + "' (trainer predict --help for usage)");
  }
  if (p.topo.empty()) throw mt::ConfigError("predict: --topo X.xml is required");
  return p;
}

mt::CostModel predictModel(const PredictArgs& p) {
  mt::Topology t = mt::Topology::load(p.topo);
  std::unique_ptr<mt::Profile> profile;
  if (!p.profileName.empty()) {
    std::string dir = mt::envString(mt::EnvParam::kProfileDir);
    if (dir.empty()) dir = MT_DEFAULT_PROFILE_DIR;
    profile = std::make_unique<mt::Profile>(mt::Profile::load(p.profileName, dir));
  }
  mt::MachineSpec spec = mt::CostModel::specFrom(t, profile.get());
  if (p.intraGBs > 0) {
    spec.intraGBs = p.intraGBs;
    spec.nvlink = true;
  }
  mt::CostModel model(spec);
  // The cost model counts GPUs in an int; 2^24 is beyond any machine.
  for (const int64_t n : p.nodesList)
    if (n * model.spec().gpusPerNode > (int64_t{1} << 24))
      throw mt::ConfigError("predict: --nodes " + std::to_string(n) + ": " + std::to_string(n) +
                            " nodes of " + std::to_string(model.spec().gpusPerNode) +
                            " GPUs are more than 16777216 GPUs");
  return model;
}

void printStepTable(const PredictArgs& p, const mt::CostModel& model) {
  const double grads = p.params * p.gradBytes;
  if (p.csv)
    std::printf("nodes,gpus,fabric,busbw_gbs,comm_ms,exposed_ms,step_ms,efficiency,busbw_1g_gbs\n");
  else
    std::printf(
        "# %s\n# gradients %.0f MB, buckets %.0f MB, compute %.1f ms/step (backward %.0f%%)\n# %5s %5s %10s "
        "%10s "
        "%10s %10s %10s %10s\n",
        model.spec().str().c_str(), grads / 1e6, p.bucketMb, p.computeMs, p.backwardFraction * 100, "nodes",
        "gpus", "busbw", "comm ms", "exposed", "step ms", "eff", "busbw 1GiB");
  for (const int64_t n : p.nodesList) {
    const int nodes = static_cast<int>(n);
    mt::StepEstimate e = model.step(grads, p.bucketMb * 1024 * 1024, p.computeMs, p.backwardFraction, nodes);
    const int gpus = nodes * model.spec().gpusPerNode;
    // A large all-reduce (nccl-tests' 1 GiB point): the bandwidth regime, where fabrics differ.
    const double big = model.allReduce(1024.0 * 1024 * 1024, nodes).busGBs;
    if (p.csv)
      std::printf("%d,%d,%s,%.2f,%.3f,%.3f,%.3f,%.4f,%.2f\n", nodes, gpus,
                  mt::fabricName(model.spec().fabric), e.busGBs, e.commMs, e.exposedMs, e.stepMs,
                  e.efficiency, big);
    else
      std::printf("  %5d %5d %10.1f %10.2f %10.2f %10.2f %10.3f %10.1f\n", nodes, gpus, e.busGBs, e.commMs,
                  e.exposedMs, e.stepMs, e.efficiency, big);
  }
}

// Flat NCCL all-reduce against comm/Hierarchy's three phases, per bucket and at 1 GiB.
void printHierarchical(const PredictArgs& p, const mt::CostModel& model) {
  const double bucket = p.bucketMb * 1024 * 1024, gib = 1024.0 * 1024 * 1024;
  if (p.csv)
    std::printf("nodes,gpus,bucket_flat_us,bucket_hier_us,gib_flat_ms,gib_hier_ms\n");
  else
    std::printf(
        "# all-reduce, flat (NCCL over all GPUs) vs hierarchical (node RS, rail AR, node AG)\n"
        "# %5s %5s %14s %14s %12s %12s\n",
        "nodes", "gpus", "bucket flat us", "bucket hier us", "1GiB flat ms", "1GiB hier ms");
  for (const int64_t n : p.nodesList) {
    const int nodes = static_cast<int>(n);
    const int gpus = nodes * model.spec().gpusPerNode;
    const double bf = model.allReduce(bucket, nodes).us, bh = model.hierarchicalAllReduce(bucket, nodes).us;
    const double gf = model.allReduce(gib, nodes).us / 1e3,
                 gh = model.hierarchicalAllReduce(gib, nodes).us / 1e3;
    if (p.csv)
      std::printf("%d,%d,%.1f,%.1f,%.3f,%.3f\n", nodes, gpus, bf, bh, gf, gh);
    else
      std::printf("  %5d %5d %14.1f %14.1f %12.2f %12.2f\n", nodes, gpus, bf, bh, gf, gh);
  }
}

int predictCommand(const std::vector<std::string>& args) {
  const PredictArgs p = parsePredictArgs(args);
  const mt::CostModel model = predictModel(p);
  printStepTable(p, model);
  if (p.hierarchical) printHierarchical(p, model);
  return 0;
}

bool isSubcommand(const std::vector<std::string>& args) {
  return !args.empty() && (args[0] == "topo" || args[0] == "predict" || args[0] == "export" ||
                           args[0] == "plan" || args[0] == "logits");
}

// trainer topo | predict | export | plan | logits: no MPI, one process.
int runSubcommand(const std::vector<std::string>& args) {
  try {
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (wantsHelp(rest)) {
      std::fputs(args[0] == "topo"      ? kTopoUsage
                 : args[0] == "predict" ? kPredictUsage
                 : args[0] == "plan"    ? mt::kPlanUsage
                 : args[0] == "logits"  ? mt::kLogitsUsage
                                        : mt::kExportUsage,
                 stdout);
      return 0;
    }
    if (args[0] == "export") return mt::exportCommand(rest);
    if (args[0] == "logits") return mt::logitsCommand(rest);
    if (args[0] == "plan") return mt::planCommand(rest);
    return args[0] == "topo" ? topoCommand(rest) : predictCommand(rest);
  } catch (const mt::Error& e) {
    mt::writeLine(std::string("error: ") + e.what());
    return static_cast<int>(e.exitCode());
  }
}

// --version, --help-env, --help-nccl, --config-reference, --devices: print and exit 0.
bool printedInfo(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--version") {
      std::cout << mt::versionReport();
      return true;
    }
    if (a == "--help-env") {
      printEnvHelp();
      return true;
    }
    if (a == "--help-nccl") {  // the NCCL variables profiles and the environment are checked against
      for (const auto& name : mt::knownNcclParams()) std::printf("%s\n", name.c_str());
      // A profile's per-communicator ncclConfig_t lines, and the variable that would override each.
      for (const auto& field : mt::knownNcclConfigFields()) {
        const std::string over = mt::ncclConfigOverride(field);
        std::printf("comm.<all|world|intra|inter>.%s (ncclConfig_t %s%s)\n", field.c_str(),
                    mt::ncclConfigMember(field).c_str(), over.empty() ? "" : (", overridden by " + over).c_str());
      }
      return true;
    }
    if (a == "--config-reference") {  // the README's table, generated from the schema
      std::cout << mt::configReferenceMarkdown();
      return true;
    }
    if (a == "--devices") {  // for scripts: how many GPUs this build can use here
#ifdef MT_WITH_CUDA
      std::printf("cuda devices: %d\n", mt::cudaDeviceCountOrZero());
#else
      std::printf("cuda devices: 0 (built without CUDA)\n");
#endif
      return true;
    }
  }
  return false;
}

// Training under mpirun / srun: the setup agreed on by every rank, then the run.
int train(int argc, char** argv, const std::vector<std::string>& args) {
  const std::string preflight = mt::launchPreflightError();
  if (!preflight.empty()) {
    mt::writeLine("error: " + preflight);
    return static_cast<int>(mt::ExitCode::kBadInput);
  }
  // First, so a SIGTERM/SIGUSR1 during the seconds of setup is a clean stop after setup rather
  // than the default action (the process killed).
  mt::installStopSignals();
  mt::MpiEnvironment mpi(&argc, &argv);
  std::unique_ptr<mt::RunMetrics> metrics;  // rank 0's Prometheus endpoint; outlives the trainer
  std::unique_ptr<mt::Trainer> trainer;
  int code = 0;
  std::string message;
  try {
    if (!mpi.setupError().empty()) throw mt::ConfigError(mpi.setupError());
    mt::Config cfg = mt::Config::fromArgs(args);
    if (cfg.helpRequested()) {
      if (mpi.rank() == 0) std::cout << mt::configHelp();
      return 0;
    }
    cfg.validate();  // before the metrics server uses run.metrics_port / _linger_s (Settings checks again)
    metrics = mt::RunMetrics::start(mt::metricsExportOptions(cfg), mpi.rank());
    trainer = std::make_unique<mt::Trainer>(cfg, mpi, metrics.get());
  } catch (const mt::Error& e) {
    code = static_cast<int>(e.exitCode());
    message = std::string("error: ") + e.what();
  } catch (const std::exception& e) {
    code = static_cast<int>(mt::ExitCode::kFailure);
    message = std::string("error: internal: ") + e.what();
  }
  code = mt::agreeOnSetup(code, message, mpi.rank(), mpi.size());
  if (code) {
    trainer.reset();
    mt::finishActiveRunMetrics(mt::exitCauseOf(code, false));
    return code;
  }
  try {
    code = trainer->run();
  } catch (const mt::Error& e) {
    if (metrics && dynamic_cast<const mt::TimeoutError*>(&e)) metrics->collectiveTimeout();
    mt::abortJob(e.what(), e.exitCode(), &trainer->world(), trainer->health());
  } catch (const std::exception& e) {
    mt::abortJob(std::string("internal: ") + e.what(), mt::ExitCode::kFailure, &trainer->world(), trainer->health());
  }
  // The exit cause is counted and saved while the run directory is still this job's; the last
  // scrape is waited for once the trainer (its threads, communicators, lock) is gone.
  if (metrics) metrics->finish(mt::exitCauseOf(code, trainer->preempted()));
  trainer.reset();
  if (metrics) metrics->linger();
  return code;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (isSubcommand(args)) return runSubcommand(args);
  if (printedInfo(args)) return 0;
  return train(argc, argv, args);
}
