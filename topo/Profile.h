#pragma once
// Environment profiles (topo/profiles/*.env): the NCCL variables (and meshtrain's fabric hints) a
// fabric wants, one KEY=VALUE per line, '#' comments. Every NCCL variable is checked against one
// table (NcclParams.cpp): unknown names and bad values are ConfigErrors naming profile:line,
// deprecated names are warned about with their replacement. apply() exports them before the
// first NCCL call — a variable the user already set in the environment wins — and the effective
// set is logged and written to the run directory.
//
// meshtrain keys (lower case, not exported): fabric = ib|roce|efa|socket, nic_gbps = N (link speed
// per NIC port for the cost model when the topology file lacks it; a finite number in (0, 100000]),
// nic_efficiency (a finite number in (0, 1]).
//
// Per-communicator NCCL config (ncclConfig_t, NCCL backend only): comm.<scope>.<field> = value,
// scope = all | world | intra (the node communicators: hierarchical all-reduce's node phases,
// hybrid_shard's shard group) | inter (the rail communicators across nodes: the inter-node phase,
// hybrid_shard's replica all-reduce); field = cga_cluster_size, min_ctas, max_ctas, net_name,
// split_share, traffic_class (NcclParams.cpp's table). A scope's value beats all's. NCCL lets its
// environment variable for a field (NCCL_MAX_CTAS for max_ctas, ...) override that field in every
// communicator, so a profile or environment setting both is refused.

#include <map>
#include <string>
#include <vector>

#include "comm/CommTuning.h"

namespace mt {

constexpr double kMaxNicGbps = 100000;  // nic_gbps: 100 Tb/s, far above any NIC

struct ProfileEntry {
  std::string key, value;
  int line = 0;
};

struct Profile {
  std::string name, path;
  std::vector<ProfileEntry> nccl;           // NCCL_* in file order
  std::map<std::string, std::string> hints;  // fabric, nic_gbps, nic_efficiency
  std::vector<std::string> warnings;        // deprecated names, with their replacement
  std::vector<ProfileEntry> comm;           // comm.<scope>.<field> in file order
  std::map<std::string, CommTuning> tunings;  // per scope as written (all, world, intra, inter)

  // The config of communicators of `scope` (world, intra, inter): all's fields, then scope's.
  CommTuning tuning(const std::string& scope) const;
  // Refuses (ConfigError) a comm.*.<field> whose NCCL environment variable is in effect too
  // (`ncclEnv`: "NAME=value (origin)" lines): NCCL would silently replace the field with it.
  void checkTuningAgainst(const std::vector<std::string>& ncclEnv) const;

  // A name ("ib-ndr") is looked up in `dir`; anything with a '/' or ending in .env is a path.
  static Profile load(const std::string& nameOrPath, const std::string& dir);
  static Profile parse(const std::string& text, const std::string& path);
  // Exports the NCCL variables (not overriding the user's) and returns "KEY=VALUE (source)" lines.
  std::vector<std::string> apply() const;
};

struct NcclParamCheck {
  bool known = false;
  std::string error;        // non-empty: the value is invalid
  std::string replacement;  // non-empty: deprecated in favour of this
};
NcclParamCheck checkNcclParam(const std::string& key, const std::string& value);
// The ncclConfig_t fields of comm.<scope>.<field>: sets `field` of *tuning from `value`, or says
// why not (known = false: no such field).
NcclParamCheck setNcclConfigField(const std::string& field, const std::string& value, CommTuning* tuning);
std::vector<std::string> knownNcclConfigFields();
// The NCCL variable that overrides `field` in every communicator ("" if none), and ncclConfig_t's
// member name for it.
std::string ncclConfigOverride(const std::string& field);
std::string ncclConfigMember(const std::string& field);
constexpr const char* kCommScopes[] = {"all", "world", "intra", "inter"};
std::vector<std::string> knownNcclParams();
// The NCCL_* variables of this process's environment that `listed` ("NAME=value (origin)" lines)
// does not name yet, as "NAME=value (environment)" lines: set outside any profile, they steer NCCL
// as much as a profile does. A known variable with a bad value is a ConfigError naming it; an
// unknown NCCL_ name (a typo NCCL would silently ignore, or a newer NCCL's) is added to *warnings;
// install paths (NCCL_HOME, NCCL_ROOT, ...) that module systems export are listed, not checked.
std::vector<std::string> environmentNcclVars(const std::vector<std::string>& listed,
                                             std::vector<std::string>* warnings);
// The line of `env` ("NAME=value (origin)" lines) that sets `name`; null if none.
const std::string* findNcclEnv(const std::vector<std::string>& env, const std::string& name);
// Profiles shipped in topo/profiles (names without .env).
std::vector<std::string> listProfiles(const std::string& dir);

}  // namespace mt
