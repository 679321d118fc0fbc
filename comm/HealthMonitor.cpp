#include "comm/HealthMonitor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/Log.h"
#include "comm/MpiCheck.h"

namespace mt {

namespace {

constexpr int kMaxAddrs = 16;
constexpr char kHello = 'H', kBye = 'B', kLost = 'L', kAbort = 'X', kBeat = 'K', kStale = 'S';
using Clock = std::chrono::steady_clock;

// Heartbeats never block the monitor: a stopped peer's full socket buffer just drops them.
// Every message is kMessageBytes: kind, rank, exit code (an abort's: what the peers exit with).
constexpr size_t kMessageBytes = 9;

void sendBeat(int fd) {
  char buf[kMessageBytes] = {kBeat};
  (void)!::send(fd, buf, kMessageBytes, MSG_NOSIGNAL | MSG_DONTWAIT);
}

struct Message {
  char kind;
  int32_t rank;
  int32_t code = 0;
};

bool sendMessage(int fd, Message m) {
  char buf[kMessageBytes] = {m.kind};
  std::memcpy(buf + 1, &m.rank, 4);
  std::memcpy(buf + 5, &m.code, 4);
  return ::send(fd, buf, kMessageBytes, MSG_NOSIGNAL) == static_cast<ssize_t>(kMessageBytes);
}

// 1: got a message, 0: peer closed, -1: error/partial.
int recvMessage(int fd, Message* m) {
  char buf[kMessageBytes];
  size_t got = 0;
  while (got < kMessageBytes) {
    ssize_t n = ::recv(fd, buf + got, kMessageBytes - got, 0);
    if (n == 0) return got == 0 ? 0 : -1;
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += static_cast<size_t>(n);
  }
  m->kind = buf[0];
  std::memcpy(&m->rank, buf + 1, 4);
  std::memcpy(&m->code, buf + 5, 4);
  return 1;
}

std::vector<uint32_t> localAddresses() {
  std::vector<uint32_t> outside, loopback;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      uint32_t a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      (ntohl(a) >> 24 == 127 ? loopback : outside).push_back(a);
    }
    freeifaddrs(ifs);
  }
  outside.insert(outside.end(), loopback.begin(), loopback.end());
  if (outside.empty()) outside.push_back(htonl(INADDR_LOOPBACK));
  if (outside.size() > kMaxAddrs) outside.resize(kMaxAddrs);
  return outside;
}

int connectWithTimeout(uint32_t addr, uint16_t port, int timeoutMs) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = addr;
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, timeoutMs) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
    } else {
      rc = -1;
    }
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, flags);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

HealthMonitor::HealthMonitor(MPI_Comm world, LostHandler handler, int port, int heartbeatTimeoutS)
    : heartbeatTimeoutS_(heartbeatTimeoutS), handler_(std::move(handler)) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &size_));
  if (size_ == 1) return;
  if (::pipe2(wakeFds_, O_CLOEXEC) != 0) wakeFds_[0] = wakeFds_[1] = -1;

  // Rank 0 publishes its addresses and port (count 0 = it could not listen).
  uint32_t info[kMaxAddrs + 2] = {0};
  if (rank_ == 0) {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    int one = 1;
    setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t len = sizeof(sa);
    if (listenFd_ >= 0 && ::bind(listenFd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
        ::listen(listenFd_, size_) == 0 && getsockname(listenFd_, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
      auto addrs = localAddresses();
      info[0] = static_cast<uint32_t>(addrs.size());
      info[1] = ntohs(sa.sin_port);
      for (size_t i = 0; i < addrs.size(); ++i) info[2 + i] = addrs[i];
    } else {
      MT_LOG_WARN << "health monitor: cannot listen (" << std::strerror(errno) << "); lost ranks are detected by "
                  << "collective timeouts only";
    }
  }
  MPI_CHECK(MPI_Bcast(info, kMaxAddrs + 2, MPI_UINT32_T, 0, world));
  int ok = 0;
  if (info[0] > 0 && rank_ != 0) {
    for (uint32_t i = 0; i < info[0] && serverFd_ < 0; ++i)
      serverFd_ = connectWithTimeout(info[2 + i], static_cast<uint16_t>(info[1]), 5000);
    if (serverFd_ >= 0 && sendMessage(serverFd_, {kHello, rank_})) ok = 1;
  } else if (info[0] > 0) {
    ok = 1;
  }
  // Everyone learns whether the whole ring is up; rank 0 then accepts exactly the ones that are.
  std::vector<int> all(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&ok, 1, MPI_INT, all.data(), 1, MPI_INT, world));
  if (rank_ == 0 && ok) {
    int expected = 0;
    for (int r = 1; r < size_; ++r) expected += all[static_cast<size_t>(r)];
    clientFds_.assign(static_cast<size_t>(size_), -1);
    clientLeft_.assign(static_cast<size_t>(size_), false);
    for (int i = 0; i < expected; ++i) {
      pollfd p{listenFd_, POLLIN, 0};
      if (::poll(&p, 1, 30000) != 1) break;
      int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      Message m{};
      if (fd < 0 || recvMessage(fd, &m) != 1 || m.kind != kHello || m.rank <= 0 || m.rank >= size_) {
        if (fd >= 0) ::close(fd);
        continue;
      }
      clientFds_[static_cast<size_t>(m.rank)] = fd;
    }
  }
  if (!ok) {
    if (rank_ != 0 && info[0] > 0) {
      MT_LOG_WARN << "health monitor: cannot reach rank 0; lost ranks are detected by collective timeouts only";
    }
    return;
  }
  active_ = true;
  thread_ = std::thread([this] { rank_ == 0 ? serverLoop() : clientLoop(); });
}

