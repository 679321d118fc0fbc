#include "core/Log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/EnvParams.h"
#include "core/Error.h"

namespace mt {
namespace {

// Before MPI_Init the launcher's environment tells the rank, so early messages are prefixed right.
int guessRankFromEnv() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

std::atomic<int> gRank{guessRankFromEnv()};
std::atomic<int> gWorld{1};

LogLevel initialLevel() {
  LogLevel level = LogLevel::kInfo;
  parseLogLevel(envString(EnvParam::kLogLevel), &level);
  return level;
}
std::atomic<int> gLevel{static_cast<int>(initialLevel())};

const char* levelTag(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarn: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

void writeAll(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n <= 0) return;  // nowhere to report a failing log write
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

void setLogRank(int rank, int worldSize) {
  gRank = rank;
  gWorld = worldSize;
}
int logRank() { return gRank; }
void setLogLevel(LogLevel level) { gLevel = static_cast<int>(level); }
LogLevel logLevel() { return static_cast<LogLevel>(gLevel.load()); }

const EnumTable<LogLevel>& logLevels() {
  static const EnumTable<LogLevel> kTable = {
      {LogLevel::kDebug, "debug"}, {LogLevel::kInfo, "info"}, {LogLevel::kWarn, "warn"}, {LogLevel::kError, "error"}};
  return kTable;
}

bool parseLogLevel(const std::string& name, LogLevel* out) { return parseEnum(logLevels(), name, out); }

LogLevel envLogLevel(LogLevel fallback) {
  const char* name = envParamTable().at(static_cast<size_t>(EnvParam::kLogLevel)).name;
  const char* v = std::getenv(name);
  if (!v) return fallback;
  LogLevel level = fallback;
  if (parseLogLevel(v, &level)) return level;
  std::string names;
  const std::vector<std::string> choices = enumChoices(logLevels());
  for (size_t i = 0; i < choices.size(); ++i)
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  throw ConfigError(std::string("environment variable ") + name + "='" + v +
                    "' is not a log level: expected " + names);
}

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  int ms = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "[r%d %s %02d:%02d:%02d.%03d] ", gRank.load(), levelTag(level), tm.tm_hour,
                tm.tm_min, tm.tm_sec, ms);
  os_ << buf;
  if (level == LogLevel::kDebug) {
    const char* base = std::strrchr(file, '/');
    os_ << (base ? base + 1 : file) << ":" << line << ": ";
  }
}

LogLine::~LogLine() {
  os_ << '\n';
  writeAll(level_ >= LogLevel::kWarn ? STDERR_FILENO : STDOUT_FILENO, os_.str());
}

void writeLine(const std::string& line) { writeAll(STDERR_FILENO, line + "\n"); }

}  // namespace mt
