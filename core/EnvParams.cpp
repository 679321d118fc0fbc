#include "core/EnvParams.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/Error.h"

extern char** environ;

namespace mt {

const std::vector<EnvParamInfo>& envParamTable() {
  static const std::vector<EnvParamInfo> kTable = {
      {EnvParam::kLogLevel, "MT_LOG_LEVEL", "info", "log level: debug, info, warn, error"},
      {EnvParam::kNumThreads, "MT_NUM_THREADS", "0",
       "CPU threads per rank for BLAS and kernels, 0..1024; 0 = cores / ranks on the node", 0, 1024},
      {EnvParam::kCommTimeoutS, "MT_COMM_TIMEOUT_S", "0",
       "collective timeout in seconds, 0..604800 (a week); 0 = use the config's dist.timeout_s", 0, 604800},
      {EnvParam::kFingerprint, "MT_DEBUG_FINGERPRINT", "0",
       "1 = check before every collective that all ranks issue the same op, size and dtype", 0, 1},
      {EnvParam::kHealthPort, "MT_HEALTH_PORT", "0", "TCP port of rank 0's health monitor; 0 = any free port",
       0, 65535},
      {EnvParam::kNodeSplit, "MT_NODE_SPLIT", "0",
       "emulate nodes of this many ranks (tests on one machine), dividing the world size; 0 = real nodes", 0,
       1 << 20},
      {EnvParam::kProfileDir, "MT_PROFILE_DIR", "",
       "where topo.profile names are looked up; empty = the source tree's topo/profiles"},
      {EnvParam::kHeartbeatS, "MT_HEARTBEAT_TIMEOUT_S", "20",
       "seconds without a heartbeat after which the health monitor reports a rank as stopped (SIGSTOP, hung "
       "node), 0..86400; 0 = no heartbeat check",
       0, 86400},
      {EnvParam::kGemmEpilogues, "MT_GEMM_EPILOGUES", "1",
       "on the GPU in bf16/f16: 1 = the GPT MLP's GELU and its derivative run in cuBLASLt GEMM epilogues "
       "(GELU_AUX_BIAS, DGELU), the fc bias gradient in a column-sum kernel; 2 = that bias gradient in the "
       "DGELU GEMM too (DGELU_BGRAD; 8 ms slower per GPT-2 step on the H200's cuBLAS 13); 0 = separate "
       "kernels for all three (same math)",
       0, 2},
      {EnvParam::kGemmAutotune, "MT_GEMM_AUTOTUNE", "0",
       "GPU: 1 = each cuBLASLt GEMM shape's first call times the heuristic's (up to 8) algorithms and keeps the "
       "fastest; 0 = the heuristic's first (runs are then bitwise reproducible: timing may pick another algorithm "
       "from run to run)",
       0, 1},
      {EnvParam::kFp8Gelu, "MT_FP8_GELU", "3",
       "the GPT MLP's GELU with train.precision = fp8 (same math in each): 3 = inside the FP8 casts, where "
       "fc and fcProj both run in FP8 (fcProj's input cast reads the pre-activation and applies the GELU; fc's "
       "gradient cast reads fcProj's input gradient and the pre-activation and also sums fc's bias gradient), "
       "so neither the GELU's output nor its gradient is written; 0 = the FP8 GEMMs, then the GELU kernels, "
       "then the casts; on the GPU 1 = as 0 but the GELU in the fc GEMM's epilogue (cuBLASLt GELU_AUX_BIAS), "
       "2 = also its derivative in fcProj's input-gradient GEMM (DGELU). 1 and 2 measured slower than 0 (H100, "
       "cuBLAS 13, docs/performance.md)",
       0, 3},
      {EnvParam::kLnKernel, "MT_LN_KERNEL", "1",
       "LayerNorm on the GPU: 1 = warp-per-row kernels with the row in registers (C a multiple of 8, at most "
       "2048); 0 = the generic kernels for every shape (same math, for A/B timing)",
       0, 1},
      {EnvParam::kFp8Fused, "MT_FP8_FUSED", "2",
       "FP8 training on the GPU with delayed scaling (history <= 32), the same codes and scales at every level: "
       "0 = a one-thread kernel sets the scale before each cast and another pushes the amax history after it; "
       "1 = the cast kernel does both itself (its last block to finish writes the state); 2 = also the GPT blocks' "
       "LayerNorm kernels write the next GEMM's FP8 codes and their transpose, so their bf16 output is never "
       "written (d48 FP8 +0.7 % over 0 on an H100, docs/performance.md)",
       0, 2},
      {EnvParam::kConvAlgo, "MT_CONV_ALGO", "0",
       "cuDNN convolution algorithms, chosen once per geometry and precision: 0 = cuDNN's heuristic order "
       "(fastest for fashion_cnn on the H200); 1 = measured by cudnnFind among deterministic algorithms "
       "(bitwise-reproducible GPU runs; 1.3x slower there, as the heuristics' weight-gradient choice uses "
       "atomics)",
       0, 1},
      {EnvParam::kNcclShareGpu, "MT_NCCL_SHARE_GPU_FOR_TESTS", "0",
       "1 = TESTING ONLY: let several NCCL ranks share one GPU (each rank gets its own NCCL_HOSTID and talks "
       "over sockets, NCCL_IB_DISABLE=1), so multi-rank NCCL paths run on a one-GPU machine; correctness "
       "only, its timings are not throughput. 0 = such a job is refused (exit 2)",
       0, 1},
      {EnvParam::kTestFault, "MT_TEST_FAULT", "",
       "TESTING ONLY: <skip|resize>:<rank>:<communicator>:<op> makes that rank skip, or issue with half the "
       "count, that op of that communicator (how the tests show a broken collective contract ends the job)"},
      {EnvParam::kCpuAdam, "MT_CPU_ADAM", "auto",
       "the CPU AdamW kernel (host optimizer, ZeRO-Offload): auto = the widest this CPU runs (avx512, avx2, "
       "scalar); scalar | avx2 | avx512 force one (all give bitwise the same results; for A/B timing and "
       "tests). An unknown value, or one the CPU cannot run, is refused (exit 2)"},
  };
  return kTable;
}

static const EnvParamInfo& info(EnvParam p) { return envParamTable().at(static_cast<size_t>(p)); }

std::string envString(EnvParam p) {
  const EnvParamInfo& i = info(p);
  const char* v = std::getenv(i.name);
  return v ? std::string(v) : std::string(i.defaultValue);
}

int64_t envInt(EnvParam p) {
  const EnvParamInfo& i = info(p);
  std::string s = envString(p);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw ConfigError(std::string("environment variable ") + i.name + "='" + s + "' is not an integer");
  if (i.lo < i.hi && (v < i.lo || v > i.hi))
    throw ConfigError(std::string("environment variable ") + i.name + "='" + s + "' is out of range (" +
                      std::to_string(i.lo) + ".." + std::to_string(i.hi) + ")");
  return v;
}

std::vector<std::string> unknownEnvParams() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "MT_", 3) != 0) continue;
    std::string name(*e, std::strcspn(*e, "="));
    // Read by the Slurm scripts and the local cluster (scripts/slurm), not by the trainer.
    static const char* const kScriptVariables[] = {"MT_PROFILE",   "MT_TOPO_FILE",    "MT_REQUEUE",
                                                   "MT_REPO",      "MT_TRAINER",
                                                   "MT_RUN_ROOT",  "MT_SLURM_DIR",    "MT_SLURMCTLD_PORT",
                                                   "MT_SLURMD_PORT"};
    bool known = false;
    for (const auto& i : envParamTable()) known = known || name == i.name;
    for (const char* v : kScriptVariables) known = known || name == v;
    if (!known) out.push_back(name);
  }
  return out;
}

}  // namespace mt
