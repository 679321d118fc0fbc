#include "launch/Version.h"

#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>

#ifdef MT_WITH_CUDA
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>
#endif

namespace mt {

const char* buildGitCommit();  // generated at build time (launch/BuildInfo.cmake)

namespace {

std::string dotted(long major, long minor, long patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// NCCL's and cuDNN's version codes: MAJOR*10000 + MINOR*100 + PATCH since NCCL 2.9 and cuDNN 9,
// MAJOR*1000 + MINOR*100 + PATCH before.
[[maybe_unused]] std::string fromCode(long code) {
  if (code >= 10000) return dotted(code / 10000, (code % 10000) / 100, code % 100);
  return dotted(code / 1000, (code % 1000) / 100, code % 100);
}

[[maybe_unused]] std::string cudaVersion(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown compiler";
#endif
}

std::string mpiBuiltWith() {
#if defined(OMPI_MAJOR_VERSION)
  std::string lib = "Open MPI " + dotted(OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
  std::string lib = "MPICH " MPICH_VERSION;
#else
  std::string lib = "MPI library";
#endif
  return lib + " (MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION) + ")";
}

// The library's own words, up to the first comma ("Open MPI v4.1.4"); callable before MPI_Init.
std::string mpiRunningWith() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0, version = 0, subversion = 0;
  MPI_Get_library_version(text, &len);
  MPI_Get_version(&version, &subversion);
  std::string lib(text);
  lib = lib.substr(0, lib.find_first_of(",\n"));
  return lib + " (MPI " + std::to_string(version) + "." + std::to_string(subversion) + ")";
}

std::string hdf5RunningWith() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return dotted(major, minor, release);
}

class Table {
 public:
  void row(const std::string& name, const std::string& built, const std::string& running,
           bool compare = true) {
    char line[512];
    const char* mark = compare && built != running ? "  (differs from the build)" : "";
    std::snprintf(line, sizeof(line), "  %-13s %-30s %s%s\n", name.c_str(), built.c_str(), running.c_str(),
                  mark);
    os_ << line;
  }
  std::ostringstream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

}  // namespace

std::string versionReport() {
  Table t;
  t.stream() << "meshtrain " << MT_VERSION << " (git " << buildGitCommit() << ", " << MT_BUILD_TYPE
             << " build, " << compiler() << ")\n";
  t.row("", "built with", "running with", false);
#ifdef MT_WITH_CUDA
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  ncclGetVersion(&nccl);
  t.row("CUDA runtime", cudaVersion(CUDART_VERSION), cudaVersion(runtime));
  t.row("CUDA driver", "-",
        driver > 0 ? "supports CUDA " + cudaVersion(driver) : "none (no NVIDIA driver here)", false);
  t.row("NCCL", dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), fromCode(nccl));
  t.row("cuDNN", dotted(CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL),
        fromCode(static_cast<long>(cudnnGetVersion())));
#else
  t.stream()
      << "  CUDA          not built with CUDA: a CPU-only build (no NCCL, no cuDNN; train.device = cpu)\n";
#endif
  t.row("MPI", mpiBuiltWith(), mpiRunningWith(), false);
  t.row("HDF5", dotted(H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE), hdf5RunningWith());
  return t.stream().str();
}

}  // namespace mt
