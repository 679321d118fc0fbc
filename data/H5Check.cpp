#include "data/H5Check.h"

namespace mt {
namespace detail {

namespace {
herr_t walkInnermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err && err->desc) *out = err->desc;  // n == 0 is the innermost (first) entry
  return 0;
}
}  // namespace

std::string hdf5ErrorString() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walkInnermost, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "unknown HDF5 error" : msg;
}

void throwH5Error(const char* expr, const char* file, int line, const std::string& context) {
  std::string detail = hdf5ErrorString();
  if (!context.empty()) detail = context + ": " + detail;
  throw H5Error(checkMessage(file, line, expr, detail));
}

}  // namespace detail
}  // namespace mt
