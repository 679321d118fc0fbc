#pragma once
// What NCCL decided, read back from its own debug output (NCCL_DEBUG=INFO with
// NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV written to NCCL_DEBUG_FILE): its version, the network it chose
// and the NICs behind it, and per communicator its size, this rank's place, the rings (channels)
// and trees it built. topo.report = true writes these into <run_dir>/nccl_report.json, so that a
// profile's effect is seen in what NCCL did rather than in what was exported.
//
// The lines are NCCL's INFO lines, "host:pid:tid [dev] NCCL INFO <message>". Lines of other
// subsystems or of other formats are skipped; nothing here depends on NCCL's build. Parsing takes
// time linear in the text and no stack per character (a hand-written scanner, no std::regex);
// a line longer than kNcclLogMaxLineBytes is not parsed but counted, with a warning naming it.

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt {

// The longest line parsed: a ring of 131,072 ranks ("Channel 00/02 : 0 1 ... 131071", ~0.8 MB)
// fits; a longer line is no ring NCCL prints for any job that exists, and keeping it would put
// megabytes of one line into nccl_report.json.
constexpr size_t kNcclLogMaxLineBytes = 1u << 20;

struct NcclLogComm {
  std::string id;  // NCCL's comm pointer, e.g. "0x55d0c1a0" (unique within one process)
  int rank = -1, nranks = 0, cudaDev = -1;
  std::string busId, commHash;
  std::string parent;              // split communicators: the comm they were split from
  bool complete = false;           // "Init COMPLETE" seen
  std::string name;                // ncclConfig_t commName ("world.inter"), when the caller set one
  std::vector<std::string> config; // "Max CTAs=2": the config fields NCCL reports as set
  int collChannels = -1;           // "N coll channels, ...": the channels (CTAs) it will use
  std::vector<std::string> rings;  // "00/02 : 0 1 2 3" (channel/channels : ring order)
  std::vector<std::string> trees;  // "[0] -1/-1/-1->0->1 ..." as NCCL prints them
  std::vector<std::string> p2p;    // "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM" connections
};

struct NcclLogSummary {
  std::string version;              // "2.28.3+cuda13.0"
  std::string network;              // "IB", "Socket", "AWS Libfabric", ... ("Using network X")
  std::vector<std::string> nics;    // "NET/IB : Using [0]mlx5_0:1/IB [1]..." (the part after Using)
  std::vector<std::string> envSet;  // "NCCL_IB_HCA set by environment to mlx5_0"
  std::vector<std::string> system;  // NCCL's topology as it detected it ("=== System ..." block)
  std::vector<NcclLogComm> comms;   // in the order NCCL initialised them
  int linesRead = 0, infoLines = 0;
  int longLinesSkipped = 0;           // lines over kNcclLogMaxLineBytes, not parsed
  std::vector<std::string> warnings;  // "line 7: 7000000 bytes, more than ...": the first few
};

NcclLogSummary parseNcclDebugLog(const std::string& text);
nlohmann::json toJson(const NcclLogSummary& s);

}  // namespace mt
