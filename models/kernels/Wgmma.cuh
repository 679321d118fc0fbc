#pragma once
// Hopper warpgroup matrix multiply (PTX ISA "wgmma.mma_async", sm_90a only): one warpgroup (4
// consecutive warps, the first a multiple of 4) computes D[64 x N] (+)= A[64 x 16] B[16 x N] with f32
// accumulators; B always from shared memory, A from shared memory or registers.
//   Accumulator of a thread (lane = 4 g + t, warp w of the group): d[j][0..1] = row 16w + g,
//   columns 8j + 2t, +1; d[j][2..3] = row 16w + g + 8 (the mma.sync m16n8 C layout, per 8 columns).
//   A in registers: the mma.sync m16n8k16 A layout for rows 16w..16w+15, so an accumulator pair
//   (d[2k], d[2k+1]) packed to 16-bit is the A fragment of the k-th 16 columns.
// Shared-memory operands here are tiles of 64 16-bit columns: 128-byte rows in 1024-byte groups of
// 8 rows, the 16-byte chunk c of row r stored at chunk c ^ (r % 8) (the 128-byte swizzle; tile
// bases 1024-byte aligned). The same tile serves two ways:
//   K-major (kmajor()): rows are M (or N), the 64 columns are K; the k-th 16-column step starts
//     32 k bytes into the rows.
//   MN-major (mnmajor(), transpose flag 1): rows are K, the 64 columns are M (or N); the k-th
//     16-row step starts 2048 k bytes in.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "models/kernels/CpAsync.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_WGMMA 1
#else
#define MT_WGMMA 0
#endif
// Inline PTX of sm_90a's instructions (wgmma here, TMA and mbarriers in Tma.cuh): nothing in other
// compilations (the host pass, other architectures), whose kernels are never launched.
#if MT_WGMMA
#define MT_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MT_SM90_ASM(...) \
  do {                   \
  } while (0)
#endif

namespace mt::cuda::wg {

// Element offset of (row, 8-element chunk) in a swizzled 64-column tile.
__device__ __forceinline__ int swz(int row, int chunk) { return row * 64 + ((chunk ^ (row & 7)) << 3); }

// Matrix descriptor: start address, leading / stride byte offsets (>> 4), 128-byte swizzle (1 << 62).
__device__ __forceinline__ uint64_t descriptor(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = smemAddr(smem);
  return ((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}
// K-major: the stride byte offset steps 8 rows (1024 bytes); the leading one is unused when swizzled.
__device__ __forceinline__ uint64_t kmajor(const void* smem) { return descriptor(smem, 16, 1024); }
// MN-major: 8 K-rows apart is 1024 bytes. The other offset steps 64 MN-columns, which the tiles here
// never cross; it is given the same value so that either reading of the two fields is right.
__device__ __forceinline__ uint64_t mnmajor(const void* smem) { return descriptor(smem, 1024, 1024); }

__device__ __forceinline__ void fence() {
#if MT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if MT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if MT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared memory written by ordinary stores or cp.async, read next by wgmma (the async proxy):
// every writing thread fences before the barrier.
__device__ __forceinline__ void fenceProxyAsync() {
#if MT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of accumulators across wgmma issue / wait points.
template <int R>
__device__ __forceinline__ void fenceOperand(float (&d)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// Wgmma<N, T>::ss<TA, TB>(d, descA, descB, accumulate) and ::rs<TB>(d, aRegs, descB, accumulate):
// accumulate 0 overwrites d. TA / TB: 1 = MN-major (transposed) operand.
template <int N, typename T>
struct Wgmma;

// One specialisation per (N, 16-bit type); TS is the type in PTX ("bf16" / "f16").
#define MT_WGMMA_N64(T, TS) \
  template <> \
  struct Wgmma<64, T> { \
    template <int TA, int TB> \
    __device__ __forceinline__ static void ss(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) { \
      MT_SM90_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
                  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TS "." TS "\n" \
                  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
                  "%32, %33, p, 1, 1, %35, %36;\n}\n" \
                  : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
                    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
                    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
                    "+f"(d[7][2]), "+f"(d[7][3]) \
                  : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB)); \
    } \
    template <int TB> \
    __device__ __forceinline__ static void rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, \
                                              int accumulate) { \
      MT_SM90_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
                  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TS "." TS "\n" \
                  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
                  "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
                  : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
                    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
                    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
                    "+f"(d[7][2]), "+f"(d[7][3]) \
                  : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TB)); \
    } \
  };
MT_WGMMA_N64(__nv_bfloat16, "bf16")
MT_WGMMA_N64(__half, "f16")
#undef MT_WGMMA_N64

#define MT_WGMMA_N128(T, TS) \
  template <> \
  struct Wgmma<128, T> { \
    template <int TA, int TB> \
    __device__ __forceinline__ static void ss(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) { \
      MT_SM90_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TS "." TS "\n" \
                  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
                  "%64, %65, p, 1, 1, %67, %68;\n}\n" \
                  : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
                    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
                    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
                    "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
                    "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
                    "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), \
                    "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
                    "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
                  : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB)); \
    } \
    template <int TB> \
    __device__ __forceinline__ static void rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b, \
                                              int accumulate) { \
      MT_SM90_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TS "." TS "\n" \
                  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
                  "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
                  : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
                    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
                    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
                    "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
                    "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
                    "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), \
                    "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
                    "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
                  : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TB)); \
    } \
  };
MT_WGMMA_N128(__nv_bfloat16, "bf16")
MT_WGMMA_N128(__half, "f16")
#undef MT_WGMMA_N128


}  // namespace mt::cuda::wg
