#pragma once
// MT_CHECK and the formatting shared by the library CHECK macros (MPI_CHECK in comm/MpiCheck.h,
// H5_CHECK in data/H5Check.h, CUDA_CHECK/NCCL_CHECK in core/CudaCheck.h). Every message carries
// file:line, the failing expression, the rank, and the library's own error string.

#include <sstream>
#include <string>

#include "core/Error.h"

namespace mt {
namespace detail {

// "core/Tensor.cpp:42: rank 3: `expr` failed: detail"
std::string checkMessage(const char* file, int line, const char* expr, const std::string& detail);

inline void streamAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void streamAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  streamAll(os, rest...);
}
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  streamAll(os, args...);
  return os.str();
}

}  // namespace detail
}  // namespace mt

// Internal invariant; throws InternalError.
#define MT_CHECK(cond, ...)                                                                      \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      throw ::mt::InternalError(                                                                 \
          ::mt::detail::checkMessage(__FILE__, __LINE__, #cond, ::mt::detail::concat(__VA_ARGS__))); \
  } while (0)

// A check whose failure is the caller's fault: throws the given error type with the message only
// (no file:line, since the user needs the key or file, not our source location).
#define MT_REQUIRE(cond, ErrorType, ...)                                \
  do {                                                                  \
    if (!(cond)) throw ErrorType(::mt::detail::concat(__VA_ARGS__));   \
  } while (0)
