#include "launch/RunDirectory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Files.h"
#include "core/Log.h"
#include "launch/TopologySetup.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = "run.lock";
constexpr int kHeartbeatS = 10;

std::string firstLineOf(const std::string& path) {
  std::string text;
  if (!readWholeFile(path, &text, nullptr, 4096)) return "";
  return text.substr(0, text.find('\n'));
}

std::string utcTime(std::time_t t, const char* format) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

// The start of process `pid` in clock ticks after boot (/proc/<pid>/stat field 22), 0 if unknown:
// with the pid it tells a live holder from a later process that reuses its pid.
unsigned long long processStartTick(long pid) {
  std::string stat;
  if (!readWholeFile("/proc/" + std::to_string(pid) + "/stat", &stat, nullptr, 1 << 16)) return 0;
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  const char* p = stat.c_str() + close + 2;  // field 3 (state) onwards
  for (int field = 3; field < 22 && *p; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return 0;
    ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

// Who holds (or wants) the lock: what the lock file says.
struct Holder {
  std::string host, bootId, pidNs, started, job, token;
  long pid = 0;
  unsigned long long pidStart = 0;

  static Holder self() {
    Holder h;
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    h.host = host;
    h.bootId = firstLineOf("/proc/sys/kernel/random/boot_id");
    char ns[128] = {0};
    if (::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1) > 0) h.pidNs = ns;
    h.pid = static_cast<long>(::getpid());
    h.pidStart = processStartTick(h.pid);
    h.started = utcTime(std::time(nullptr), "%Y-%m-%d %H:%M:%S UTC");
    if (const char* job = std::getenv("SLURM_JOB_ID")) h.job = job;
    std::random_device rd;
    char token[40];
    std::snprintf(token, sizeof(token), "%08x%08x%08x", rd(), rd(), rd());
    h.token = token;
    return h;
  }
  std::string json() const {
    return nlohmann::json{{"host", host},      {"pid", pid},      {"started", started},    {"slurm_job", job},
                          {"boot_id", bootId}, {"pid_ns", pidNs}, {"pid_start", pidStart}, {"token", token}}
               .dump() +
           "\n";
  }
  static bool parse(const std::string& text, Holder* h) {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      h->host = j.at("host").get<std::string>();
      h->pid = j.at("pid").get<long>();
      h->started = j.value("started", std::string());
      h->job = j.value("slurm_job", std::string());
      h->bootId = j.value("boot_id", std::string());
      h->pidNs = j.value("pid_ns", std::string());
      h->pidStart = j.value("pid_start", 0ull);
      h->token = j.at("token").get<std::string>();
      return h->pid > 0;
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }
  std::string describe() const {
    std::string s = "pid " + std::to_string(pid) + " on host " + host;
    if (!job.empty()) s += " (Slurm job " + job + ")";
    return s + ", started " + started;
  }
};

// What is in the lock file now. `found` false: it is gone (released meanwhile).
struct LockState {
  bool found = false, readable = false;
  Holder holder;
  std::time_t mtime = 0;
  ino_t inode = 0;
};

LockState readLock(const std::string& path) {
  LockState s;
  std::string text;
  const bool read = readWholeFile(path, &text, nullptr, 1 << 16);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return s;  // after the open, which refreshed NFS's attributes
  s.found = true;
  s.mtime = st.st_mtime;
  s.inode = st.st_ino;
  s.readable = read && Holder::parse(text, &s.holder);
  return s;
}

bool sameProcessSpace(const Holder& a, const Holder& b) {
  return !a.bootId.empty() && a.bootId == b.bootId && a.pidNs == b.pidNs;
}

bool processAlive(const Holder& h) {
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno != EPERM) return false;
  const unsigned long long start = processStartTick(h.pid);
  return h.pidStart == 0 || start == 0 || start == h.pidStart;
}

// Why the lock is stale, or "" when its holder must be taken to be alive.
std::string staleReason(const LockState& lock, const Holder& me, std::time_t fsNow, int staleAfterS) {
  if (lock.readable && sameProcessSpace(lock.holder, me))
    return processAlive(lock.holder) ? "" : "its process is gone";
  const long age = static_cast<long>(fsNow - lock.mtime);
  if (age > staleAfterS)
    return "its heartbeat stopped " + std::to_string(age) +
           " s ago (run.lock_stale_s = " + std::to_string(staleAfterS) + ")";
  return "";
}

