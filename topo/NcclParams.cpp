// The table of NCCL environment variables meshtrain knows: name, value kind and range, and the
// replacement of deprecated names (from NCCL's environment-variable documentation).

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "topo/Profile.h"

#include "comm/CommTuning.h"

namespace mt {

namespace {

enum class Kind { kBool, kInt, kString, kEnum, kEnumOrInt, kList };

struct ParamSpec {
  const char* name;
  Kind kind;
  long lo, hi;            // kInt
  const char* choices;    // kEnum/kList: comma-separated, case-insensitive
  const char* replacement;  // deprecated when set
};

const std::vector<ParamSpec>& table() {
  static const std::vector<ParamSpec> t = {
      {"NCCL_DEBUG", Kind::kEnum, 0, 0, "VERSION,WARN,INFO,TRACE", nullptr},
      {"NCCL_DEBUG_SUBSYS", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_DEBUG_FILE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_SOCKET_IFNAME", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_SOCKET_FAMILY", Kind::kEnum, 0, 0, "AF_INET,AF_INET6", nullptr},
      {"NCCL_SOCKET_NTHREADS", Kind::kInt, 1, 16, nullptr, nullptr},
      {"NCCL_NSOCKS_PERTHREAD", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_SOCKET_RETRY_CNT", Kind::kInt, 0, 1000, nullptr, nullptr},
      {"NCCL_IB_DISABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_HCA", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_IB_GID_INDEX", Kind::kInt, -1, 255, nullptr, nullptr},
      {"NCCL_IB_ROCE_VERSION_NUM", Kind::kInt, 1, 2, nullptr, nullptr},
      {"NCCL_IB_ADDR_FAMILY", Kind::kEnum, 0, 0, "AF_INET,AF_INET6", nullptr},
      {"NCCL_IB_ADDR_RANGE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_IB_TIMEOUT", Kind::kInt, 1, 31, nullptr, nullptr},
      {"NCCL_IB_RETRY_CNT", Kind::kInt, 0, 7, nullptr, nullptr},
      {"NCCL_IB_SL", Kind::kInt, 0, 15, nullptr, nullptr},
      {"NCCL_IB_TC", Kind::kInt, 0, 255, nullptr, nullptr},
      {"NCCL_IB_FIFO_TC", Kind::kInt, 0, 255, nullptr, nullptr},
      {"NCCL_IB_QPS_PER_CONNECTION", Kind::kInt, 1, 128, nullptr, nullptr},
      {"NCCL_IB_SPLIT_DATA_ON_QPS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_PCI_RELAXED_ORDERING", Kind::kInt, 0, 2, nullptr, nullptr},
      {"NCCL_IB_ADAPTIVE_ROUTING", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_AR_THRESHOLD", Kind::kInt, 0, 1L << 30, nullptr, nullptr},
      {"NCCL_IB_ECE_ENABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_MERGE_NICS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_MERGE_VFS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IB_USE_INLINE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NET", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_NET_PLUGIN", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_NET_GDR_LEVEL", Kind::kEnumOrInt, 0, 5, "LOC,PIX,PXB,PHB,SYS", nullptr},
      {"NCCL_NET_GDR_READ", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NET_SHARED_BUFFERS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NET_SHARED_COMMS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NET_MERGE_LEVEL", Kind::kEnum, 0, 0, "LOC,PIX,PXB,PHB,SYS", nullptr},
      {"NCCL_NET_FORCE_MERGE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_CROSS_NIC", Kind::kInt, 0, 2, nullptr, nullptr},
      {"NCCL_P2P_DISABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_P2P_LEVEL", Kind::kEnumOrInt, 0, 5, "LOC,NVL,PIX,PXB,PHB,SYS", nullptr},
      {"NCCL_P2P_DIRECT_DISABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_P2P_NET_CHUNKSIZE", Kind::kInt, 1024, 1L << 30, nullptr, nullptr},
      {"NCCL_P2P_NVL_CHUNKSIZE", Kind::kInt, 1024, 1L << 30, nullptr, nullptr},
      {"NCCL_P2P_PCI_CHUNKSIZE", Kind::kInt, 1024, 1L << 30, nullptr, nullptr},
      {"NCCL_PXN_DISABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_SHM_DISABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_SHM_USE_CUDA_MEMCPY", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_BUFFSIZE", Kind::kInt, 65536, 1L << 31, nullptr, nullptr},
      {"NCCL_NTHREADS", Kind::kEnumOrInt, 64, 512, "64,128,256,512", nullptr},
      {"NCCL_MAX_NCHANNELS", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_MIN_NCHANNELS", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_MAX_CTAS", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_MIN_CTAS", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_ALGO", Kind::kList, 0, 0, "RING,TREE,COLLNET,COLLNETDIRECT,COLLNETCHAIN,NVLS,NVLSTREE,PAT",
       nullptr},
      {"NCCL_PROTO", Kind::kList, 0, 0, "LL,LL128,SIMPLE", nullptr},
      {"NCCL_TOPO_FILE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_TOPO_DUMP_FILE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_GRAPH_FILE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_GRAPH_DUMP_FILE", Kind::kString, 0, 0, nullptr, nullptr},
      {"NCCL_NVLS_ENABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NVLS_CHUNKSIZE", Kind::kInt, 1024, 1L << 30, nullptr, nullptr},
      {"NCCL_COLLNET_ENABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_CUMEM_ENABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_LAUNCH_MODE", Kind::kEnum, 0, 0, "PARALLEL,GROUP", nullptr},
      {"NCCL_CHECK_POINTERS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_IGNORE_CPU_AFFINITY", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_COMM_BLOCKING", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_RUNTIME_CONNECT", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_GDRCOPY_ENABLE", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_MNNVL_ENABLE", Kind::kInt, 0, 2, nullptr, nullptr},
      {"NCCL_SET_THREAD_NAME", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_WORK_FIFO_DEPTH", Kind::kInt, 1024, 1L << 24, nullptr, nullptr},
      {"NCCL_MAX_P2P_NCHANNELS", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_ALLOC_P2P_NET_LL_BUFFERS", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_CGA_CLUSTER_SIZE", Kind::kInt, 0, 8, nullptr, nullptr},
      {"NCCL_COMM_SPLIT_SHARE_RESOURCES", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_NCHANNELS_PER_NET_PEER", Kind::kInt, 1, 64, nullptr, nullptr},
      {"NCCL_LAUNCH_ORDER_IMPLICIT", Kind::kBool, 0, 0, nullptr, nullptr},
      {"NCCL_HOSTID", Kind::kString, 0, 0, nullptr, nullptr},
      // Deprecated: accepted with a warning naming the replacement.
      {"NCCL_MIN_NRINGS", Kind::kInt, 1, 64, nullptr, "NCCL_MIN_NCHANNELS"},
      {"NCCL_MAX_NRINGS", Kind::kInt, 1, 64, nullptr, "NCCL_MAX_NCHANNELS"},
      {"NCCL_IB_CUDA_SUPPORT", Kind::kBool, 0, 0, nullptr, "NCCL_NET_GDR_LEVEL"},
      {"NCCL_LL_THRESHOLD", Kind::kInt, 0, 1L << 40, nullptr, "NCCL_PROTO"},
      {"NCCL_TREE_THRESHOLD", Kind::kInt, 0, 1L << 40, nullptr, "NCCL_ALGO"},
      {"NCCL_SINGLE_RING_THRESHOLD", Kind::kInt, 0, 1L << 40, nullptr, "NCCL_MAX_NCHANNELS"},
      {"NCCL_CHECKS_DISABLE", Kind::kBool, 0, 0, nullptr, "NCCL_CHECK_POINTERS"},
      {"NCCL_GRAPH_REGISTER", Kind::kBool, 0, 0, nullptr, "NCCL_CUMEM_ENABLE"},
  };
  return t;
}

// ncclConfig_t's fields a profile may set per communicator (comm.<scope>.<field>), with the
// environment variable that NCCL lets override the field in every communicator (envConfigOverride
// in NCCL's init.cc): setting both would make the per-communicator value a silent no-op.
struct ConfigSpec {
  const char* field;   // the profile's name
  const char* member;  // ncclConfig_t's
  Kind kind;
  long lo, hi;
  const char* overriddenBy;
  int CommTuning::*intField;  // null: netName
};

const std::vector<ConfigSpec>& configTable() {
  static const std::vector<ConfigSpec> t = {
      {"cga_cluster_size", "cgaClusterSize", Kind::kInt, 0, 8, "NCCL_CGA_CLUSTER_SIZE", &CommTuning::cgaClusterSize},
      {"min_ctas", "minCTAs", Kind::kInt, 1, 64, "NCCL_MIN_CTAS", &CommTuning::minCtas},
      {"max_ctas", "maxCTAs", Kind::kInt, 1, 64, "NCCL_MAX_CTAS", &CommTuning::maxCtas},
      {"net_name", "netName", Kind::kString, 0, 0, "NCCL_NET", nullptr},
      {"split_share", "splitShare", Kind::kBool, 0, 1, "NCCL_COMM_SPLIT_SHARE_RESOURCES", &CommTuning::splitShare},
      {"traffic_class", "trafficClass", Kind::kInt, 0, 255, nullptr, &CommTuning::trafficClass},
  };
  return t;
}

// The entry of table `t` whose `key` member is `name`; null if none.
template <typename Spec>
const Spec* findSpec(const std::vector<Spec>& t, const std::string& name, const char* Spec::*key) {
  for (const auto& s : t)
    if (name == s.*key) return &s;
  return nullptr;
}

std::string rangeError(long lo, long hi) {
  return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

bool inList(const std::string& v, const char* choices) {
  std::string c = choices, item;
  size_t pos = 0;
  while (pos <= c.size()) {
    size_t next = c.find(',', pos);
    item = c.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (upper(v) == item) return true;
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return false;
}

bool parseLong(const std::string& s, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtol(s.c_str(), &end, 10);
  return *end == '\0';
}

}  // namespace

std::vector<std::string> knownNcclParams() {
  std::vector<std::string> out;
  for (const auto& p : table()) out.push_back(p.name);
  return out;
}

std::vector<std::string> knownNcclConfigFields() {
  std::vector<std::string> out;
  for (const auto& c : configTable()) out.push_back(c.field);
  return out;
}

NcclParamCheck setNcclConfigField(const std::string& field, const std::string& value, CommTuning* tuning) {
  NcclParamCheck r;
  const ConfigSpec* spec = findSpec(configTable(), field, &ConfigSpec::field);
  if (!spec) return r;
  r.known = true;
  if (!spec->intField) {
    if (value.empty()) r.error = "must not be empty";
    else tuning->netName = value;
    return r;
  }
  long v = 0;
  if (!parseLong(value, &v) || v < spec->lo || v > spec->hi) {
    r.error = spec->kind == Kind::kBool ? "must be 0 or 1" : rangeError(spec->lo, spec->hi);
    return r;
  }
  tuning->*(spec->intField) = static_cast<int>(v);
  return r;
}

std::string ncclConfigOverride(const std::string& field) {
  const ConfigSpec* spec = findSpec(configTable(), field, &ConfigSpec::field);
  return spec && spec->overriddenBy ? spec->overriddenBy : "";
}

std::string ncclConfigMember(const std::string& field) {
  const ConfigSpec* spec = findSpec(configTable(), field, &ConfigSpec::field);
  return spec ? spec->member : "";
}

NcclParamCheck checkNcclParam(const std::string& key, const std::string& value) {
  NcclParamCheck r;
  const ParamSpec* spec = findSpec(table(), key, &ParamSpec::name);
  if (!spec) return r;
  r.known = true;
  if (spec->replacement) r.replacement = spec->replacement;
  long v = 0;
  switch (spec->kind) {
    case Kind::kBool:
      if (value != "0" && value != "1") r.error = "must be 0 or 1";
      break;
    case Kind::kInt:
      if (!parseLong(value, &v) || v < spec->lo || v > spec->hi)
        r.error = rangeError(spec->lo, spec->hi);
      break;
    case Kind::kEnum:
      if (!inList(value, spec->choices)) r.error = std::string("must be one of ") + spec->choices;
      break;
    case Kind::kEnumOrInt:
      if (!inList(value, spec->choices) && (!parseLong(value, &v) || v < spec->lo || v > spec->hi))
        r.error = std::string("must be one of ") + spec->choices + " or an integer in [" + std::to_string(spec->lo) +
                  ", " + std::to_string(spec->hi) + "]";
      break;
    case Kind::kList: {
      // Comma list, optionally negated with a leading ^ ("^LL128"), optionally per function
      // ("allreduce:ring;broadcast:tree"): each element must be a known name.
      std::string s = value;
      std::string cur;
      auto checkItem = [&](std::string item) {
        const size_t colon = item.find(':');
        if (colon != std::string::npos) item = item.substr(colon + 1);
        if (!item.empty() && item[0] == '^') item = item.substr(1);
        if (!item.empty() && !inList(item, spec->choices))
          r.error = "unknown element '" + item + "' (known: " + spec->choices + ")";
      };
      for (char ch : s) {
        if (ch == ',' || ch == ';') {
          checkItem(cur);
          cur.clear();
        } else {
          cur += ch;
        }
      }
      checkItem(cur);
      if (value.empty()) r.error = "must not be empty";
      break;
    }
    case Kind::kString:
      if (value.empty()) r.error = "must not be empty";
      break;
  }
  return r;
}

}  // namespace mt
