#pragma once
#include <mpi.h>

#include "core/Check.h"

namespace mt {
namespace detail {
[[noreturn]] void throwMpiError(int rc, const char* expr, const char* file, int line);
}
}  // namespace mt

#define MPI_CHECK(expr)                                                             \
  do {                                                                              \
    int mt_mpi_rc_ = (expr);                                                        \
    if (mt_mpi_rc_ != MPI_SUCCESS) ::mt::detail::throwMpiError(mt_mpi_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