[[noreturn]] void refuse(const std::string& dir, const std::string& path, const LockState& lock,
                         std::time_t fsNow, const Holder& me, int staleAfterS) {
  const long age = std::max<long>(0, static_cast<long>(fsNow - lock.mtime));
  std::string who = lock.readable ? lock.holder.describe() : "a job whose lock file is unreadable";
  std::string msg = "run directory " + dir + " is in use by another job: " + who + " (" + path +
                    ", refreshed " + std::to_string(age) +
                    " s ago). Wait for it to end, or use another --run.name";
  if (!lock.readable || !sameProcessSpace(lock.holder, me))
    msg += "; a lock from another machine is taken over once not refreshed for run.lock_stale_s = " +
           std::to_string(staleAfterS) + " s";
  throw ConfigError(msg + "; if that job is certainly gone, delete " + path);
}

// Moves a stale lock out of the way. The rename is atomic; the file renamed is checked to be the
// one judged stale (a job that took the lock meanwhile gets its file back).
void takeOver(const std::string& path, const LockState& stale, const std::string& reason, const Holder& me) {
  const std::string aside = path + ".stale-" + me.token;
  if (::rename(path.c_str(), aside.c_str()) != 0) return;  // gone already: try again
  struct stat st {};
  if (::stat(aside.c_str(), &st) == 0 && st.st_ino != stale.inode) {
    if (::link(aside.c_str(), path.c_str()) != 0)
      MT_LOG_ERROR << "run directory lock " << path << " changed hands while a stale lock was taken over";
    ::unlink(aside.c_str());
    return;
  }
  ::unlink(aside.c_str());
  MT_LOG_WARN << "took over the stale run directory lock " << path << " of "
              << (stale.readable ? stale.holder.describe() : std::string("an unknown job")) << ": " << reason;
}

// Our details in a file of our own beside the lock; returns its mtime (the filesystem's "now").
std::time_t writeOwnFile(const std::string& file, const Holder& me, const std::string& dir) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const std::string text = me.json();
  const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  struct stat st {};
  const bool statted = fd >= 0 && ::fstat(fd, &st) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok || !statted) {
    ::unlink(file.c_str());
    throw ConfigError("run directory " + dir + " is not writable: " + file + ": " + std::strerror(err));
  }
  return st.st_mtime;
}

// One attempt to create the lock: true when it is ours.
bool tryCreate(const std::string& own, const std::string& path, const Holder& me, const std::string& dir) {
  if (::link(own.c_str(), path.c_str()) == 0) return true;
  const int err = errno;
  if (err == EEXIST) return false;
  struct stat st {};
  if (::stat(own.c_str(), &st) == 0 && st.st_nlink == 2)
    return true;  // NFS: the reply was lost, not the link
  if (err == EPERM || err == ENOSYS || err == EOPNOTSUPP) {
    // No hard links on this filesystem: an exclusive create, atomic wherever links are missing.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) return false;
    const std::string text = me.json();
    if (fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
        ::fsync(fd) == 0) {
      ::close(fd);
      return true;
    }
    if (fd >= 0) ::close(fd);
  }
  throw ConfigError("cannot lock run directory " + dir + ": " + path + ": " + std::strerror(err));
}

std::mutex gHeldMutex;
RunDirLock* gHeld = nullptr;  // the lock this process holds (one per process)

}  // namespace

struct RunDirLock::Impl {
  std::string path;
  Holder me;
  int fd = -1;  // our lock file, touched through the descriptor: our inode, whatever the name says
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false, warned = false;
  std::thread heartbeat;

  bool stillOurs() const {
    const LockState now = readLock(path);
    return now.readable && now.holder.token == me.token;
  }
  void beat() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, std::chrono::seconds(kHeartbeatS), [this] { return stopping; })) {
      ::futimens(fd, nullptr);
      if (!warned && !stillOurs()) {
        warned = true;
        const LockState now = readLock(path);
        MT_LOG_ERROR << "the run directory lock " << path << " is no longer this job's (now: "
                     << (now.readable ? now.holder.describe() : std::string("none"))
                     << "): another job may be "
                     << "writing into this run directory";
      }
    }
  }
  // Removes the lock file when it is still ours.
  void release() {
    if (stillOurs()) ::unlink(path.c_str());
  }
};

RunDirLock::RunDirLock(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), path_(impl_->path) {
  impl_->heartbeat = std::thread([p = impl_.get()] { p->beat(); });
  std::lock_guard<std::mutex> g(gHeldMutex);
  gHeld = this;
}

