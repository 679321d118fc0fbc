#include "launch/CommandArgs.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/Error.h"

namespace mt {

namespace {

std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

[[noreturn]] void refuse(const std::string& command, const std::string& flag, const std::string& value,
                         const std::string& expected) {
  throw ConfigError(command + ": " + flag + " " + (value.empty() ? "''" : value) + ": expected " + expected);
}

// strtod/strtoll skip leading blanks; a value is a number only when nothing is left over.
bool startsWithBlank(const std::string& v) {
  return !v.empty() && std::isspace(static_cast<unsigned char>(v[0]));
}

}  // namespace

double numberOption(const std::string& command, const std::string& flag, const std::string& value, double lo,
                    double hi, bool loOpen) {
  const std::string range =
      "a finite number in " + std::string(loOpen ? "(" : "[") + show(lo) + ", " + show(hi) + "]";
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || startsWithBlank(value) || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    refuse(command, flag, value, range);
  if (v < lo || (loOpen && v == lo) || v > hi) refuse(command, flag, value, range);
  return v;
}

int64_t integerOption(const std::string& command, const std::string& flag, const std::string& value,
                      int64_t lo, int64_t hi) {
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || startsWithBlank(value) || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    refuse(command, flag, value, range);
  return v;
}

std::vector<int64_t> integerListOption(const std::string& command, const std::string& flag,
                                       const std::string& value, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) refuse(command, flag, value, "comma-separated integers, none empty");
    out.push_back(integerOption(command, flag, item, lo, hi));
  }
  // getline drops a trailing empty item ("1,2,"); an empty list says nothing either.
  if (out.empty() || value.back() == ',')
    refuse(command, flag, value, "comma-separated integers, none empty");
  return out;
}

}  // namespace mt
