#pragma once
// `trainer --version`: meshtrain's version and git commit, and the version of every library the
// trainer was built with next to the one it runs with (CUDA runtime and driver, NCCL, cuDNN, MPI,
// HDF5) — what a bug report needs, and the first thing to compare when two machines disagree.

#include <string>

namespace mt {

// Needs no MPI_Init, no GPU and no driver (a CUDA build on a machine without one says so).
std::string versionReport();

}  // namespace mt
