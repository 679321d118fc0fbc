#pragma once
// <run_dir>/metrics.jsonl: one JSON object per line, per logged step ("type": "step"), per
// evaluation ("eval") and once at the end ("final"), with events between them ("resume",
// "preempted", "diverged"). Written by rank 0.
//
// A record is one write(2) of the whole line to a file opened O_APPEND, so a killed job keeps
// every record it logged, whole. A failed or short write (a full disk) is cut off again, so the
// file stays whole lines, and leaves the writer failed: it writes nothing more and error() says
// why — it never throws, because the trainer first tries a checkpoint and then ends the run.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mt {

// What resumeAt() changed in the file.
struct MetricsRepair {
  int64_t tornLines = 0;      // lines that were not a JSON object (a torn write of an older build)
  int64_t redoneRecords = 0;  // step/eval/memory records of steps after the checkpoint
  int64_t resumeRecords = 0;  // "resume" records kept: how often the run was resumed before
};

class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // append: keep earlier records (a resumed run continues the same file). Throws IoError.
  void open(const std::string& path, bool append);
  bool isOpen() const { return fd_ >= 0; }
  void write(const nlohmann::json& record);
  // Empty while every write succeeded, else the first failure ("writing <path> failed: ...").
  const std::string& error() const { return error_; }
  // Before a resume from a checkpoint after `step` steps: drops torn lines and the records of
  // later steps (they are trained again now), rewriting the file under a temporary name and
  // renaming it when anything changes, then reopens it for appending. Throws IoError.
  MetricsRepair repairForResume(int64_t step);

 private:
  void close();
  int fd_ = -1;
  std::string path_;
  std::string error_;
};

std::string formatDuration(double seconds);  // "1h02m", "3m12s", "45s"

}  // namespace mt
