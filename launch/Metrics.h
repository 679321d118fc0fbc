#pragma once
// <run_dir>/metrics.jsonl: one JSON object per line, per logged step ("type": "step"), per
// evaluation ("eval") and once at the end ("final"). Written by rank 0, flushed per record so a
// killed job keeps what it logged. The progress line shows the same numbers.

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace mt {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: keep earlier records (a resumed run continues the same file).
  void open(const std::string& path, bool append);
  bool isOpen() const { return out_.is_open(); }
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
  std::string path_;
};

std::string formatDuration(double seconds);  // "1h02m", "3m12s", "45s"

}  // namespace mt
