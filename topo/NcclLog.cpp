#include "topo/NcclLog.h"

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

namespace mt {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Collapses runs of blanks ("Channel 00/02 :    0   1" -> "00/02 : 0 1").
std::string squeeze(const std::string& s) {
  std::string out;
  bool blank = false;
  for (char c : s) {
    if (c == ' ' || c == '\t') {
      blank = true;
      continue;
    }
    if (blank && !out.empty()) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

}  // namespace

NcclLogSummary parseNcclDebugLog(const std::string& text) {
  NcclLogSummary s;
  // "host:pid:tid [dev] NCCL INFO message"; the thread names which comm a Channel/Trees line is of.
  static const std::regex kInfo(R"(^(\S+?):(\d+):(\d+) \[\d+\] NCCL INFO (.*)$)");
  // "[ncclCommInitRankConfig |ncclCommSplit ]comm 0x.. rank R nranks N cudaDev D nvmlDev X busId B
  //  (commId 0x..|parent 0x.. splitCount .. color .. key ..)- Init START|COMPLETE" (2.28 prints
  //  no blank before the dash after a split's key).
  static const std::regex kInit(
      R"((?:^|\s)comm (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+) cudaDev (-?\d+)(?: nvmlDev -?\d+)?(?: busId ([0-9a-fA-F]+))?(?: commId (0x[0-9a-fA-F]+))?(?: parent (0x[0-9a-fA-F]+))?.*?-\s*Init (START|COMPLETE))");
  static const std::regex kCommRanks(R"(^comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+))");
  static const std::regex kRing(R"(^Channel (\d+/\d+) :((?:\s+\d+)+)\s*$)");
  static const std::regex kP2p(R"(^Channel (\d+/\d+) : (\d+\[[0-9a-fA-F]+\] -> \d+\[[0-9a-fA-F]+\].*)$)");
  static const std::regex kTrees(R"(^Trees (.*)$)");
  static const std::regex kVersion(R"(^NCCL version (\S+))");
  static const std::regex kNetwork(R"(^Using network (.+)$)");
  static const std::regex kNic(R"(^(NET/\S+)\s*: Using (.+)$)");
  static const std::regex kEnv(R"(^(NCCL_\w+ set by environment to .*)$)");
  static const std::regex kSystemStart(R"(^=== System : (.*) ===$)");
  // Printed by the creating thread before the comm's Init START (parseCommConfig): they belong to
  // the next communicator this process starts.
  static const std::regex kConfig(R"(^Comm config (.+?) set to (.*)$)");
  static const std::regex kChannels(R"(^(\d+) coll channels,)");
  bool inSystem = false;

  std::map<std::string, size_t> byId;             // comm pointer -> index in s.comms
  std::map<std::string, size_t> currentOfThread;  // "pid:tid" -> the comm it is initialising
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> pendingConfig;  // per pid
  auto commFor = [&](const std::string& id) -> NcclLogComm& {
    auto it = byId.find(id);
    if (it != byId.end()) return s.comms[it->second];
    byId[id] = s.comms.size();
    s.comms.push_back(NcclLogComm());
    s.comms.back().id = id;
    return s.comms.back();
  };

  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    ++s.linesRead;
    if (!std::regex_match(line, m, kInfo)) continue;
    ++s.infoLines;
    const std::string thread = m[2].str() + ":" + m[3].str();
    const std::string msg = trim(m[4].str());
    std::smatch x;
    if (std::regex_match(msg, x, kConfig)) {
      pendingConfig[m[2].str()].emplace_back(x[1].str(), trim(x[2].str()));
      continue;
    }
    if (std::regex_search(msg, x, kInit)) {
      NcclLogComm& c = commFor(x[1].str());
      if (x[8].str() == "START") {
        for (const auto& [field, value] : pendingConfig[m[2].str()]) {
          if (field == "Comm name") c.name = value;
          else if (field != "Blocking") c.config.push_back(field + "=" + value);  // ours is always 0
        }
        pendingConfig.erase(m[2].str());
      }
      c.rank = std::stoi(x[2].str());
      c.nranks = std::stoi(x[3].str());
      c.cudaDev = std::stoi(x[4].str());
      if (x[5].matched) c.busId = x[5].str();
      if (x[6].matched) c.commHash = x[6].str();
      if (x[7].matched) c.parent = x[7].str();
      if (x[8].str() == "COMPLETE") {
        c.complete = true;
        currentOfThread.erase(thread);
      } else {
        currentOfThread[thread] = byId[c.id];
      }
      continue;
    }
    if (std::regex_search(msg, x, kCommRanks)) {
      NcclLogComm& c = commFor(x[1].str());
      c.rank = std::stoi(x[2].str());
      c.nranks = std::stoi(x[3].str());
      if (!c.complete) currentOfThread[thread] = byId[c.id];
      continue;
    }
    // NCCL's view of the machine (GPUs, NICs, PCI links and bandwidths), printed once per init.
    if (std::regex_match(msg, x, kSystemStart)) {
      inSystem = true;
      s.system.assign(1, squeeze(msg));
      continue;
    }
    if (inSystem) {
      if (msg.rfind("=====", 0) == 0)
        inSystem = false;
      else
        s.system.push_back(squeeze(msg));
      continue;
    }
    if (std::regex_match(msg, x, kVersion)) {
      s.version = x[1].str();
      continue;
    }
    if (std::regex_match(msg, x, kNetwork)) {
      s.network = trim(x[1].str());
      continue;
    }
    if (std::regex_match(msg, x, kNic)) {
      const std::string nic = x[1].str() + " : " + trim(x[2].str());
      bool seen = false;
      for (const auto& n : s.nics)
        seen = seen || n == nic;
      if (!seen) s.nics.push_back(nic);
      continue;
    }
    if (std::regex_match(msg, x, kEnv)) {  // logged again at every communicator's init
      if (std::find(s.envSet.begin(), s.envSet.end(), x[1].str()) == s.envSet.end())
        s.envSet.push_back(x[1].str());
      continue;
    }
    auto cur = currentOfThread.find(thread);
    // Channel/Trees lines of a thread that is initialising no known comm (another thread's, or a
    // log cut at the start) are kept under an anonymous comm rather than dropped.
    NcclLogComm& c = cur != currentOfThread.end() ? s.comms[cur->second] : commFor("?");
    if (std::regex_search(msg, x, kChannels)) {
      c.collChannels = std::stoi(x[1].str());
    } else if (std::regex_match(msg, x, kRing)) {
      c.rings.push_back(x[1].str() + " :" + " " + squeeze(x[2].str()));
    } else if (std::regex_match(msg, x, kP2p)) {
      c.p2p.push_back(x[1].str() + " : " + squeeze(x[2].str()));
    } else if (std::regex_match(msg, x, kTrees)) {
      c.trees.push_back(squeeze(x[1].str()));
    }
  }
  // The anonymous bucket only when something landed in it.
  auto it = byId.find("?");
  if (it != byId.end()) {
    const NcclLogComm& c = s.comms[it->second];
    if (c.rings.empty() && c.trees.empty() && c.p2p.empty())
      s.comms.erase(s.comms.begin() + static_cast<std::ptrdiff_t>(it->second));
  }
  return s;
}

nlohmann::json toJson(const NcclLogSummary& s) {
  nlohmann::json j;
  j["version"] = s.version;
  j["network"] = s.network;
  j["nics"] = s.nics;
  j["set_by_environment"] = s.envSet;
  j["system"] = s.system;
  j["comms"] = nlohmann::json::array();
  for (const auto& c : s.comms) {
    j["comms"].push_back({{"id", c.id},
                          {"rank", c.rank},
                          {"nranks", c.nranks},
                          {"cuda_dev", c.cudaDev},
                          {"bus_id", c.busId},
                          {"comm_hash", c.commHash},
                          {"parent", c.parent},
                          {"init_complete", c.complete},
                          {"name", c.name},
                          {"config", c.config},
                          {"coll_channels", c.collChannels},
                          {"rings", c.rings},
                          {"trees", c.trees},
                          {"p2p", c.p2p}});
  }
  j["lines"] = s.linesRead;
  j["info_lines"] = s.infoLines;
  return j;
}

}  // namespace mt
