#include "core/Check.h"

#include <cstring>

#include "core/Log.h"

namespace mt {
namespace detail {

std::string checkMessage(const char* file, int line, const char* expr, const std::string& detail) {
  std::ostringstream os;
  os << file << ":" << line << ": rank " << logRank() << ": `" << expr << "` failed";
  if (!detail.empty()) os << ": " << detail;
  return os.str();
}

}  // namespace detail
}  // namespace mt
