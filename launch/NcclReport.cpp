#include "launch/NcclReport.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Files.h"
#include "core/Log.h"
#include "topo/NcclLog.h"

#ifdef MT_WITH_CUDA
#include <nccl.h>
#endif

namespace mt {

namespace fs = std::filesystem;

std::vector<std::vector<int>> groupsFromIds(const std::vector<int>& ids) {
  std::map<int, std::vector<int>> byId;
  for (size_t r = 0; r < ids.size(); ++r)
    byId[ids[r]].push_back(static_cast<int>(r));
  std::vector<std::vector<int>> out;
  for (auto& kv : byId)
    out.push_back(std::move(kv.second));
  return out;
}

namespace {

// Each rank's group id over the world: the lowest world rank of its group in `c`.
std::vector<int> groupIds(Communicator& world, Communicator& c, int worldRank) {
  Tensor mine = Tensor::empty({1}, DType::kI32);
  mine.data<int32_t>()[0] = worldRank;
  Tensor members = Tensor::empty({c.size()}, DType::kI32);
  c.allGather(mine, members)->wait(c.timeout());
  const int32_t* m = members.data<int32_t>();
  mine.data<int32_t>()[0] = *std::min_element(m, m + c.size());
  Tensor all = Tensor::empty({world.size()}, DType::kI32);
  world.allGather(mine, all)->wait(world.timeout());
  return std::vector<int>(all.data<int32_t>(), all.data<int32_t>() + world.size());
}

// The files NCCL_DEBUG_FILE names, for every process: its %h and %p as wildcards.
std::vector<std::string> debugFiles(const std::string& pattern) {
  std::vector<std::string> out;
  const fs::path p(pattern);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  const std::string name = p.filename().string();
  auto matches = [&](const std::string& f) {
    // '%h', '%p' and any other %x match any run of characters; the rest literally.
    size_t i = 0, j = 0, starI = std::string::npos, starJ = 0;
    while (j < f.size()) {
      if (i + 1 < name.size() && name[i] == '%') {
        starI = i += 2;
        starJ = j;
      } else if (i < name.size() && name[i] == f[j]) {
        ++i, ++j;
      } else if (starI != std::string::npos) {
        i = starI;
        j = ++starJ;
      } else {
        return false;
      }
    }
    while (i + 1 < name.size() && name[i] == '%')
      i += 2;
    return i == name.size();
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && matches(e.path().filename().string())) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every communicator and the groups of world ranks it joins; collective: identical on every rank.
nlohmann::json communicatorsJson(Communicator& world, int worldRank,
                                 const std::vector<Communicator*>& groups) {
  nlohmann::json comms = nlohmann::json::array();
  std::vector<Communicator*> all{&world};
  all.insert(all.end(), groups.begin(), groups.end());
  for (Communicator* c : all) {
    const auto g = groupsFromIds(groupIds(world, *c, worldRank));
    comms.push_back({{"name", c->name()},
                     {"backend", c->backend()},
                     {"size", c->size()},
                     {"count", g.size()},
                     {"groups", g},
                     {"nccl_config", c->options().tuning.describe()}});
  }
  return comms;
}

// Every rank's place, as the ranks told each other at start (launch/TopologySetup).
nlohmann::json layoutJson(const TopologySetup& topo) {
  const RankLayout& l = topo.layout;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& p : l.placements) {
    nlohmann::json nics = nlohmann::json::array();
    for (int n : p.nics) {
      std::string names;
      for (const auto& net : topo.topology->nics()[static_cast<size_t>(n)].nets)
        names += (names.empty() ? "" : ",") + net.name;
      nics.push_back({{"nic", n}, {"devices", names}});
    }
    ranks.push_back({{"rank", p.rank},
                     {"host", p.host},
                     {"node", p.node},
                     {"slot", p.localRank},
                     {"gpu_busid", p.busid},
                     {"gpu_emulated", p.gpuFromFile},
                     {"numa", p.numa},
                     {"rail", nics},
                     {"rail_path", p.nics.empty() ? "" : pathTypeName(p.railPath)},
                     {"nic_binding", p.nicBinding}});
  }
  return {{"nodes", l.nodes},
          {"ranks_per_node", l.ranksPerNode},
          {"uniform", l.uniform},
          {"rail_aligned", l.railAligned},
          {"intra_node_groups", l.intraNode},
          {"rail_groups", l.rails},
          {"problems", l.problems},
          {"ranks", ranks}};
}

// NCCL's own debug logs (NCCL_DEBUG=INFO into NCCL_DEBUG_FILE), parsed; notes say why there are none.
nlohmann::json ncclLogsJson(const char* backend, std::vector<std::string>& notes) {
  nlohmann::json logs = nlohmann::json::array();
  const char* file = std::getenv("NCCL_DEBUG_FILE");
  const char* level = std::getenv("NCCL_DEBUG");
  if (std::string(backend) != "nccl") {
    notes.push_back(std::string("backend ") + backend + ": NCCL was not used, so it chose no rings or NICs");
  } else if (!level || std::string(level) != "INFO") {
    notes.push_back(std::string("NCCL_DEBUG is ") + (level ? level : "unset") +
                    ", not INFO: NCCL logged none of its choices (a profile or the environment set it)");
  } else if (!file) {
    notes.push_back("NCCL_DEBUG_FILE is unset: NCCL's log went to the ranks' standard output");
  } else {
    const std::vector<std::string> paths = debugFiles(file);
    for (const auto& path : paths) {
      // Bounded like every whole-file read (kWholeFileLimit, regular files only); the parser is
      // linear and counts lines too long to keep (long_lines_skipped).
      std::string text, why;
      if (!readWholeFile(path, &text, &why)) {
        notes.push_back(path + ": not read: " + why);  // removed since it was listed, or too large
        continue;
      }
      nlohmann::json one = toJson(parseNcclDebugLog(text));
      one["file"] = path;
      logs.push_back(one);
    }
    if (paths.empty()) notes.push_back(std::string("no file matches NCCL_DEBUG_FILE=") + file);
  }
  return logs;
}

}  // namespace

void writeNcclReport(const std::string& runDir, Communicator& world, int worldRank,
                     const std::vector<Communicator*>& groups, const TopologySetup& topo) {
  // Collective part first, identical on every rank.
  const nlohmann::json comms = communicatorsJson(world, worldRank, groups);
  world.barrierSync();  // every rank's NCCL has initialised its communicators and logged it
  if (worldRank != 0) return;

  nlohmann::json j;
  j["written_by"] = "meshtrain topo.report";
  j["backend"] = world.backend();
  j["world_size"] = world.size();
#ifdef MT_WITH_CUDA
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) j["nccl_version_code"] = v;
#endif
  j["profile"] = topo.profile ? topo.profile->name : "";
  j["topology_file"] = topo.topology ? topo.topology->source() : "";
  j["env"] = nlohmann::json::array();
  for (const auto& l : topo.ncclEnv) {
    const NcclEnvEntry e = parseNcclEnvEntry(l);
    j["env"].push_back({{"name", e.name}, {"value", e.value}, {"origin", e.origin}});
  }
  j["communicators"] = comms;
  j["layout"] = layoutJson(topo);
  std::vector<std::string> notes;
  const nlohmann::json logs = ncclLogsJson(world.backend(), notes);
  j["nccl_logs"] = logs;
  j["notes"] = notes;
  const std::string out = runDir + "/nccl_report.json";
  std::ofstream f(out);
  f << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";  // NCCL's logs are not UTF-8
  if (!f) throw IoError("cannot write " + out);
  MT_LOG_INFO << "wrote " << out << " (" << comms.size() << " communicator(s), " << logs.size()
              << " NCCL log(s))";
}

}  // namespace mt
