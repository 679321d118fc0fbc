#include "launch/MetricsServer.h"

#include <civetweb.h>

#include <cstring>
#include <exception>
#include <mutex>

#include "core/Error.h"
#include "core/Log.h"
#include "launch/Exposition.h"

namespace mt {

namespace {

// civetweb's global state, once per process (no TLS, no SSL, no websockets: features 0). It is
// never torn down: another server may start later in the same process (the tests do).
// What civetweb logs while mg_start2 runs on this thread ("cannot bind to 127.0.0.1:9400: 98
// (Address already in use)"): its error text alone says only "Failed to setup server ports".
thread_local std::string* tStartLog = nullptr;

void initCivetweb() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

std::string listeningAddress(const std::string& bind, int port) {
  // civetweb spells an IPv6 address in brackets; a v4-mapped or wildcard v6 bind serves v6 only.
  return (bind.find(':') != std::string::npos ? "[" + bind + "]" : bind) + ":" + std::to_string(port);
}

void sendStatus(mg_connection* conn, int status, const char* reason, const char* extraHeader) {
  const std::string body = std::string(reason) + "\n";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n%s"
            "Connection: close\r\n\r\n",
            status, reason, body.size(), extraHeader);
  mg_write(conn, body.data(), body.size());
}

}  // namespace

MetricsServer::MetricsServer(const std::string& bind, int port, Render render) : render_(std::move(render)) {
  initCivetweb();
  const std::string ports = listeningAddress(bind, port);
  // Only what this endpoint needs: no document root (nothing on disk is served), two threads.
  const char* options[] = {"listening_ports",
                           ports.c_str(),
                           "num_threads",
                           "2",
                           "request_timeout_ms",
                           "5000",
                           "max_request_size",
                           "8192",
                           "enable_keep_alive",
                           "no",
                           "linger_timeout_ms",
                           "500",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &MetricsServer::logMessage;
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = options;
  unsigned code = 0;
  char text[256] = "";
  mg_error_data error;
  error.code = &code;
  error.text = text;
  error.text_buffer_size = sizeof(text);
  std::string startLog;
  tStartLog = &startLog;
  ctx_ = mg_start2(&init, &error);
  tStartLog = nullptr;
  if (!ctx_)
    throw IoError("cannot serve metrics on " + ports + ": " +
                  (!startLog.empty() ? startLog
                   : text[0]         ? std::string(text)
                                     : "civetweb failed to start"));
  mg_set_request_handler(ctx_, "/", &MetricsServer::handle, this);
  mg_server_port bound[4];
  const int n = mg_get_server_ports(ctx_, 4, bound);
  port_ = n > 0 ? bound[0].port : port;
  address_ = listeningAddress(bind, port_);
}

bool MetricsServer::supportsIpv6() {
  return mg_check_feature(8) != 0;  // 8: MG_FEATURES_IPV6
}

MetricsServer::~MetricsServer() {
  // Waits for the worker threads; each request is bounded by request_timeout_ms.
  if (ctx_) mg_stop(ctx_);
}

int64_t MetricsServer::scrapes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return scrapes_;
}

uint64_t MetricsServer::advanceGeneration() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++generation_;
}

bool MetricsServer::waitServed(uint64_t generation, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return served_.wait_for(lock, timeout, [&] { return servedGeneration_ >= generation; });
}

int MetricsServer::handle(mg_connection* conn, void* self) {
  return static_cast<MetricsServer*>(self)->serve(conn);
}

int MetricsServer::logMessage(const mg_connection*, const char* message) {
  if (tStartLog && tStartLog->empty()) *tStartLog = message;
  MT_LOG_DEBUG << "metrics server: " << message;
  return 1;  // logged here; civetweb prints nothing itself
}

int MetricsServer::serve(mg_connection* conn) {
  const mg_request_info* req = mg_get_request_info(conn);
  const std::string uri = req && req->local_uri ? req->local_uri : "";
  const std::string method = req && req->request_method ? req->request_method : "";
  if (uri != "/metrics") {
    sendStatus(conn, 404, "Not Found", "");
    return 404;
  }
  if (method != "GET" && method != "HEAD") {
    sendStatus(conn, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
    return 405;
  }
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = generation_;
  }
  std::string body;
  try {
    body = render_();
  } catch (const std::exception& e) {
    MT_LOG_ERROR << "metrics server: rendering /metrics failed: " << e.what();
    sendStatus(conn, 500, "Internal Server Error", "");
    return 500;
  }
  mg_printf(conn, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
            kExpositionContentType, body.size());
  if (method == "HEAD") return 200;  // no body: not a scrape
  if (mg_write(conn, body.data(), body.size()) == static_cast<int>(body.size())) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++scrapes_;
    if (generation > servedGeneration_) servedGeneration_ = generation;
  }
  served_.notify_all();
  return 200;
}

}  // namespace mt
