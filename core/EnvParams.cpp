#include "core/EnvParams.h"

#include <cstdlib>
#include <cstring>

#include "core/Error.h"

extern char** environ;

namespace mt {

const std::vector<EnvParamInfo>& envParamTable() {
  static const std::vector<EnvParamInfo> kTable = {
      {EnvParam::kLogLevel, "MT_LOG_LEVEL", "info", "log level: debug, info, warn, error"},
      {EnvParam::kNumThreads, "MT_NUM_THREADS", "0",
       "CPU threads per rank for BLAS and kernels; 0 = cores / ranks on the node"},
      {EnvParam::kCommTimeoutS, "MT_COMM_TIMEOUT_S", "0",
       "collective timeout in seconds; 0 = use the config's dist.timeout_s"},
      {EnvParam::kFingerprint, "MT_DEBUG_FINGERPRINT", "0",
       "1 = check before every collective that all ranks issue the same op, size and dtype"},
      {EnvParam::kHealthPort, "MT_HEALTH_PORT", "0", "TCP port of rank 0's health monitor; 0 = any free port"},
      {EnvParam::kNodeSplit, "MT_NODE_SPLIT", "0",
       "emulate nodes of this many ranks (tests on one machine); 0 = real nodes"},
      {EnvParam::kProfileDir, "MT_PROFILE_DIR", "", "where topo.profile names are looked up; empty = the source tree's topo/profiles"},
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
  std::string s = envString(p);
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0')
    throw ConfigError(std::string("environment variable ") + info(p).name + "='" + s + "' is not an integer");
  return v;
}

std::vector<std::string> unknownEnvParams() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "MT_", 3) != 0) continue;
    std::string name(*e, std::strcspn(*e, "="));
    bool known = false;
    for (const auto& i : envParamTable()) known = known || name == i.name;
    if (!known) out.push_back(name);
  }
  return out;
}

}  // namespace mt
