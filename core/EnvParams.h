#pragma once
// The one table of environment parameters meshtrain reads (like NCCL's param table). Everything the
// environment can change is listed here with its default and meaning; `trainer --help-env` prints
// the table, and unknown MT_* variables are reported at start so a typo does not go unnoticed.

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

enum class EnvParam : int {
  kLogLevel,          // MT_LOG_LEVEL
  kNumThreads,        // MT_NUM_THREADS
  kCommTimeoutS,      // MT_COMM_TIMEOUT_S
  kFingerprint,       // MT_DEBUG_FINGERPRINT
  kHealthPort,        // MT_HEALTH_PORT
  kNodeSplit,         // MT_NODE_SPLIT
  kProfileDir,        // MT_PROFILE_DIR
  kHeartbeatS,        // MT_HEARTBEAT_TIMEOUT_S
  kGemmEpilogues,     // MT_GEMM_EPILOGUES
  kGemmAutotune,      // MT_GEMM_AUTOTUNE
  kFp8Gelu,           // MT_FP8_GELU
  kLnKernel,          // MT_LN_KERNEL
  kFp8Fused,          // MT_FP8_FUSED
  kConvAlgo,          // MT_CONV_ALGO
  kNcclShareGpu,      // MT_NCCL_SHARE_GPU_FOR_TESTS
  kTestFault,         // MT_TEST_FAULT
  kCpuAdam,           // MT_CPU_ADAM
  kCount
};

struct EnvParamInfo {
  EnvParam id;
  const char* name;
  const char* defaultValue;
  const char* help;
  // Integer parameters: the accepted range (a value outside is a ConfigError naming it).
  int64_t lo = 0, hi = 0;
};

const std::vector<EnvParamInfo>& envParamTable();
std::string envString(EnvParam p);  // value from the environment, else the default
// Throws ConfigError naming the variable if not an integer or outside the table's range.
int64_t envInt(EnvParam p);
// MT_* variables present in the environment that are not in the table.
std::vector<std::string> unknownEnvParams();

}  // namespace mt
