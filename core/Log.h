#pragma once
// Rank-prefixed logging. One line per message, written with a single write() so lines from threads
// and ranks sharing a terminal never interleave mid-line. The level comes from MT_LOG_LEVEL
// (debug, info, warn, error) or setLogLevel().

#include <sstream>
#include <string>

#include "core/EnumTable.h"

namespace mt {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Set once the rank is known (before MPI_Init it is guessed from the launcher's environment).
void setLogRank(int rank, int worldSize);
int logRank();
void setLogLevel(LogLevel level);
LogLevel logLevel();
const EnumTable<LogLevel>& logLevels();
bool parseLogLevel(const std::string& name, LogLevel* out);
// MT_LOG_LEVEL's level, or `fallback` when it is not set. A value that names no level is a
// ConfigError naming the variable and the accepted names (the level logging starts with, set
// before main where nothing can be refused, falls back to info until this is called).
LogLevel envLogLevel(LogLevel fallback);
inline bool logEnabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(logLevel()); }

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

// Writes one already formatted line to stderr (used for the final error line of a failed job).
void writeLine(const std::string& line);

}  // namespace mt

// A one-pass for loop (not if/else) so the macro nests safely under an unbraced if.
#define MT_LOG(level)                                                                  \
  for (bool mt_log_on_ = ::mt::logEnabled(::mt::LogLevel::level); mt_log_on_; mt_log_on_ = false) \
  ::mt::LogLine(::mt::LogLevel::level, __FILE__, __LINE__)
#define MT_LOG_DEBUG MT_LOG(kDebug)
#define MT_LOG_INFO MT_LOG(kInfo)
#define MT_LOG_WARN MT_LOG(kWarn)
#define MT_LOG_ERROR MT_LOG(kError)
