#include "launch/Metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "core/Error.h"
#include "core/Files.h"

namespace mt {

namespace {

// All of `text` to fd; false (errno set) on a failure, a write that stops short included.
bool writeAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// A record of a step the resumed run trains again (the checkpoint holds `step` steps). Events
// (resume, preempted, diverged, final) stay: they are the run's history, not a step's figures.
bool isRedone(const nlohmann::json& r, int64_t step) {
  const auto type = r.find("type"), at = r.find("step");
  if (type == r.end() || !type->is_string() || at == r.end() || !at->is_number()) return false;
  const std::string& t = type->get_ref<const std::string&>();
  return (t == "step" || t == "eval" || t == "memory") && at->get<double>() > static_cast<double>(step);
}

// A record parsed for its top-level "type" and "step" alone: the rest is checked, not stored
// (a long run's file holds 100k records and more).
bool keepTypeAndStep(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
  if (event != nlohmann::json::parse_event_t::key || depth != 1) return true;
  return parsed == "type" || parsed == "step";
}

// `text` as `path`, whole or not at all: a temporary name, fsync, rename.
void replaceFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw IoError("cannot create " + tmp + ": " + std::strerror(errno));
  const bool ok = writeAll(fd, text) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(ok ? errno : err);
    std::remove(tmp.c_str());
    throw IoError("rewriting " + path + " failed: " + why);
  }
}

}  // namespace

MetricsWriter::~MetricsWriter() {
  close();
}

void MetricsWriter::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void MetricsWriter::open(const std::string& path, bool append) {
  close();
  path_ = path;
  error_.clear();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0666);
  if (fd_ < 0) throw IoError("cannot open " + path + " for writing: " + std::strerror(errno));
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (fd_ < 0 || !error_.empty()) return;
  const std::string line = record.dump() + '\n';
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  if (writeAll(fd_, line)) return;
  error_ = "writing " + path_ + " failed: " + std::strerror(errno);
  // Cut a partial record off again: the file stays whole lines for whatever reads it next.
  if (before < 0 || ::ftruncate(fd_, before) != 0) error_ += " (a partial record may be left at its end)";
}

MetricsRepair MetricsWriter::repairForResume(int64_t step) {
  close();
  std::string text;
  if (!readWholeFile(path_, &text)) throw IoError("cannot read " + path_ + " to continue it");
  MetricsRepair rep;
  std::string kept;
  kept.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const nlohmann::json r = nlohmann::json::parse(line, keepTypeAndStep, /*allow_exceptions=*/false);
    if (!r.is_object())
      ++rep.tornLines;
    else if (isRedone(r, step))
      ++rep.redoneRecords;
    else {
      const auto type = r.find("type");
      if (type != r.end() && type->is_string() && *type == "resume") ++rep.resumeRecords;
      kept.append(line).push_back('\n');
    }
  }
  if (kept != text) replaceFile(path_, kept);
  open(path_, /*append=*/true);
  return rep;
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
