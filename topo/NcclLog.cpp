#include "topo/NcclLog.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <string_view>
#include <utility>

namespace mt {

namespace {

// The parser is a forward scanner over string_views: nothing backtracks further than one
// optional token, so each line costs time linear in its length and no stack (std::regex matched
// "(?:\s+\d+)+" by recursion per rank and overflowed the stack on a 16,384-rank ring line).
using Sv = std::string_view;
constexpr size_t kNpos = Sv::npos;
constexpr size_t kMaxWarnings = 8;

// std::regex's \s, \d, \w in the "C" locale, which the patterns this replaces used.
bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
bool isDigit(char c) {
  return c >= '0' && c <= '9';
}
bool isHex(char c) {
  return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool isWord(char c) {
  return isDigit(c) || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool startsWith(Sv s, Sv head) {
  return s.substr(0, head.size()) == head;
}

class Scanner {
 public:
  explicit Scanner(Sv s, size_t pos = 0) : s_(s), pos_(pos) {}
  size_t pos() const { return pos_; }
  void seek(size_t pos) { pos_ = pos; }
  bool done() const { return pos_ == s_.size(); }
  Sv rest() const { return s_.substr(pos_); }
  bool lit(Sv t) {
    if (s_.substr(pos_, t.size()) != t) return false;
    pos_ += t.size();
    return true;
  }
  // One or more characters of a class (greedy); the run in *out when given.
  template <class Pred>
  bool run(Pred p, Sv* out = nullptr) {
    size_t e = pos_;
    while (e < s_.size() && p(s_[e]))
      ++e;
    if (e == pos_) return false;
    if (out) *out = s_.substr(pos_, e - pos_);
    pos_ = e;
    return true;
  }
  bool digits(Sv* out = nullptr) { return run(isDigit, out); }
  bool hex(Sv* out = nullptr) { return run(isHex, out); }
  // "-?\d+"
  bool signedInt(Sv* out) {
    const size_t start = pos_;
    lit("-");
    if (!digits()) {
      pos_ = start;
      return false;
    }
    *out = s_.substr(start, pos_ - start);
    return true;
  }
  // "0x[0-9a-fA-F]+"
  bool hexId(Sv* out) {
    const size_t start = pos_;
    if (!lit("0x") || !hex()) {
      pos_ = start;
      return false;
    }
    *out = s_.substr(start, pos_ - start);
    return true;
  }

 private:
  Sv s_;
  size_t pos_;
};

// A number that does not fit an int makes its line not match (stoi threw on it before).
bool toInt(Sv text, int* out) {
  const auto r = std::from_chars(text.data(), text.data() + text.size(), *out);
  return r.ec == std::errc() && r.ptr == text.data() + text.size();
}

Sv trimView(Sv s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == kNpos ? Sv() : s.substr(a, b - a + 1);
}

std::string trim(Sv s) {
  return std::string(trimView(s));
}

// Collapses runs of blanks ("Channel 00/02 :    0   1" -> "00/02 : 0 1").
std::string squeeze(Sv s) {
  std::string out;
  out.reserve(s.size());
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

// "host:pid:tid [dev] NCCL INFO message". The host is the first word up to its last two ':'
// (pid and tid are digits, so that split is the only one).
struct InfoLine {
  Sv pid, tid, msg;
};

bool splitInfo(Sv line, InfoLine* out) {
  size_t sp = 0;
  while (sp < line.size() && !isSpace(line[sp]))
    ++sp;
  if (sp == line.size() || line[sp] != ' ') return false;
  const Sv word = line.substr(0, sp);
  const size_t c2 = word.rfind(':');
  const size_t c1 = c2 == kNpos || c2 == 0 ? kNpos : word.rfind(':', c2 - 1);
  if (c1 == kNpos || c1 == 0) return false;
  Scanner pid(word.substr(c1 + 1, c2 - c1 - 1)), tid(word.substr(c2 + 1));
  if (!pid.digits(&out->pid) || !pid.done() || !tid.digits(&out->tid) || !tid.done()) return false;
  Scanner sc(line, sp + 1);
  if (!sc.lit("[") || !sc.digits() || !sc.lit("] NCCL INFO ")) return false;
  if (sc.rest().find_first_of("\r\n") != kNpos) return false;  // as before: '.' matched neither
  out->msg = trimView(sc.rest());
  return true;
}

// "Comm config <field> set to <value>" (the field is the shortest that is followed by " set to ").
bool matchConfig(Sv msg, Sv* field, Sv* value) {
  constexpr Sv kHead = "Comm config ", kSet = " set to ";
  if (!startsWith(msg, kHead)) return false;
  const size_t at = msg.find(kSet, kHead.size() + 1);
  if (at == kNpos) return false;
  *field = msg.substr(kHead.size(), at - kHead.size());
  *value = trimView(msg.substr(at + kSet.size()));
  return true;
}

struct InitLine {
  Sv id, busId, commHash, parent;
  int rank = 0, nranks = 0, cudaDev = 0;
  bool complete = false;
};

// The first "-\s*Init (START|COMPLETE)" at or after `from`.
bool findInitTail(Sv msg, size_t from, bool* complete) {
  for (size_t d = msg.find('-', from); d != kNpos; d = msg.find('-', d + 1)) {
    Scanner sc(msg, d + 1);
    sc.run(isSpace);
    if (!sc.lit("Init ")) continue;
    if (sc.lit("START")) return *complete = false, true;
    if (sc.lit("COMPLETE")) return *complete = true, true;
  }
  return false;
}

// "comm 0x.. rank R nranks N cudaDev D[ nvmlDev X][ busId B][ commId 0x..][ parent 0x..]" at p.
bool matchInitHead(Sv msg, size_t p, InitLine* out, size_t* end) {
  Scanner sc(msg, p);
  Sv rank, nranks, dev, skipped;
  if (!sc.lit("comm ") || !sc.hexId(&out->id) || !sc.lit(" rank ") || !sc.digits(&rank) ||
      !sc.lit(" nranks ") || !sc.digits(&nranks) || !sc.lit(" cudaDev ") || !sc.signedInt(&dev))
    return false;
  auto optional = [&sc](Sv key, auto&& value) {
    const size_t at = sc.pos();
    if (!sc.lit(key) || !value()) sc.seek(at);
  };
  optional(" nvmlDev ", [&] { return sc.signedInt(&skipped); });
  optional(" busId ", [&] { return sc.hex(&out->busId); });
  optional(" commId ", [&] { return sc.hexId(&out->commHash); });
  optional(" parent ", [&] { return sc.hexId(&out->parent); });
  *end = sc.pos();
  return toInt(rank, &out->rank) && toInt(nranks, &out->nranks) && toInt(dev, &out->cudaDev);
}

// "[ncclCommInitRankConfig |ncclCommSplit ]comm 0x.. rank R nranks N cudaDev D [nvmlDev X] [busId B]
// (commId 0x..|parent 0x.. splitCount .. color .. key ..)- Init START|COMPLETE" anywhere in the
// message, "comm" at its start or after a blank (2.28 prints no blank before the dash after a
// split's key).
bool matchInit(Sv msg, InitLine* out) {
  for (size_t p = msg.find("comm "); p != kNpos; p = msg.find("comm ", p + 1)) {
    if (p > 0 && !isSpace(msg[p - 1])) continue;
    InitLine line;
    size_t end = 0;
    if (!matchInitHead(msg, p, &line, &end)) continue;
    // No tail after this head: none after a later one either.
    if (!findInitTail(msg, end, &line.complete)) return false;
    *out = line;
    return true;
  }
  return false;
}

// "comm 0x.. rank R nRanks N ..." at the start.
bool matchCommRanks(Sv msg, Sv* id, int* rank, int* nranks) {
  Scanner sc(msg);
  Sv r, n;
  return sc.lit("comm ") && sc.hexId(id) && sc.lit(" rank ") && sc.digits(&r) && sc.lit(" nRanks ") &&
         sc.digits(&n) && toInt(r, rank) && toInt(n, nranks);
}

bool matchSystemStart(Sv msg) {
  constexpr Sv kHead = "=== System : ", kTail = " ===";
  return msg.size() >= kHead.size() + kTail.size() && startsWith(msg, kHead) &&
         msg.substr(msg.size() - kTail.size()) == kTail;
}

// "NCCL version 2.28.3+cuda13.0" (one word, the whole rest).
bool matchVersion(Sv msg, Sv* version) {
  Scanner sc(msg);
  return sc.lit("NCCL version ") && sc.run([](char c) { return !isSpace(c); }, version) && sc.done();
}

// "NET/IB : Using [0]mlx5_0:1/IB ..." -> "NET/IB : [0]mlx5_0:1/IB ...". The transport is the
// longest word after "NET/" that is followed by blanks and ": Using ", or, glued to it, "NET/X:".
bool matchNic(Sv msg, std::string* nic) {
  if (!startsWith(msg, "NET/")) return false;
  Scanner sc(msg, 4);
  Sv word;
  if (!sc.run([](char c) { return !isSpace(c); }, &word)) return false;
  size_t nameEnd = sc.pos();
  sc.run(isSpace);
  if (!sc.lit(": Using ")) {
    if (word.size() < 2 || word.back() != ':') return false;
    nameEnd -= 1;
    sc.seek(nameEnd);
    if (!sc.lit(": Using ")) return false;
  }
  if (sc.done()) return false;
  *nic = std::string(msg.substr(0, nameEnd)) + " : " + trim(sc.rest());
  return true;
}

// "NCCL_IB_HCA set by environment to mlx5_0"
bool matchEnv(Sv msg) {
  Scanner sc(msg);
  return sc.lit("NCCL_") && sc.run(isWord) && sc.lit(" set by environment to ");
}

// "2 coll channels, ..."
bool matchCollChannels(Sv msg, int* n) {
  Scanner sc(msg);
  Sv d;
  return sc.digits(&d) && sc.lit(" coll channels,") && toInt(d, n);
}

// "Channel 00/02 :" -> "00/02"
bool matchChannelHead(Scanner& sc, Sv msg, Sv* channel) {
  if (!sc.lit("Channel ")) return false;
  const size_t c0 = sc.pos();
  if (!sc.digits() || !sc.lit("/") || !sc.digits()) return false;
  *channel = msg.substr(c0, sc.pos() - c0);
  return sc.lit(" :");
}

// "Channel 00/02 :    0   1   2   3": blank-separated ranks to the end of the line.
bool matchRing(Sv msg, std::string* ring) {
  Scanner sc(msg);
  Sv channel;
  if (!matchChannelHead(sc, msg, &channel)) return false;
  const size_t g0 = sc.pos();
  size_t g1 = kNpos;
  while (sc.run(isSpace) && sc.digits())
    g1 = sc.pos();
  if (g1 == kNpos) return false;
  sc.seek(g1);
  sc.run(isSpace);
  if (!sc.done()) return false;
  *ring = std::string(channel) + " : " + squeeze(msg.substr(g0, g1 - g0));
  return true;
}

// "Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0"
bool matchP2p(Sv msg, std::string* p2p) {
  Scanner sc(msg);
  Sv channel;
  if (!matchChannelHead(sc, msg, &channel) || !sc.lit(" ")) return false;
  const Sv rest = sc.rest();
  auto peer = [&sc] { return sc.digits() && sc.lit("[") && sc.hex() && sc.lit("]"); };
  if (!peer() || !sc.lit(" -> ") || !peer()) return false;
  *p2p = std::string(channel) + " : " + squeeze(rest);
  return true;
}

class LogParser {
 public:
  NcclLogSummary run(Sv text);

 private:
  void line(Sv raw, int number);
  bool commLine(const InfoLine& in, const std::string& thread);
  bool summaryLine(Sv msg);
  void graphLine(Sv msg, const std::string& thread);
  NcclLogComm& commFor(const std::string& id);

  NcclLogSummary s_;
  bool inSystem_ = false;
  std::map<std::string, size_t> byId_;             // comm pointer -> index in s_.comms
  std::map<std::string, size_t> currentOfThread_;  // "pid:tid" -> the comm it is initialising
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> pendingConfig_;  // per pid
};

NcclLogComm& LogParser::commFor(const std::string& id) {
  auto it = byId_.find(id);
  if (it != byId_.end()) return s_.comms[it->second];
  byId_[id] = s_.comms.size();
  s_.comms.push_back(NcclLogComm());
  s_.comms.back().id = id;
  return s_.comms.back();
}

NcclLogSummary LogParser::run(Sv text) {
  size_t pos = 0;
  int number = 0;
  while (pos < text.size()) {  // lines as getline splits them: a last line without '\n' counts
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == kNpos ? text.size() : nl;
    line(text.substr(pos, end - pos), ++number);
    pos = nl == kNpos ? text.size() : nl + 1;
  }
  // The anonymous bucket only when something landed in it.
  auto it = byId_.find("?");
  if (it != byId_.end()) {
    const NcclLogComm& c = s_.comms[it->second];
    if (c.rings.empty() && c.trees.empty() && c.p2p.empty())
      s_.comms.erase(s_.comms.begin() + static_cast<std::ptrdiff_t>(it->second));
  }
  return std::move(s_);
}

void LogParser::line(Sv raw, int number) {
  ++s_.linesRead;
  if (raw.size() > kNcclLogMaxLineBytes) {
    ++s_.longLinesSkipped;
    if (s_.warnings.size() < kMaxWarnings)
      s_.warnings.push_back("line " + std::to_string(number) + ": " + std::to_string(raw.size()) +
                            " bytes, more than the " + std::to_string(kNcclLogMaxLineBytes) +
                            " bytes a line may have: not parsed");
    return;
  }
  if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);  // a log that went through CRLF
  InfoLine in;
  if (!splitInfo(raw, &in)) return;
  ++s_.infoLines;
  const std::string thread = std::string(in.pid) + ":" + std::string(in.tid);
  if (commLine(in, thread)) return;
  // NCCL's view of the machine (GPUs, NICs, PCI links and bandwidths), printed once per init.
  if (matchSystemStart(in.msg)) {
    inSystem_ = true;
    s_.system.assign(1, squeeze(in.msg));
    return;
  }
  if (inSystem_) {
    if (startsWith(in.msg, "====="))
      inSystem_ = false;
    else
      s_.system.push_back(squeeze(in.msg));
    return;
  }
  if (summaryLine(in.msg)) return;
  graphLine(in.msg, thread);
}

// A communicator's config, init START/COMPLETE or "comm .. nRanks" line.
bool LogParser::commLine(const InfoLine& in, const std::string& thread) {
  const std::string pid(in.pid);
  Sv field, value;
  // Printed by the creating thread before the comm's Init START (parseCommConfig): they belong to
  // the next communicator this process starts.
  if (matchConfig(in.msg, &field, &value)) {
    pendingConfig_[pid].emplace_back(std::string(field), std::string(value));
    return true;
  }
  InitLine init;
  if (matchInit(in.msg, &init)) {
    NcclLogComm& c = commFor(std::string(init.id));
    if (!init.complete) {
      for (const auto& [f, v] : pendingConfig_[pid]) {
        if (f == "Comm name")
          c.name = v;
        else if (f != "Blocking")
          c.config.push_back(f + "=" + v);  // ours is always 0
      }
      pendingConfig_.erase(pid);
    }
    c.rank = init.rank;
    c.nranks = init.nranks;
    c.cudaDev = init.cudaDev;
    if (!init.busId.empty()) c.busId = std::string(init.busId);
    if (!init.commHash.empty()) c.commHash = std::string(init.commHash);
    if (!init.parent.empty()) c.parent = std::string(init.parent);
    c.complete = c.complete || init.complete;
    if (init.complete)
      currentOfThread_.erase(thread);
    else
      currentOfThread_[thread] = byId_[c.id];
    return true;
  }
  Sv id;
  int rank = 0, nranks = 0;
  if (!matchCommRanks(in.msg, &id, &rank, &nranks)) return false;
  NcclLogComm& c = commFor(std::string(id));
  c.rank = rank;
  c.nranks = nranks;
  if (!c.complete) currentOfThread_[thread] = byId_[c.id];
  return true;
}

// Version, network, NICs and variables: one per log, whichever thread printed them.
bool LogParser::summaryLine(Sv msg) {
  Sv version;
  if (matchVersion(msg, &version)) {
    s_.version = std::string(version);
    return true;
  }
  constexpr Sv kNetwork = "Using network ";
  if (startsWith(msg, kNetwork) && msg.size() > kNetwork.size()) {
    s_.network = trim(msg.substr(kNetwork.size()));
    return true;
  }
  std::string nic;
  if (matchNic(msg, &nic)) {
    if (std::find(s_.nics.begin(), s_.nics.end(), nic) == s_.nics.end()) s_.nics.push_back(nic);
    return true;
  }
  if (matchEnv(msg)) {  // logged again at every communicator's init
    if (std::find(s_.envSet.begin(), s_.envSet.end(), msg) == s_.envSet.end()) s_.envSet.emplace_back(msg);
    return true;
  }
  return false;
}

void LogParser::graphLine(Sv msg, const std::string& thread) {
  auto cur = currentOfThread_.find(thread);
  // Channel/Trees lines of a thread that is initialising no known comm (another thread's, or a
  // log cut at the start) are kept under an anonymous comm rather than dropped.
  NcclLogComm& c = cur != currentOfThread_.end() ? s_.comms[cur->second] : commFor("?");
  std::string text;
  int channels = 0;
  if (matchCollChannels(msg, &channels)) {
    c.collChannels = channels;
  } else if (matchRing(msg, &text)) {
    c.rings.push_back(std::move(text));
  } else if (matchP2p(msg, &text)) {
    c.p2p.push_back(std::move(text));
  } else if (startsWith(msg, "Trees ")) {
    c.trees.push_back(squeeze(msg.substr(6)));
  }
}

}  // namespace

NcclLogSummary parseNcclDebugLog(const std::string& text) {
  return LogParser().run(text);
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
  j["long_lines_skipped"] = s.longLinesSkipped;
  j["warnings"] = s.warnings;
  return j;
}

}  // namespace mt