HealthMonitor::~HealthMonitor() {
  shutdown();
  if (listenFd_ >= 0) ::close(listenFd_);
  for (int i = 0; i < 2; ++i)
    if (wakeFds_[i] >= 0) ::close(wakeFds_[i]);
}

void HealthMonitor::shutdown() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(sendMutex_);
    if (serverFd_ >= 0) sendMessage(serverFd_, {kBye, rank_});
    for (int fd : clientFds_)
      if (fd >= 0) sendMessage(fd, {kBye, 0});
  }
  if (wakeFds_[1] >= 0) {
    char c = 0;
    (void)!::write(wakeFds_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  if (serverFd_ >= 0) ::close(serverFd_);
  serverFd_ = -1;
  for (int& fd : clientFds_)
    if (fd >= 0) ::close(fd), fd = -1;
}

void HealthMonitor::announceAbort(int exitCode) {
  if (!active_ || stopping_) return;
  reported_ = true;  // this rank is ending anyway: do not also report the peers' reactions
  std::lock_guard<std::mutex> lock(sendMutex_);
  if (serverFd_ >= 0) sendMessage(serverFd_, {kAbort, rank_, exitCode});
  for (size_t r = 1; r < clientFds_.size(); ++r)
    if (clientFds_[r] >= 0 && !clientLeft_[r]) sendMessage(clientFds_[r], {kAbort, 0, exitCode});
}

void HealthMonitor::report(int rank, const std::string& why, int exitCode) {
  if (stopping_ || reported_.exchange(true)) return;
  if (handler_) handler_(rank, why, exitCode);
}

void HealthMonitor::serverLoop() {
  std::vector<Clock::time_point> lastSeen(static_cast<size_t>(size_), Clock::now());
  Clock::time_point lastBeat = Clock::now();
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    if (now - lastBeat >= std::chrono::seconds(1)) {
      std::lock_guard<std::mutex> lock(sendMutex_);
      for (int r = 1; r < size_; ++r)
        if (clientFds_[static_cast<size_t>(r)] >= 0 && !clientLeft_[static_cast<size_t>(r)])
          sendBeat(clientFds_[static_cast<size_t>(r)]);
      lastBeat = now;
    }
    for (int r = 1; r < size_ && heartbeatTimeoutS_ > 0; ++r) {
      if (clientFds_[static_cast<size_t>(r)] < 0 || clientLeft_[static_cast<size_t>(r)]) continue;
      const auto silent = std::chrono::duration_cast<std::chrono::seconds>(now - lastSeen[static_cast<size_t>(r)]);
      if (silent.count() < heartbeatTimeoutS_) continue;
      clientLeft_[static_cast<size_t>(r)] = true;
      {
        std::lock_guard<std::mutex> lock(sendMutex_);
        for (int o = 1; o < size_; ++o)
          if (o != r && clientFds_[static_cast<size_t>(o)] >= 0 && !clientLeft_[static_cast<size_t>(o)])
            sendMessage(clientFds_[static_cast<size_t>(o)], {kStale, r});
      }
      report(r, "it has not answered for " + std::to_string(silent.count()) +
                    " s (process stopped, e.g. SIGSTOP, or its node hangs)");
      return;
    }
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    fds.push_back({wakeFds_[0], POLLIN, 0});
    ranks.push_back(-1);
    for (int r = 1; r < size_; ++r) {
      if (clientFds_[static_cast<size_t>(r)] >= 0 && !clientLeft_[static_cast<size_t>(r)]) {
        fds.push_back({clientFds_[static_cast<size_t>(r)], POLLIN, 0});
        ranks.push_back(r);
      }
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int r = ranks[i];
      Message m{};
      int rc = recvMessage(fds[i].fd, &m);
      if (rc == 1) lastSeen[static_cast<size_t>(r)] = Clock::now();
      if (rc == 1 && m.kind == kBeat) continue;
      if (rc == 1 && m.kind == kBye) {
        clientLeft_[static_cast<size_t>(r)] = true;
        continue;
      }
      const bool aborted = rc == 1 && m.kind == kAbort;
      if (rc == 1 && !aborted) continue;  // nothing else is sent to rank 0
      // An announced abort, or a connection closed without goodbye: the process is gone.
      clientLeft_[static_cast<size_t>(r)] = true;
      {
        std::lock_guard<std::mutex> lock(sendMutex_);
        for (int o = 1; o < size_; ++o)
          if (o != r && clientFds_[static_cast<size_t>(o)] >= 0 && !clientLeft_[static_cast<size_t>(o)])
            sendMessage(clientFds_[static_cast<size_t>(o)], {aborted ? kAbort : kLost, r, aborted ? m.code : 0});
      }
      report(r,
             aborted ? "it ended the job with an error (its log says why)"
                     : "its connection to rank 0 closed without a goodbye (process killed or crashed)",
             aborted ? m.code : 0);
      return;
    }
  }
}

