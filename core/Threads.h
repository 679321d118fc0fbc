#pragma once
// CPU thread budget of one rank: BLAS and OpenMP kernels share it. With several ranks on one node
// each gets cores / local ranks, so `mpirun -np 4` on a 2-core laptop does not oversubscribe 8x.

namespace mt {

// Sets OpenBLAS and OpenMP to n threads (n >= 1).
void setNumThreads(int n);
int numThreads();
// MT_NUM_THREADS if set, else max(1, hardware threads / ranksOnNode).
int defaultNumThreads(int ranksOnNode);

}  // namespace mt
