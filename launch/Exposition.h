#pragma once
// The Prometheus text exposition format, version 0.0.4 (Content-Type "text/plain; version=0.0.4"):
// per metric family one "# HELP name text" line, one "# TYPE name counter|gauge" line, then one
// line per sample, `name{label="value",...} value`. Pure formatting, no I/O: the metrics server
// (launch/MetricsServer.h) serves what this writes, and the final snapshot file is the same text.
//
// What the format requires and this checks or does:
//  - metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* and do not
//    start with "__" (reserved); a counter's name ends in "_total"; a family's name appears once;
//  - HELP text escapes '\' as "\\" and a newline as "\n"; label values also escape '"' as "\"";
//  - values are Go float literals: NaN, +Inf, -Inf, else the shortest decimal that reads back as
//    the same double (so byte counts up to 2^53 print as exact integers).
// A name that breaks these rules is a bug in the caller: InternalError.
//
// (Debian 12's prometheus-cpp 1.0.1 writes NaN as "Nan" and puts HELP text unescaped, so a newline
// in it breaks the exposition; hence this formatter rather than that library's serializer.)

#include <string>
#include <utility>
#include <vector>

namespace mt {

enum class MetricType { kCounter, kGauge };

struct MetricSample {
  std::vector<std::pair<std::string, std::string>> labels;  // name, value (any UTF-8)
  double value = 0.0;
};

struct MetricFamily {
  std::string name, help;
  MetricType type = MetricType::kGauge;
  std::vector<MetricSample> samples;  // none: the family is written as HELP and TYPE only
};

// The Content-Type header the exposition is served with.
extern const char* const kExpositionContentType;

std::string formatExposition(const std::vector<MetricFamily>& families);
std::string formatMetricValue(double v);
std::string escapeLabelValue(const std::string& v);
std::string escapeHelpText(const std::string& v);
bool isValidMetricName(const std::string& name);
bool isValidLabelName(const std::string& name);

}  // namespace mt
