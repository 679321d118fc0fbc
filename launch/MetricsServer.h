#pragma once
// The HTTP endpoint Prometheus scrapes: GET (or HEAD) /metrics answers 200 with the page the
// render callback returns; any other path is 404, any other method 405. Served by GNU
// libmicrohttpd (Debian's libmicrohttpd12) on one polling thread of its own, so a scrape never
// runs on, or waits for, the training thread: render() copies the figures under one short lock
// and formats the copy (launch/RunMetrics.h).
//
// Bounded everywhere: at most 32 connections, each with 16 KiB of memory for the request and the
// response headers (longer headers are refused with 431), a client that sends nothing for 5 s is
// dropped, no keep-alive (a scrape a second costs one connection each). The polling thread
// multiplexes every connection, so a silent client holds no thread, and stopping (the
// destructor) closes whatever is open at once. The thread's stack size is set, not left to the
// library: see kStackBytes in MetricsServer.cpp.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

struct MHD_Daemon;
struct MHD_Connection;

namespace mt {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  // Listens on `bind` (an IPv4 literal; IPv6 where supportsIpv6()) port `port` (0: any free port,
  // for tests).
  // Throws IoError naming the address when it cannot listen (a port in use, an address that is
  // not this host's): the caller decides that this is a warning, not a failure of the run.
  MetricsServer(const std::string& bind, int port, Render render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Whether this libmicrohttpd listens on IPv6 (Debian's is built with it).
  static bool supportsIpv6();

  int port() const { return port_; }
  // "127.0.0.1:9400", "[::1]:9400".
  const std::string& address() const { return address_; }
  // Scrapes answered with 200 so far.
  int64_t scrapes() const;
  // For the last scrape before the process ends: a new generation, which every scrape that
  // starts from now on renders; waitServed() waits until one of them has been sent whole.
  uint64_t advanceGeneration();
  bool waitServed(uint64_t generation, std::chrono::milliseconds timeout);

 private:
  struct Callbacks;  // libmicrohttpd's C callbacks, with its types (MetricsServer.cpp)
  struct Scrape;     // a 200 answer to GET /metrics in flight: its generation
  struct StopDaemon {
    void operator()(MHD_Daemon* daemon) const;
  };

  // Answers one request; a GET of /metrics returns the Scrape that completed() settles.
  bool serve(MHD_Connection* conn, const std::string& url, const std::string& method,
             std::unique_ptr<Scrape>& scrape);
  void completed(const Scrape& scrape, bool sentWhole);
  void logMessage(const std::string& message);

  Render render_;
  std::string address_;
  int port_ = 0;
  mutable std::mutex mutex_;  // the counters and the start log below
  std::condition_variable served_;
  uint64_t generation_ = 0, servedGeneration_ = 0;
  int64_t scrapes_ = 0;
  bool starting_ = true;
  std::string startLog_;  // the daemon's first message while starting ("Failed to bind ...")
  // Last: stopped (its thread joined) before anything its callbacks touch is destroyed.
  std::unique_ptr<MHD_Daemon, StopDaemon> daemon_;
};

}  // namespace mt
