#pragma once
// MPI for the process: MPI_Init_thread(MPI_THREAD_MULTIPLE) on construction, MPI_Finalize on
// destruction (unless MPI was already initialised by someone else). Also answers where this rank
// sits: world rank/size and node-local rank/size (MPI_COMM_TYPE_SHARED, or emulated nodes of
// MT_NODE_SPLIT ranks so tests on one machine can act as several nodes).

#include <mpi.h>

#include <string>
#include <vector>

namespace mt {

// Every rank's `mine`, by rank (collective over `comm`).
std::vector<std::string> allGatherStrings(MPI_Comm comm, const std::string& mine);

class MpiEnvironment {
 public:
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The node as the job sees it: emulated (MT_NODE_SPLIT) or the machine.
  int localRank() const { return localRank_; }
  int localSize() const { return localSize_; }
  int nodeIndex() const { return node_; }
  int numNodes() const { return numNodes_; }
  // The machine this process runs on (MPI_COMM_TYPE_SHARED), also when nodes are emulated: what
  // chooses a rank's GPU, since emulated nodes share the machine's GPUs.
  int machineLocalRank() const { return machineLocalRank_; }
  int machineLocalSize() const { return machineLocalSize_; }
  int machineIndex() const { return machine_; }
  bool threadMultiple() const { return threadMultiple_; }
  std::string hostname() const { return hostname_; }
  // Ranks per emulated node (MT_NODE_SPLIT), 0 when nodes are real.
  int emulatedNodeSize() const { return emulated_; }
  // A configuration error found while starting (MT_NODE_SPLIT), for main to report on every rank.
  const std::string& setupError() const { return setupError_; }

 private:
  bool ownsInit_ = false;
  bool threadMultiple_ = false;
  int rank_ = 0, size_ = 1, localRank_ = 0, localSize_ = 1, node_ = 0, numNodes_ = 1, emulated_ = 0;
  int machineLocalRank_ = 0, machineLocalSize_ = 1, machine_ = 0;
  std::string hostname_;
  std::string setupError_;
};

// Held around MPI calls when the library lacks MPI_THREAD_MULTIPLE (several progress threads).
class MpiCallGuard {
 public:
  MpiCallGuard();
  ~MpiCallGuard();
  MpiCallGuard(const MpiCallGuard&) = delete;
  MpiCallGuard& operator=(const MpiCallGuard&) = delete;

 private:
  bool locked_;
};

}  // namespace mt
