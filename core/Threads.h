#pragma once
// CPU thread budget of one rank: BLAS and OpenMP kernels share it. With several ranks on one node
// each gets cores / local ranks, so `mpirun -np 4` on a 2-core laptop does not oversubscribe 8x.

namespace mt {

// Sets OpenBLAS and OpenMP to n threads (n >= 1).
void setNumThreads(int n);
int numThreads();
// MT_NUM_THREADS if set, else max(1, hardware threads / ranksOnNode), but no more than the cores
// this process may run on (a launcher that binds a rank to k cores: more threads would share them).
int defaultNumThreads(int ranksOnNode);
// A rank's share of the node: max(1, hardware threads / ranksOnNode).
int coresPerRank(int ranksOnNode);
// The cores this process may run on (its affinity mask); 0 when unknown.
int affinityCores();

}  // namespace mt