void HealthMonitor::clientLoop() {
  Clock::time_point lastSeen = Clock::now(), lastBeat = Clock::now();
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    if (now - lastBeat >= std::chrono::seconds(1)) {
      std::lock_guard<std::mutex> lock(sendMutex_);
      sendBeat(serverFd_);
      lastBeat = now;
    }
    const auto silent = std::chrono::duration_cast<std::chrono::seconds>(now - lastSeen);
    if (heartbeatTimeoutS_ > 0 && silent.count() >= heartbeatTimeoutS_) {
      report(0, "rank 0 has not answered for " + std::to_string(silent.count()) +
                    " s (process stopped, e.g. SIGSTOP, or its node hangs)");
      return;
    }
    pollfd fds[2] = {{wakeFds_[0], POLLIN, 0}, {serverFd_, POLLIN, 0}};
    if (::poll(fds, 2, 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    if (!fds[1].revents) continue;
    Message m{};
    int rc = recvMessage(serverFd_, &m);
    if (rc == 1) lastSeen = Clock::now();
    if (rc == 1 && m.kind == kBeat) continue;
    if (rc == 1 && m.kind == kBye) return;  // rank 0 finished normally
    if (rc == 1 && m.kind == kStale) {
      report(m.rank, "reported by rank 0: it has not answered for " + std::to_string(heartbeatTimeoutS_) +
                         " s (process stopped, e.g. SIGSTOP, or its node hangs)");
      return;
    }
    if (rc == 1 && m.kind == kLost) {
      report(m.rank, "reported lost by rank 0 (its connection closed without a goodbye)");
      return;
    }
    if (rc == 1 && m.kind == kAbort) {
      report(m.rank, "it ended the job with an error (its log says why)", m.code);
      return;
    }
    if (rc == 1) continue;
    report(0, "the connection to rank 0 closed without a goodbye (process killed or crashed)");
    return;
  }
}

}  // namespace mt
