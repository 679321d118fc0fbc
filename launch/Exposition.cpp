#include "launch/Exposition.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "core/Check.h"

namespace mt {

const char* const kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

namespace {

bool isAsciiLetter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool isDigit(char c) {
  return c >= '0' && c <= '9';
}

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const char* typeName(MetricType t) {
  return t == MetricType::kCounter ? "counter" : "gauge";
}

void checkFamily(const MetricFamily& f, std::set<std::string>& seen) {
  MT_CHECK(isValidMetricName(f.name), "metric name '", f.name, "' is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  MT_CHECK(seen.insert(f.name).second, "metric family '", f.name, "' appears twice");
  MT_CHECK(f.type != MetricType::kCounter || endsWith(f.name, "_total"), "counter '", f.name,
           "' must end in _total");
  for (const MetricSample& s : f.samples) {
    std::set<std::string> names;
    for (const auto& [name, value] : s.labels) {
      MT_CHECK(isValidLabelName(name), "label name '", name, "' of ", f.name,
               " is not [a-zA-Z_][a-zA-Z0-9_]*");
      MT_CHECK(names.insert(name).second, "label '", name, "' twice in a sample of ", f.name);
    }
  }
}

}  // namespace

bool isValidMetricName(const std::string& name) {
  if (name.empty() || !(isAsciiLetter(name[0]) || name[0] == '_' || name[0] == ':')) return false;
  for (char c : name)
    if (!(isAsciiLetter(c) || isDigit(c) || c == '_' || c == ':')) return false;
  return true;
}

bool isValidLabelName(const std::string& name) {
  if (name.empty() || !(isAsciiLetter(name[0]) || name[0] == '_') || name.rfind("__", 0) == 0) return false;
  for (char c : name)
    if (!(isAsciiLetter(c) || isDigit(c) || c == '_')) return false;
  return true;
}

namespace {

// The exposition format's escapes: backslash and newline in help text, and also '"' in label values.
std::string escapeText(const std::string& v, bool quotes) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quotes && c == '"')
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string escapeHelpText(const std::string& v) { return escapeText(v, false); }

std::string escapeLabelValue(const std::string& v) { return escapeText(v, true); }

std::string formatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  // The shortest of 15..17 significant digits that reads back as v: 0.1 stays "0.1", not
  // "0.10000000000000001", and 2^53 stays an exact integer.
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string formatExposition(const std::vector<MetricFamily>& families) {
  std::set<std::string> seen;
  std::string out;
  for (const MetricFamily& f : families) {
    checkFamily(f, seen);
    out += "# HELP " + f.name + " " + escapeHelpText(f.help) + "\n";
    out += "# TYPE " + f.name + " " + typeName(f.type) + "\n";
    for (const MetricSample& s : f.samples) {
      out += f.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          if (i > 0) out += ',';
          out += s.labels[i].first + "=\"" + escapeLabelValue(s.labels[i].second) + "\"";
        }
        out += '}';
      }
      out += ' ' + formatMetricValue(s.value) + '\n';
    }
  }
  return out;
}

}  // namespace mt
