#pragma once
// Lost-rank detection independent of MPI. Rank 0 listens on a TCP port; every other rank keeps one
// connection to it. The kernel closes a killed process's sockets, so rank 0 sees the EOF of a
// `kill -9`-ed rank at once, tells every other rank which rank was lost, and each rank's handler
// runs (launch/ logs the rank and the last collectives, then ends the process) — seconds, not the
// collective timeout. A rank that finishes normally says goodbye first and is not reported. If
// rank 0 itself dies, the others see their connection close and report rank 0.
// A rank that is alive but does not run (SIGSTOP, a hung node) keeps its socket open: every
// monitor thread sends a heartbeat each second, and a peer silent for `heartbeatTimeoutS` is
// reported as stopped, by rank (rank 0 watches everyone, the others watch rank 0).

#include <mpi.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mt {

class HealthMonitor {
 public:
  // exitCode: the code a peer ended the job with (it announced an abort), or 0 for a rank lost
  // (killed, crashed, stopped).
  using LostHandler = std::function<void(int lostRank, const std::string& why, int exitCode)>;
  // Collective over `world` (exchanges rank 0's address with MPI_Bcast on the calling thread).
  // port 0: any free port. When the connection cannot be made the monitor logs a warning and this
  // rank relies on collective timeouts alone.
  HealthMonitor(MPI_Comm world, LostHandler handler, int port = 0, int heartbeatTimeoutS = 20);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;
  // Leaves cleanly: peers will not report this rank when its connection closes.
  void shutdown();
  // This rank is about to end the job with an error and `exitCode`: peers report that instead of a
  // lost rank, and exit with the same code (bad input is exit 2 on every rank).
  void announceAbort(int exitCode);
  bool active() const { return active_; }

 private:
  void serverLoop();
  void clientLoop();
  void report(int rank, const std::string& why, int exitCode = 0);

  int rank_ = 0, size_ = 1;
  int heartbeatTimeoutS_ = 20;  // 0: no heartbeat checks
  LostHandler handler_;
  int listenFd_ = -1;
  int serverFd_ = -1;                  // client side: connection to rank 0
  std::vector<int> clientFds_;         // rank 0 side: index = rank
  std::vector<bool> clientLeft_;
  int wakeFds_[2] = {-1, -1};          // self-pipe to stop the poll loop
  std::atomic<bool> active_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> reported_{false};
  std::mutex sendMutex_;
  std::thread thread_;
};

}  // namespace mt
