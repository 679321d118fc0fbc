#include "launch/MetricsServer.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/Error.h"
#include "core/Log.h"
#include "launch/Exposition.h"

namespace mt {

namespace {

// The polling thread's stack, set explicitly. glibc carves a thread's static TLS out of the stack
// size it is given and refuses (EINVAL) one smaller than that TLS; a CUDA-linked meshtrain carries
// about 170 KiB of it (libcublasLt 92 KiB, OpenBLAS 60 KiB, NCCL, cudart), more than the ~100 KiB
// stack Debian's civetweb was built with, which is why that server never started in a CUDA build.
// 1 MiB leaves the handler (render() and a response of a few hundred KiB at most, on the heap)
// ample room on top of any library's TLS; the default (8 MiB, RLIMIT_STACK) would waste address
// space for nothing.
constexpr size_t kStackBytes = 1 << 20;
// Per connection: the request line, headers and the response headers come out of this pool; a
// request whose headers do not fit is answered 431 and closed. The body is a separate buffer.
constexpr size_t kConnectionMemoryBytes = 16 << 10;
constexpr unsigned kMaxConnections = 32;
constexpr unsigned kIdleTimeoutS = 5;  // a client silent this long is dropped

std::string listeningAddress(const std::string& bind, int port) {
  return (bind.find(':') != std::string::npos ? "[" + bind + "]" : bind) + ":" + std::to_string(port);
}

// `bind` as a socket address; false when it is no IP literal (RunMetrics refuses those earlier).
bool socketAddress(const std::string& bind, int port, sockaddr_storage& out, bool& v6) {
  std::memset(&out, 0, sizeof(out));
  auto* a4 = reinterpret_cast<sockaddr_in*>(&out);
  if (inet_pton(AF_INET, bind.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    v6 = false;
    return true;
  }
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (inet_pton(AF_INET6, bind.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    v6 = true;
    return true;
  }
  return false;
}

// Queues `body` with `status`; Connection: close, so the client sees the end of the answer and
// no keep-alive connection outlives it.
bool respond(MHD_Connection* conn, unsigned status, const std::string& body, const char* contentType,
             const char* allow = nullptr) {
  MHD_Response* r =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (!r) return false;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, contentType);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  const MHD_Result queued = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);  // the connection holds its own reference
  return queued == MHD_YES;
}

constexpr const char* kPlainText = "text/plain; charset=utf-8";

}  // namespace

struct MetricsServer::Scrape {
  uint64_t generation = 0;
};

// libmicrohttpd's C entry points; `cls` is the MetricsServer. They run on the polling thread.
struct MetricsServer::Callbacks {
  static MHD_Result handle(void* cls, MHD_Connection* conn, const char* url, const char* method,
                           const char* /*version*/, const char* /*uploadData*/, size_t* /*uploadDataSize*/,
                           void** requestContext) {
    std::unique_ptr<Scrape> scrape;
    const bool ok =
        static_cast<MetricsServer*>(cls)->serve(conn, url ? url : "", method ? method : "", scrape);
    *requestContext = scrape.release();  // owned by completed() from here on
    return ok ? MHD_YES : MHD_NO;
  }

  static void completed(void* cls, MHD_Connection*, void** requestContext, MHD_RequestTerminationCode how) {
    std::unique_ptr<Scrape> scrape(static_cast<Scrape*>(*requestContext));
    *requestContext = nullptr;
    if (scrape)
      static_cast<MetricsServer*>(cls)->completed(*scrape, how == MHD_REQUEST_TERMINATED_COMPLETED_OK);
  }

  static void log(void* cls, const char* format, va_list args) {
    char text[512];
    std::vsnprintf(text, sizeof(text), format, args);
    std::string message = text;
    while (!message.empty() && (message.back() == '\n' || message.back() == '\r'))
      message.pop_back();
    static_cast<MetricsServer*>(cls)->logMessage(message);
  }
};

void MetricsServer::StopDaemon::operator()(MHD_Daemon* daemon) const {
  // Closes every open connection and joins the polling thread; bounded because no callback
  // blocks (render() takes one short lock), whatever a client does.
  MHD_stop_daemon(daemon);
}

MetricsServer::MetricsServer(const std::string& bind, int port, Render render) : render_(std::move(render)) {
  const std::string requested = listeningAddress(bind, port);
  sockaddr_storage addr;
  bool v6 = false;
  if (!socketAddress(bind, port, addr, v6))
    throw IoError("cannot serve metrics on " + requested + ": '" + bind + "' is not an IP address");
  // Without MHD_USE_DUAL_STACK an IPv6 address (even ::) serves IPv6 only.
  const unsigned flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  // The logger first: libmicrohttpd prints what comes before it to stderr itself.
  daemon_.reset(MHD_start_daemon(flags, static_cast<uint16_t>(port), nullptr, nullptr, &Callbacks::handle,
                                 this,                                                            //
                                 MHD_OPTION_EXTERNAL_LOGGER, &Callbacks::log, this,               //
                                 MHD_OPTION_SOCK_ADDR, reinterpret_cast<const sockaddr*>(&addr),  //
                                 MHD_OPTION_THREAD_STACK_SIZE, kStackBytes,                       //
                                 MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,                    //
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, kConnectionMemoryBytes,      //
                                 MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeoutS,                    //
                                 MHD_OPTION_NOTIFY_COMPLETED, &Callbacks::completed, this,        //
                                 MHD_OPTION_END));
  std::string startLog;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    starting_ = false;
    startLog = startLog_;
  }
  if (!daemon_)
    throw IoError("cannot serve metrics on " + requested + ": " +
                  (!startLog.empty() ? startLog : "libmicrohttpd failed to start"));
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(daemon_.get(), MHD_DAEMON_INFO_BIND_PORT);
  port_ = bound && bound->port ? bound->port : port;
  address_ = listeningAddress(bind, port_);
}

bool MetricsServer::supportsIpv6() {
  return MHD_is_feature_supported(MHD_FEATURE_IPv6) == MHD_YES;
}

MetricsServer::~MetricsServer() {
  daemon_.reset();  // before the members its callbacks use
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

void MetricsServer::logMessage(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (starting_ && startLog_.empty()) startLog_ = message;
  }
  MT_LOG_DEBUG << "metrics server: " << message;
}

// `url` is the path alone: libmicrohttpd has split off the query string ("/metrics?x=1").
bool MetricsServer::serve(MHD_Connection* conn, const std::string& url, const std::string& method,
                          std::unique_ptr<Scrape>& scrape) {
  if (url != "/metrics") return respond(conn, MHD_HTTP_NOT_FOUND, "Not Found\n", kPlainText);
  if (method != MHD_HTTP_METHOD_GET && method != MHD_HTTP_METHOD_HEAD)
    return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "Method Not Allowed\n", kPlainText, "GET, HEAD");
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
    return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "Internal Server Error\n", kPlainText);
  }
  // HEAD: libmicrohttpd sends the headers (Content-Length of this body) alone; not a scrape.
  if (method == MHD_HTTP_METHOD_GET) scrape = std::make_unique<Scrape>(Scrape{generation});
  return respond(conn, MHD_HTTP_OK, body, kExpositionContentType);
}

// Called once the answer has left (sentWhole) or the connection ended before it had.
void MetricsServer::completed(const Scrape& scrape, bool sentWhole) {
  if (!sentWhole) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++scrapes_;
    if (scrape.generation > servedGeneration_) servedGeneration_ = scrape.generation;
  }
  served_.notify_all();
}

}  // namespace mt
