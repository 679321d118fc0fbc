#include "launch/Metrics.h"

#include <cmath>
#include <cstdio>

#include "core/Error.h"

namespace mt {

void MetricsWriter::open(const std::string& path, bool append) {
  path_ = path;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw IoError("cannot open " + path + " for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw IoError("writing " + path_ + " failed (disk full?)");
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buf[32];
  const long s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", s);
  return buf;
}

}  // namespace mt