RunDirLock::~RunDirLock() {
  {
    std::lock_guard<std::mutex> g(gHeldMutex);
    gHeld = nullptr;
  }
  {
    std::lock_guard<std::mutex> g(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
  impl_->release();
  if (impl_->fd >= 0) ::close(impl_->fd);
}

std::unique_ptr<RunDirLock> RunDirLock::acquire(const std::string& dir, int staleAfterS) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError("run.dir: cannot create the run directory " + dir + ": " + ec.message());
  auto impl = std::make_unique<Impl>();
  impl->path = dir + "/" + kLockName;
  impl->me = Holder::self();
  const std::string own = impl->path + "." + impl->me.token;
  const std::time_t fsNow = writeOwnFile(own, impl->me, dir);
  bool ours = false;
  try {
    for (int attempt = 0; attempt < 5 && !ours; ++attempt) {
      ours = tryCreate(own, impl->path, impl->me, dir);
      if (ours) break;
      const LockState lock = readLock(impl->path);
      if (!lock.found) continue;  // released meanwhile
      const std::string reason = staleReason(lock, impl->me, fsNow, staleAfterS);
      if (reason.empty()) refuse(dir, impl->path, lock, fsNow, impl->me, staleAfterS);
      takeOver(impl->path, lock, reason, impl->me);
    }
  } catch (...) {
    ::unlink(own.c_str());
    throw;
  }
  ::unlink(own.c_str());
  if (!ours)
    throw ConfigError("cannot lock run directory " + dir + ": " + impl->path + " keeps changing hands");
  impl->fd = ::open(impl->path.c_str(), O_RDONLY | O_CLOEXEC);
  return std::unique_ptr<RunDirLock>(new RunDirLock(std::move(impl)));
}

void releaseRunDirLockBeforeExit() {
  std::lock_guard<std::mutex> g(gHeldMutex);
  if (gHeld) gHeld->impl_->release();
  gHeld = nullptr;
}

namespace {

// The trainer's own files in a run directory (what a fresh start moves away).
bool isRunOutput(const std::string& name) {
  static const char* const kNames[] = {"config.ini", "metrics.jsonl", "metrics.prom", "PREEMPTED", "nccl.env",
                                       "nccl_report.json"};
  for (const char* n : kNames)
    if (name == n) return true;
  auto startsEnds = [&](const std::string& a, const std::string& b) {
    return name.size() > a.size() + b.size() && name.rfind(a, 0) == 0 &&
           name.compare(name.size() - b.size(), b.size(), b) == 0;
  };
  return name.rfind(kNcclDebugFilePrefix, 0) == 0 || startsEnds("trace.rank", ".jsonl") ||
         startsEnds("rank", ".pid");
}

std::vector<std::string> entries(const std::string& dir, bool (*keep)(const std::string&)) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (keep(it->path().filename().string())) out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool isCheckpoint(const std::string& name) {
  return name.rfind("step_", 0) == 0;
}

// Moves `names` of `from` into <from>/archive/<stamp>/; returns that directory.
std::string moveAside(const std::string& from, const std::vector<std::string>& names,
                      const std::string& stamp) {
  std::string to = from + "/archive/" + stamp;
  std::error_code ec;
  for (int n = 2; fs::exists(to, ec); ++n)
    to = from + "/archive/" + stamp + "-" + std::to_string(n);
  fs::create_directories(to, ec);
  if (ec)
    throw ConfigError("checkpoint.resume = never: cannot create " + to +
                      " for the previous run: " + ec.message());
  for (const auto& name : names) {
    fs::rename(from + "/" + name, to + "/" + name, ec);
    if (ec)
      throw ConfigError("checkpoint.resume = never: cannot move the previous run's " + from + "/" + name +
                        " to " + to + ": " + ec.message());
  }
  return to;
}

}  // namespace

std::string archivePreviousRun(const std::string& runDir, const std::string& checkpointDir) {
  const std::vector<std::string> files = entries(runDir, isRunOutput);
  const std::vector<std::string> checkpoints = entries(checkpointDir, isCheckpoint);
  if (files.empty() && checkpoints.empty()) return "";
  const std::string stamp = utcTime(std::time(nullptr), "%Y%m%dT%H%M%SZ");
  std::string said = "checkpoint.resume = never: the previous run in " + runDir + " was moved aside (";
  if (!files.empty()) said += std::to_string(files.size()) + " file(s) to " + moveAside(runDir, files, stamp);
  if (!checkpoints.empty())
    said += std::string(files.empty() ? "" : ", ") + std::to_string(checkpoints.size()) +
            " checkpoint(s) up to " + checkpoints.back() + " to " +
            moveAside(checkpointDir, checkpoints, stamp);
  return said + "); this run starts afresh";
}

}  // namespace mt
