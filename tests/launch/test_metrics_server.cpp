// The metrics endpoint (launch/MetricsServer.h, launch/RunMetrics.h) over real loopback sockets:
// GET /metrics only, 404/405 otherwise, oversized and silent clients bounded, a port in use an
// error the run turns into a warning, and the last scrape at exit.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/Error.h"
#include "core/Timer.h"
#include "launch/MetricsServer.h"
#include "launch/RunMetrics.h"

namespace mt {
namespace {

// A connected loopback socket with 10 s timeouts both ways (a broken server fails the test, it
// does not hang it); -1 when the connection is refused.
int connectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads the whole answer (the server closes: no keep-alive).
std::string roundTrip(int port, const std::string& request) {
  const int fd = connectTo(port);
  if (fd < 0) return "";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string get(int port, const std::string& path, const std::string& method = "GET") {
  return roundTrip(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

int statusOf(const std::string& response) {
  return response.size() > 12 ? std::atoi(response.c_str() + 9) : 0;
}

std::string bodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

TEST(MetricsServer, ServesMetricsOnly) {
  int renders = 0;
  MetricsServer server("127.0.0.1", 0, [&] {
    ++renders;
    return std::string("# HELP x y\n# TYPE x gauge\nx 1\n");
  });
  ASSERT_GT(server.port(), 0);
  const std::string ok = get(server.port(), "/metrics");
  EXPECT_EQ(statusOf(ok), 200) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_EQ(bodyOf(ok), "# HELP x y\n# TYPE x gauge\nx 1\n");
  EXPECT_EQ(statusOf(get(server.port(), "/metrics?x=1")), 200);
  EXPECT_EQ(statusOf(get(server.port(), "/")), 404);
  EXPECT_EQ(statusOf(get(server.port(), "/metrics/x")), 404);
  EXPECT_EQ(statusOf(get(server.port(), "/../etc/passwd")), 404);
  const std::string post = get(server.port(), "/metrics", "POST");
  EXPECT_EQ(statusOf(post), 405) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos);
  const std::string head = get(server.port(), "/metrics", "HEAD");
  EXPECT_EQ(statusOf(head), 200);
  EXPECT_EQ(bodyOf(head), "");
  EXPECT_EQ(server.scrapes(), 2);  // the two GETs of /metrics
  EXPECT_EQ(renders, 3);
}

TEST(MetricsServer, BoundsOversizedAndSilentClients) {
  MetricsServer server("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  // 64 KiB of headers, past the 16 KiB a connection may hold: refused (431), never served.
  const std::string big = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  EXPECT_EQ(statusOf(roundTrip(server.port(), big)), 431);
  // Garbage is no request either.
  EXPECT_NE(statusOf(roundTrip(server.port(), "\x01\x02 nonsense\r\n\r\n")), 200);
  // Clients that connect and say nothing hold no thread (one polling thread serves every
  // connection) and are dropped after the idle timeout; others are answered meanwhile.
  const int silent1 = connectTo(server.port()), silent2 = connectTo(server.port());
  ASSERT_GE(silent1, 0);
  ASSERT_GE(silent2, 0);
  Stopwatch t;
  EXPECT_EQ(statusOf(get(server.port(), "/metrics")), 200);
  EXPECT_LT(t.elapsed(), 2.0);  // not queued behind the silent ones
  ::close(silent1);
  ::close(silent2);
  EXPECT_EQ(statusOf(get(server.port(), "/metrics")), 200);
}

TEST(MetricsServer, DropsASilentClientAfterTheIdleTimeout) {
  MetricsServer server("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  const int silent = connectTo(server.port());
  ASSERT_GE(silent, 0);
  Stopwatch t;
  char c;
  EXPECT_EQ(::recv(silent, &c, 1, 0), 0);  // closed by the server (the socket's own timeout is 10 s)
  EXPECT_GT(t.elapsed(), 4.0);
  EXPECT_LT(t.elapsed(), 8.0);  // the 5 s idle timeout and a margin
  ::close(silent);
}

TEST(MetricsServer, ServesALargePageWhole) {
  // Far past the per-connection memory the headers get: the body is a buffer of its own.
  std::string page;
  for (int i = 0; page.size() < (1u << 20); ++i)
    page += "meshtrain_x{rank=\"" + std::to_string(i) + "\"} 1\n";
  MetricsServer server("127.0.0.1", 0, [&] { return page; });
  const std::string ok = get(server.port(), "/metrics");
  EXPECT_EQ(statusOf(ok), 200);
  EXPECT_EQ(bodyOf(ok), page);
  EXPECT_EQ(server.scrapes(), 1);
}

TEST(MetricsServer, ServesIpv6Loopback) {
  if (!MetricsServer::supportsIpv6()) GTEST_SKIP() << "libmicrohttpd built without IPv6";
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool haveV6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (probe >= 0) ::close(probe);
  if (!haveV6) GTEST_SKIP() << "no IPv6 loopback on this host";
  MetricsServer server("::1", 0, [] { return std::string("x 1\n"); });
  EXPECT_EQ(server.address(), "[::1]:" + std::to_string(server.port()));
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  a.sin6_port = htons(static_cast<uint16_t>(server.port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: [::1]\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_EQ(statusOf(out), 200) << out;
  EXPECT_EQ(bodyOf(out), "x 1\n");
  // An IPv6 address serves IPv6 only: nothing listens on 127.0.0.1 at that port.
  const int v4 = connectTo(server.port());
  EXPECT_LT(v4, 0);
  if (v4 >= 0) ::close(v4);
}

TEST(MetricsServer, StopsWithinBoundsWhileAClientHangs) {
  auto server = std::make_unique<MetricsServer>("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  const int hanging = connectTo(server->port());
  ASSERT_GE(hanging, 0);
  ::send(hanging, "GET /metr", 9, MSG_NOSIGNAL);  // a request cut off mid-line
  Stopwatch t;
  server.reset();
  // Stopping closes the open connection rather than waiting out its 5 s idle timeout.
  EXPECT_LT(t.elapsed(), 1.0);
  ::close(hanging);
}

TEST(MetricsServer, PortInUseIsAnErrorNamingIt) {
  MetricsServer first("127.0.0.1", 0, [] { return std::string(); });
  try {
    MetricsServer second("127.0.0.1", first.port(), [] { return std::string(); });
    FAIL() << "a second server listened on the same port";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
  }
  // The run's metrics turn it into a warning: serve() is false, nothing throws, figures still render.
  MetricsExportOptions o;
  o.bind = "127.0.0.1";
  o.port = first.port();
  RunMetrics metrics(o);
  EXPECT_FALSE(metrics.serve());
  EXPECT_EQ(metrics.port(), 0);
  EXPECT_NE(metrics.render().find("meshtrain_step"), std::string::npos);
}

// At exit: the cause is counted, metrics.prom written, and linger() returns once a scrape that
// started after finish() has been answered — well before run.metrics_linger_s.
TEST(RunMetricsExit, LastScrapeSeesTheCause) {
  char tmpl[] = "/tmp/mt_prom_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  MetricsExportOptions o;
  o.bind = "127.0.0.1";
  o.lingerS = 30;
  RunMetrics metrics(o);
  ASSERT_TRUE(metrics.serve());
  metrics.identify({dir, "r", "mlp", "no_shard", "cpu", 1, 10, 0});
  metrics.finish(ExitCause::kPreempted);
  std::string scraped;
  std::thread scraper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    scraped = get(metrics.port(), "/metrics");
  });
  Stopwatch t;
  metrics.linger();
  const double waited = t.elapsed();
  scraper.join();
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 10.0);
  EXPECT_NE(scraped.find("meshtrain_exits_total{cause=\"preempted\"} 1\n"), std::string::npos) << scraped;
  std::ifstream f(dir + "/metrics.prom");
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("meshtrain_exits_total{cause=\"preempted\"} 1\n"), std::string::npos);
  std::remove((dir + "/metrics.prom").c_str());
  ::rmdir(dir.c_str());
}

TEST(RunMetricsExit, LingerIsBoundedWithoutScrapes) {
  MetricsExportOptions o;
  o.bind = "127.0.0.1";
  o.lingerS = 0.5;
  RunMetrics metrics(o);
  ASSERT_TRUE(metrics.serve());
  metrics.finish(ExitCause::kFinished);
  Stopwatch t;
  metrics.linger();
  EXPECT_GE(t.elapsed(), 0.45);
  EXPECT_LT(t.elapsed(), 3.0);
}

}  // namespace
}  // namespace mt
