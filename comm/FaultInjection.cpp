#include "comm/FaultInjection.h"

#include <cstdlib>
#include <vector>

#include "core/EnvParams.h"
#include "core/Error.h"

namespace mt {

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan p;
  if (spec.empty()) return p;
  std::vector<std::string> f(1);
  for (char c : spec) {
    if (c == ':')
      f.emplace_back();
    else
      f.back() += c;
  }
  auto bad = [&](const std::string& why) {
    return ConfigError("environment variable MT_TEST_FAULT='" + spec + "': " + why +
                       " (expected <skip|resize>:<rank>:<communicator>:<op>, e.g. skip:1:world:40)");
  };
  if (f.size() != 4) throw bad("4 fields separated by ':'");
  if (f[0] == "skip")
    p.action = InjectedFault::kSkip;
  else if (f[0] == "resize")
    p.action = InjectedFault::kResize;
  else
    throw bad("unknown action '" + f[0] + "'");
  auto integer = [&](const std::string& s, const char* what) {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0) throw bad(std::string("bad ") + what + " '" + s + "'");
    return v;
  };
  p.rank = static_cast<int>(integer(f[1], "rank"));
  if (f[2].empty()) throw bad("empty communicator name");
  p.comm = f[2];
  p.op = integer(f[3], "op number");
  return p;
}

FaultPlan FaultPlan::fromEnvironment() {
  return parse(envString(EnvParam::kTestFault));
}

}  // namespace mt
