#pragma once
// A run directory belongs to one job at a time, and a fresh start does not mix with the run before.
//
// The lock is <run_dir>/run.lock, held by rank 0 for the whole job. It is made with link(2): rank 0
// writes its details to a file of its own and links it to run.lock, which either appears whole or
// fails with EEXIST — atomic on local disks, NFS (a lost reply to a link that was made is recognised
// by our file's link count) and Lustre alike. Advisory locks (flock, fcntl) are not used: on NFS
// mounted `nolock` and on Lustre mounted `localflock` they silently lock one node only, and on
// Lustre without `flock` they fail. A lock file outlives a killed holder, so it says who holds it
// (host, pid, start time, Slurm job; the machine's boot id, pid namespace and the process's start
// tick) and the holder refreshes its mtime every 10 s (the heartbeat).
//
// Stale rule — a lock is taken over, with a warning naming its holder, when
//   - its holder ran on this machine (same boot id and pid namespace) and that process is gone (no
//     such pid, or the pid now belongs to a later process): at once;
//   - its holder ran anywhere else (another host, container or boot) and its heartbeat is older than
//     run.lock_stale_s (300 s by default), measured on the filesystem's own clock (the lock's mtime
//     against that of a file just written beside it), so the hosts' clocks do not matter.
// Any other lock is a live job: the new one exits 2 naming it. A job that ends, normally or through
// abortJob, removes its lock; one killed outright leaves it to the rule above.

#include <memory>
#include <string>

namespace mt {

// abortJob and a lost peer end the process without unwinding: the lock this process holds, if
// any, is removed first so that a restart on another host need not wait out run.lock_stale_s.
void releaseRunDirLockBeforeExit();

class RunDirLock {
 public:
  // Takes <dir>/run.lock (creating dir), or throws ConfigError naming the job that holds it.
  // Not collective: rank 0 alone calls it.
  static std::unique_ptr<RunDirLock> acquire(const std::string& dir, int staleAfterS);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  friend void releaseRunDirLockBeforeExit();
  struct Impl;
  explicit RunDirLock(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// checkpoint.resume = never in a directory that holds a previous run: that run's files
// (config.ini, metrics.jsonl, PREEMPTED, nccl.env, nccl_report.json, NCCL logs, traces, pid files)
// move to <run_dir>/archive/<UTC time>/ and its checkpoints (step_*) to
// <checkpoint.dir>/archive/<UTC time>/, by rename. Returns what moved where, for the log ("" when
// nothing did). Throws ConfigError naming the file that could not be moved. Rank 0, under the lock.
std::string archivePreviousRun(const std::string& runDir, const std::string& checkpointDir);

}  // namespace mt
