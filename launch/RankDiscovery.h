#pragma once
// Who launched this process and where it sits, from the launcher's environment — Open MPI's
// mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or any
// PMIx server (PMIX_RANK) — cross-checked against what MPI itself reports.
//
// The check catches the classic cluster mistake: `srun trainer` without --mpi=pmix (or with an
// MPI plugin the library was not built for) starts N singleton MPI processes of world size 1,
// which would each train the whole model alone. That is an error naming the variables and the
// fix, on every task, with exit code 2.
//
// Inside an sbatch script that calls mpirun, the ranks inherit the batch step's SLURM_PROCID:
// Open MPI's own variables take precedence over Slurm's whenever both are present.

#include <string>

#include "comm/MpiEnvironment.h"

namespace mt {

struct LaunchInfo {
  std::string launcher = "none";  // mpirun, srun, pmix or none (a plain process)
  int rank = 0, size = 1, localRank = 0, localSize = 1;
  std::string slurmJobId;         // empty outside Slurm
  std::string slurmNodeList;
  int slurmRestarts = 0;          // SLURM_RESTART_COUNT: times this job was requeued
  std::string describe() const;
};

// Reads the environment; throws ConfigError when it contradicts MPI.
LaunchInfo discoverLaunch(const MpiEnvironment& mpi);

// Before MPI_Init: an srun task of a multi-task step with no PMI/PMIx in its environment would
// come up as a singleton (or make the MPI library abort with its own exit code). Returns the
// error to print (exit code 2), or "" when the launch looks sound.
std::string launchPreflightError();

}  // namespace mt
