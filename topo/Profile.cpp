#include "topo/Profile.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/Error.h"
#include "core/Files.h"
#include "core/Log.h"
#include "topo/Topology.h"

namespace mt {

namespace {
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

namespace {

// One profile file's lines into a Profile: errors name the file and the line.
struct ProfileParser {
  Profile& p;
  const std::string& path;
  int line = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("profile " + path + ":" + std::to_string(line) + ": " + why);
  }
  // NCCL_* and comm.* lines: each key once.
  void once(const std::vector<ProfileEntry>& seen, const std::string& key) const {
    for (const auto& e : seen)
      if (e.key == key) fail(key + " set twice (first on line " + std::to_string(e.line) + ")");
  }
  void hint(const std::string& key, const std::string& value) {
    if (key == "fabric") {
      Fabric f;
      if (!parseFabric(value, &f)) fail("fabric='" + value + "': expected ib, roce, efa or socket");
    } else {  // nic_gbps, nic_efficiency
      // nan passes every comparison and 1e309 parses as inf: the cost model then predicted with them.
      const double hi = key == "nic_gbps" ? kMaxNicGbps : 1;
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v <= 0 || v > hi)
        fail(key + "='" + value + "': expected a finite number in (0, " +
             (key == "nic_gbps" ? "100000" : "1") + "]");
    }
    p.hints[key] = value;
  }
  void ncclVariable(const std::string& key, const std::string& value) {
    NcclParamCheck c = checkNcclParam(key, value);
    if (!c.known) fail("unknown NCCL variable " + key);
    if (!c.error.empty()) fail(key + "='" + value + "': " + c.error);
    if (!c.replacement.empty())
      p.warnings.push_back("profile " + path + ":" + std::to_string(line) + ": " + key +
                           " is deprecated, use " + c.replacement);
    once(p.nccl, key);
    p.nccl.push_back({key, value, line});
  }
  void commField(const std::string& key, const std::string& value) {
    const size_t dot = key.find('.', 5);
    const std::string scope = key.substr(5, dot == std::string::npos ? std::string::npos : dot - 5);
    const std::string field = dot == std::string::npos ? "" : key.substr(dot + 1);
    bool scopeKnown = false;
    for (const char* sc : kCommScopes)
      scopeKnown = scopeKnown || scope == sc;
    if (!scopeKnown) fail(key + ": unknown communicator scope '" + scope + "' (all, world, intra, inter)");
    NcclParamCheck c = setNcclConfigField(field, value, &p.tunings[scope]);
    if (!c.known) {
      std::string known;
      for (const auto& f : knownNcclConfigFields())
        known += (known.empty() ? "" : ", ") + f;
      fail(key + ": unknown ncclConfig_t field '" + field + "' (" + known + ")");
    }
    if (!c.error.empty()) fail(key + "='" + value + "': " + c.error);
    once(p.comm, key);
    p.comm.push_back({key, value, line});
  }
  void parseLine(const std::string& text) {
    std::string s = trim(text);
    if (s.empty() || s[0] == '#') return;
    if (s.rfind("export ", 0) == 0) s = trim(s.substr(7));
    const size_t eq = s.find('=');
    if (eq == std::string::npos) fail("expected KEY=VALUE, got '" + s + "'");
    std::string key = trim(s.substr(0, eq)), value = trim(s.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    if (key == "fabric" || key == "nic_gbps" || key == "nic_efficiency")
      hint(key, value);
    else if (key.rfind("NCCL_", 0) == 0)
      ncclVariable(key, value);
    else if (key.rfind("comm.", 0) == 0)
      commField(key, value);
    else
      fail("unknown key " + key +
           " (NCCL_* variables, comm.<scope>.<field>, or fabric, nic_gbps, nic_efficiency)");
  }
};

}  // namespace

Profile Profile::parse(const std::string& text, const std::string& path) {
  Profile p;
  p.path = path;
  ProfileParser parser{p, path};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    ++parser.line;
    parser.parseLine(line);
  }
  // NCCL refuses minCTAs > maxCTAs (ncclInvalidArgument at the communicator's creation): here,
  // with the file's name, for every scope as it resolves.
  for (const char* scope : {"world", "intra", "inter"}) {
    const CommTuning t = p.tuning(scope);
    if (t.minCtas >= 0 && t.maxCtas >= 0 && t.minCtas > t.maxCtas)
      throw ConfigError("profile " + path + ": communicators of scope " + scope + " get min_ctas " +
                        std::to_string(t.minCtas) + " > max_ctas " + std::to_string(t.maxCtas));
  }
  return p;
}

