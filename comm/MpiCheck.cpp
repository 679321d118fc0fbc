#include "comm/MpiCheck.h"

namespace mt {
namespace detail {

void throwMpiError(int rc, const char* expr, const char* file, int line) {
  char buf[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) std::snprintf(buf, sizeof(buf), "MPI error %d", rc);
  throw MpiError(checkMessage(file, line, expr, buf));
}

}  // namespace detail
}  // namespace mt
