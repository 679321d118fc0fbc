#include "launch/RankDiscovery.h"

#include <cstdlib>
#include <sstream>

#include "core/Error.h"

namespace mt {

namespace {

bool envInt(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0') return false;
  *out = static_cast<int>(x);
  return true;
}

std::string envStr(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::string LaunchInfo::describe() const {
  std::ostringstream os;
  os << "launcher " << launcher << ", rank " << rank << " of " << size << ", local rank " << localRank << " of "
     << localSize;
  if (!slurmJobId.empty()) {
    os << ", Slurm job " << slurmJobId << " on " << slurmNodeList;
    if (slurmRestarts > 0) os << " (requeued " << slurmRestarts << "x)";
  }
  return os.str();
}

LaunchInfo discoverLaunch(const MpiEnvironment& mpi) {
  LaunchInfo li;
  li.slurmJobId = envStr("SLURM_JOB_ID");
  li.slurmNodeList = envStr("SLURM_JOB_NODELIST");
  envInt("SLURM_RESTART_COUNT", &li.slurmRestarts);
  const int mpiRank = mpi.rank(), mpiSize = mpi.size();
  int r = -1, n = -1, lr = -1, ln = -1;
  std::string rankVar, sizeVar;
  if (envInt("OMPI_COMM_WORLD_RANK", &r) && envInt("OMPI_COMM_WORLD_SIZE", &n)) {
    li.launcher = "mpirun";
    rankVar = "OMPI_COMM_WORLD_RANK";
    sizeVar = "OMPI_COMM_WORLD_SIZE";
    envInt("OMPI_COMM_WORLD_LOCAL_RANK", &lr);
    envInt("OMPI_COMM_WORLD_LOCAL_SIZE", &ln);
  } else if (!envStr("SLURM_STEP_ID").empty() && envInt("SLURM_PROCID", &r) && envInt("SLURM_NTASKS", &n)) {
    li.launcher = "srun";
    rankVar = "SLURM_PROCID";
    sizeVar = "SLURM_NTASKS";
    envInt("SLURM_LOCALID", &lr);
  } else if (envInt("PMIX_RANK", &r)) {
    li.launcher = "pmix";
    rankVar = "PMIX_RANK";
    n = mpiSize;  // PMIx publishes the size through its API, not the environment
  }
  if (li.launcher == "none") {
    li.rank = mpiRank;
    li.size = mpiSize;
    li.localRank = mpi.localRank();
    li.localSize = mpi.localSize();
    return li;
  }
  if (n != mpiSize || r != mpiRank) {
    std::ostringstream os;
    os << "the launcher says " << rankVar << "=" << r;
    if (!sizeVar.empty()) os << " " << sizeVar << "=" << n;
    os << " but MPI says rank " << mpiRank << " of " << mpiSize << ": ";
    if (li.launcher == "srun" && mpiSize == 1)
      os << "srun started " << n << " independent MPI singletons; launch with `srun --mpi=pmix` (see `srun "
         << "--mpi=list`) or use mpirun inside the allocation (scripts/slurm/)";
    else
      os << "the MPI library and the launcher disagree (mixed MPI installations?)";
    throw ConfigError(os.str());
  }
  li.rank = r;
  li.size = n;
  // Node-local placement: MPI's shared-memory split is the truth; the launcher must agree unless
  // nodes are emulated (MT_NODE_SPLIT).
  li.localRank = mpi.localRank();
  li.localSize = mpi.localSize();
  if (mpi.emulatedNodeSize() == 0 && lr >= 0 && lr != mpi.localRank())
    throw ConfigError("the launcher gives local rank " + std::to_string(lr) + " but MPI finds this process at " +
                      "local rank " + std::to_string(mpi.localRank()) + " of its node");
  if (mpi.emulatedNodeSize() == 0 && ln > 0 && ln != mpi.localSize())
    throw ConfigError("the launcher gives " + std::to_string(ln) + " ranks on this node, MPI finds " +
                      std::to_string(mpi.localSize()));
  return li;
}

std::string launchPreflightError() {
  int tasks = 0;
  if (envStr("SLURM_STEP_ID").empty() || !envInt("SLURM_NTASKS", &tasks) || tasks <= 1) return "";
  for (const char* v : {"PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMI_FD", "PMI_ID"})
    if (!envStr(v).empty()) return "";
  return "srun started this task of " + std::to_string(tasks) + " without an MPI plugin (no PMIx/PMI in the " +
         "environment): launch with `srun --mpi=pmix` (see `srun --mpi=list`), set MpiDefault=pmix in " +
         "slurm.conf, or use mpirun inside the allocation (scripts/slurm/)";
}

}  // namespace mt
