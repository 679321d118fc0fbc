#pragma once
// Numeric options of the trainer's subcommands (plan, predict, topo). strtod and strtol alone
// accept "2abc" (as 2), "nan" and "inf", and casting a double to an integer outside its range is
// undefined (1e30 ranks became -2^63); here the whole value must be a number of the option's kind,
// finite and inside the option's documented range, or a ConfigError (exit 2) names the
// subcommand, the option, the value and the range.

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

// A finite number in [lo, hi], or (lo, hi] when loOpen.
double numberOption(const std::string& command, const std::string& flag, const std::string& value, double lo,
                    double hi, bool loOpen = false);
// A decimal integer in [lo, hi].
int64_t integerOption(const std::string& command, const std::string& flag, const std::string& value,
                      int64_t lo, int64_t hi);
// A comma-separated list of such integers, none of them empty.
std::vector<int64_t> integerListOption(const std::string& command, const std::string& flag,
                                       const std::string& value, int64_t lo, int64_t hi);

}  // namespace mt