CommTuning Profile::tuning(const std::string& scope) const {
  CommTuning t;
  auto all = tunings.find("all");
  if (all != tunings.end()) t = all->second;
  auto it = tunings.find(scope);
  if (it != tunings.end()) t = t.overriddenBy(it->second);
  return t;
}

void Profile::checkTuningAgainst(const std::vector<std::string>& ncclEnv) const {
  for (const auto& e : comm) {
    const std::string field = e.key.substr(e.key.rfind('.') + 1);
    const std::string var = ncclConfigOverride(field);
    if (const std::string* l = var.empty() ? nullptr : findNcclEnv(ncclEnv, var))
      throw ConfigError("profile " + path + ":" + std::to_string(e.line) + ": " + e.key + " sets ncclConfig_t " +
                        ncclConfigMember(field) + ", but " + *l + " is in effect and NCCL lets " + var +
                        " override it in every communicator: remove one of the two");
  }
}

Profile Profile::load(const std::string& nameOrPath, const std::string& dir) {
  std::string path = nameOrPath;
  const bool isPath = nameOrPath.find('/') != std::string::npos ||
                      (nameOrPath.size() > 4 && nameOrPath.substr(nameOrPath.size() - 4) == ".env");
  if (!isPath) path = dir + "/" + nameOrPath + ".env";
  std::string text, why;
  if (!readWholeFile(path, &text, &why)) {
    std::string known;
    for (const auto& n : listProfiles(dir)) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("profile " + path + ": cannot be read: " + why +
                      (isPath ? "" : " (profiles in " + dir + ": " + known + ")"));
  }
  Profile p = parse(text, path);
  p.name = isPath ? path : nameOrPath;
  return p;
}

std::vector<std::string> Profile::apply() const {
  std::vector<std::string> effective;
  for (const auto& w : warnings) MT_LOG_WARN << w;
  for (const auto& e : nccl) {
    const char* existing = std::getenv(e.key.c_str());
    if (existing) {
      effective.push_back(e.key + "=" + existing + " (environment; profile says " + e.value + ")");
    } else {
      setenv(e.key.c_str(), e.value.c_str(), 0);
      effective.push_back(e.key + "=" + e.value + " (profile " + name + ")");
    }
  }
  return effective;
}

const std::string* findNcclEnv(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& l : env)
    if (l.size() > name.size() && l.compare(0, name.size(), name) == 0 && l[name.size()] == '=') return &l;
  return nullptr;
}

std::vector<std::string> environmentNcclVars(const std::vector<std::string>& listed,
                                             std::vector<std::string>* warnings) {
  static const char* const kInstallPaths[] = {"NCCL_HOME", "NCCL_ROOT", "NCCL_DIR", "NCCL_PATH", "NCCL_LIB_DIR",
                                              "NCCL_INCLUDE_DIR", "NCCL_VERSION", "NCCL_LIBRARY"};
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("NCCL_", 0) != 0 || eq == std::string::npos) continue;
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (findNcclEnv(listed, key)) continue;
    out.push_back(key + "=" + value + " (environment)");
    bool install = false;
    for (const char* p : kInstallPaths) install = install || key == p;
    if (install) continue;
    const NcclParamCheck c = checkNcclParam(key, value);
    if (!c.known) {
      if (warnings)
        warnings->push_back("environment variable " + key + " is not an NCCL parameter meshtrain knows (a typo is "
                            "ignored by NCCL without a word; trainer --help-nccl lists the known ones)");
    } else if (!c.error.empty()) {
      throw ConfigError("environment variable " + key + "=" + value + ": " + c.error);
    } else if (!c.replacement.empty() && warnings) {
      warnings->push_back("environment variable " + key + " is deprecated: use " + c.replacement);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> listProfiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string f = e->d_name;
      if (f.size() > 4 && f.substr(f.size() - 4) == ".env") out.push_back(f.substr(0, f.size() - 4));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mt
