#pragma once
// H5_CHECK for HDF5 calls returning herr_t/hid_t (negative = failure). The message carries the
// innermost entry of HDF5's error stack, which names the real cause ("file signature not found").

#include <hdf5.h>

#include <string>

#include "core/Check.h"

namespace mt {
namespace detail {
// The innermost HDF5 error description on this thread's stack, then clears the stack.
std::string hdf5ErrorString();
[[noreturn]] void throwH5Error(const char* expr, const char* file, int line, const std::string& context);
}  // namespace detail
}  // namespace mt

#define H5_CHECK(expr, ...)                                                                          \
  ([&]() {                                                                                           \
    auto mt_h5_rc_ = (expr);                                                                         \
    if (mt_h5_rc_ < 0)                                                                               \
      ::mt::detail::throwH5Error(#expr, __FILE__, __LINE__, ::mt::detail::concat(__VA_ARGS__));      \
    return mt_h5_rc_;                                                                                \
  }())
