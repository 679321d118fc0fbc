#pragma once
// Hopper's asynchronous copies and transaction barriers (PTX ISA: "mbarrier", "cp.async.bulk",
// "cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor"; sm_90), for warp-specialized kernels: a
// producer thread starts copies that complete on an mbarrier by byte count (no per-tile
// __syncthreads), consumers wait on the barrier's phase parity and hand the buffer back through a
// second barrier. Tensor copies take a CUtensorMap made on the host (models/kernels/TensorMap.h),
// passed as a __grid_constant__ kernel parameter; with 128-byte swizzle they lay 128-byte rows out
// exactly as Wgmma.cuh's swizzled tiles (chunk c of row r at chunk c ^ (r % 8)).
// The helpers compile to nothing outside sm_90 device code (MT_WGMMA: the kernels that use them are
// launched only where sm90KernelsUsable()).

#include <cuda.h>

#include <cstdint>

#include "models/kernels/Wgmma.cuh"

namespace mt::cuda::tma {

// ---- mbarrier (a 64-bit word in shared memory) -----------------------------------------------
__device__ __forceinline__ void barrierInit(uint64_t* bar, uint32_t count) {
  MT_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smemAddr(bar)), "r"(count) : "memory");
}
// Makes initialised barriers visible to the async proxy (the copies that complete on them).
__device__ __forceinline__ void fenceBarrierInit() {
  MT_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of copies that will complete on this phase.
__device__ __forceinline__ void arriveExpectTx(uint64_t* bar, uint32_t bytes) {
  MT_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smemAddr(bar)), "r"(bytes)
              : "memory");
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  MT_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smemAddr(bar)) : "memory");
}
// Blocks until the phase with this parity (0 or 1) has completed, or traps after kWaitTries
// tries. A phase completes within microseconds unless a copy or an arrival never comes (a bug, or
// a tensor map that does not match the data): the kernel then fails with an error that CUDA_CHECK
// reports at the next synchronisation, in place of a GPU spinning until the job's time limit.
// Each try suspends the thread up to a system-dependent time while the phase is pending, so
// 2^30 tries outlast any wait that would end by itself (how long they take is what
// tests/models/test_tma_wait.cu's ProductionBoundEnds measures; not yet run on a GPU).
// The count lives inside the asm: a C++ loop around try_wait with a clock read made ptxas spill
// the backward's registers (588 bytes); this form spills none.
constexpr uint32_t kWaitTries = 1u << 30;
template <uint32_t kTries = kWaitTries>  // fewer in tests/models/test_tma_wait.cu
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  MT_SM90_ASM(
      "{\n.reg .pred p;\n.reg .u32 n;\nmov.u32 n, 0;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "add.u32 n, n, 1;\n"
      "setp.lt.u32 p, n, %2;\n"
      "@p bra WAIT_%=;\n"
      "trap;\n"
      "DONE_%=:\n}\n" ::"r"(smemAddr(bar)),
      "r"(parity), "n"(kTries)
      : "memory");
}

// ---- copies ----------------------------------------------------------------------------------
// A box of a 4-D tensor (coordinates innermost first) into shared memory, completing on bar.
__device__ __forceinline__ void loadTile4d(void* smem, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                           uint64_t* bar) {
  MT_SM90_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, "
      "%5}], [%6];\n" ::"r"(smemAddr(smem)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smemAddr(bar))
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) contiguous bytes into shared memory.
__device__ __forceinline__ void loadBytes(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  MT_SM90_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smemAddr(smem)),
      "l"(gmem), "r"(bytes), "r"(smemAddr(bar))
      : "memory");
}
// global box += shared box (f32 add, element-wise; out-of-bounds elements are not written), as a
// bulk group of this thread. The shared data must have been written before a fenceProxyAsync.
__device__ __forceinline__ void reduceAddTile4d(const CUtensorMap* map, const void* smem, int c0, int c1,
                                                int c2, int c3) {
  MT_SM90_ASM(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], "
      "[%5];\n" ::"l"(map),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smemAddr(smem))
      : "memory");
}
__device__ __forceinline__ void bulkCommit() {
  MT_SM90_ASM("cp.async.bulk.commit_group;\n" ::: "memory");
}
// At most N of this thread's bulk groups still reading their shared source.
template <int N>
__device__ __forceinline__ void bulkWaitRead() {
  MT_SM90_ASM("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// At most N of this thread's bulk groups not yet complete (writes done).
template <int N>
__device__ __forceinline__ void bulkWait() {
  MT_SM90_ASM("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// The descriptor's cache line fetched ahead of the first copy that names it.
__device__ __forceinline__ void prefetchMap(const CUtensorMap* map) {
  MT_SM90_ASM("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- registers -------------------------------------------------------------------------------
// Warp specialization: a warpgroup that only issues copies gives registers back, and the
// warpgroups doing the math take them (every thread of the warpgroup executes the same call).
template <int N>
__device__ __forceinline__ void decreaseRegisters() {
  MT_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void increaseRegisters() {
  MT_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void namedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mt::cuda::tma
