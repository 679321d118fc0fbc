#pragma once
// The HTTP endpoint Prometheus scrapes: GET (or HEAD) /metrics answers 200 with the page the
// render callback returns; any other path is 404, any other method 405. Served by civetweb
// (Debian's libcivetweb, the server prometheus-cpp embeds too) on threads of its own, so a scrape
// never runs on, or waits for, the training thread: render() copies the figures under one short
// lock and formats the copy (launch/RunMetrics.h).
//
// Bounded everywhere: requests over 8 KiB of headers are refused, a client that sends nothing
// for 5 s is dropped, no keep-alive (a scrape a second costs one connection each), and stopping
// (the destructor) therefore waits at most about the 5 s of a request being read.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

struct mg_context;
struct mg_connection;

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

  // Whether this civetweb listens on IPv6 (Debian 12's is built without it).
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
  static int handle(mg_connection* conn, void* self);
  static int logMessage(const mg_connection* conn, const char* message);
  int serve(mg_connection* conn);

  Render render_;
  std::string address_;
  int port_ = 0;
  mg_context* ctx_ = nullptr;
  mutable std::mutex mutex_;  // the counters below
  std::condition_variable served_;
  uint64_t generation_ = 0, servedGeneration_ = 0;
  int64_t scrapes_ = 0;
};

}  // namespace mt
