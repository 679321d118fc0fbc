// The CUDA half of core/Fp8.h: cast kernels (with the amax reduction fused into the cast, and the
// transposed copy the TN FP8 GEMMs need), the scale updates on the device (no host round trip per
// tensor), and the FP8 GEMM through cuBLASLt.
//
// The cast runs as castKernelVec (16-byte loads, 8-byte stores of q, the transposed copy in whole
// sectors) where the shape allows it, which is every GPT GEMM operand; castKernel (one element
// per thread) elsewhere. Same codes.
// One quantization (Fp8State layout [scaleInv, scale, amax, h_0..h_{L-1}]):
//   current:        amax pass -> scale kernel (scaleFrom(amax)) -> cast pass -> history push
//   delayed:        scale kernel (scaleFrom(max h)) -> cast pass, amax fused -> history push; with
//                   MT_FP8_FUSED >= 1 and L <= 32, one cast kernel: every block takes scaleFrom(max
//                   h) from the history (one warp's lanes read it), reduces its amax into
//                   Fp8State::deviceScratch and counts itself done there; the last block to count
//                   writes scale, scaleInv and amax, pushes the history and zeroes the scratch. The
//                   other blocks read the state only before they count, so nothing reads what the
//                   last one writes. It saves two one-thread kernels (a few us each on a busy
//                   stream) per cast, ~12 casts a GPT block a step.
//   delayed, first: as current (no history yet; the host counts casts, Fp8State::casts).
// The cast is CUDA's __nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE, f) (cvt.rn.satfinite on
// sm_89+); the product x * scale is one IEEE f32 multiply, as on the CPU, and the scale math is
// the same __host__ __device__ code (IEEE division; the tree builds without fast-math), so the
// codes and scales are bit-identical to the CPU emulation.
// amax: |x| is non-negative, so its f32 bits order as unsigned integers and atomicMax on them is
// the float max; a NaN's bits exceed infinity's, so a NaN wins, as on the CPU.
// The kernels read through a loader (ValueLoad, GeluLoad, DGeluLoad): the fused casts of
// Fp8CastOp compute GELU(x) or dy * GELU'(pre) in registers on the way to the codes, so the GPT
// MLP's GELU output and its gradient never go through memory; the dGELU cast also reduces the
// column sums (fc's bias gradient), per 64-row tile and then in tile order, deterministic.

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "core/Check.h"
#include "core/Convert.h"
#include "core/EnvParams.h"
#include "core/Fp8.h"
#include "core/GeluMath.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/ElementConvert.cuh"
#include "core/cuda/Fp8Cast.cuh"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;  // a 32 x 32 tile per block of 32 x 8 threads

__device__ inline uint8_t castIntrinsic(float v, Fp8Format f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, interpretation(f)));
}

// Eight consecutive elements (16-byte aligned) as floats.
__device__ inline void load8(const __nv_bfloat16* p, float* v) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ inline void load8(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ float tanhApprox(float u) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
  return t;
}

// What a cast reads at element i (one, or eight from an index that is a multiple of 8): the
// tensor itself, GELU of it, or it times GELU' of the pre-activation (Fp8CastOp; core/GeluMath.h).
template <typename T>
struct ValueLoad {
  const T* x;
  __device__ float one(int64_t i) const { return toF32(x[i]); }
  __device__ void eight(int64_t i, float* v) const { load8(x + i, v); }
  bool aligned16() const { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }
};
template <typename T>
struct GeluLoad {
  const T* x;
  __device__ static float f(float v) { return geluFromTanh(v, tanhApprox(geluTanhArg(v))); }
  __device__ float one(int64_t i) const { return f(toF32(x[i])); }
  __device__ void eight(int64_t i, float* v) const {
    load8(x + i, v);
    for (int k = 0; k < 8; ++k) v[k] = f(v[k]);
  }
  bool aligned16() const { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }
};
template <typename T, typename P>
struct DGeluLoad {
  const T* dy;
  const P* pre;
  __device__ static float f(float d, float p) { return d * geluGradFromTanh(p, tanhApprox(geluTanhArg(p))); }
  __device__ float one(int64_t i) const { return f(toF32(dy[i]), toF32(pre[i])); }
  __device__ void eight(int64_t i, float* v) const {
    float p[8];
    load8(dy + i, v);
    load8(pre + i, p);
    for (int k = 0; k < 8; ++k) v[k] = f(v[k], p[k]);
  }
  bool aligned16() const {
    return reinterpret_cast<uintptr_t>(dy) % 16 == 0 && reinterpret_cast<uintptr_t>(pre) % 16 == 0;
  }
};

template <typename Load>
__global__ void amaxKernel(Load ld, int64_t n, float* state) {
  float m = 0.f;
  MT_GRID_STRIDE(i, n) m = absMaxBits(m, ld.one(i));
  blockAmaxAtomic(m, state + Fp8State::kAmax);
}

// x viewed as [R, C]: q[r, c] and (when qt) qt[c, r] = fp8(x[r, c] * scale); the scale and the
// amax of x as cs says (the delayed recipe: the scale from the history, the amax this tensor's).
// colPart (optional, f32 [gridDim.y, C]): the tile's column sums of x, unquantized, summed over
// the grid's rows afterwards in a fixed order (colSumKernel).
template <typename Load>
__global__ void castKernel(Load ld, uint8_t* q, uint8_t* qt, int64_t R, int64_t C, CastScaling cs, float* colPart) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float part[kRowsPerPass][kTile];
  const float scale = castScale(cs);
  const Fp8Format f = cs.f;
  const int64_t c = blockIdx.x * static_cast<int64_t>(kTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kTile);
  float m = 0.f, sum = 0.f;
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t r = r0 + j;
    if (r < R && c < C) {
      const float v = ld.one(r * C + c);
      m = absMaxBits(m, v);
      sum += v;
      const uint8_t code = castIntrinsic(v * scale, f);
      q[r * C + c] = code;
      tile[j][threadIdx.x] = code;
    }
  }
  castAmax(cs, m, scale);
  if (colPart) {
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      float s = 0.f;
      for (int j = 0; j < kRowsPerPass; ++j) s += part[j][threadIdx.x];
      colPart[blockIdx.y * C + c] = s;
    }
  }
  if (!qt) return;
  __syncthreads();
  // Transposed write: thread x runs along r (coalesced in qt's rows).
  const int64_t rr = r0 + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t cc = blockIdx.x * static_cast<int64_t>(kTile) + j;
    if (rr < R && cc < C) qt[cc * R + rr] = tile[threadIdx.x][j];
  }
}

constexpr int kVecTile = 64, kVecThreads = 256;

// castKernel for the shapes every GPT GEMM has (C a multiple of 8; R a multiple of 16 when the
// transpose is written; aligned buffers): the same codes and amax, with 16-byte loads, 8-byte
// stores of q and 16-byte stores of qt; what makes the cast a bandwidth-bound pass (the scalar
// kernel moves 2 bytes in and 2 out per thread and instruction). A 64 x 64 tile per block of 256
// threads: thread t loads 8 columns of rows t/8 and t/8 + 32 and converts them two codes per
// instruction. The transposed copy goes out in whole sectors: the four 16-row pieces of a column of
// qt (64 bytes, two 32-byte sectors) are written by four neighbouring lanes of one store
// instruction (lane l of warp w: column 8w + l/4, rows 16 (l % 4)..+16); a kernel whose lanes each
// wrote 16 rows of a different column filled half sectors, the other halves coming from other
// warps (L2 write sectors 1.5x the bytes; 1.7-2.0 TB/s against 2.1-2.5 for this one, H100,
// docs/performance.md). The tile is 64 x 64 bytes without padding; the 8-byte chunk k of row r
// sits at chunk k ^ (r / 16), so the four pieces a warp's read instruction touches (rows 16p + i,
// chunk w ^ p) lie in four different bank pairs.
// Column sums: lanes t, t+8, t+16, t+24 of a warp hold the same 8 columns (shuffles), then the
// eight warps' sums through shared memory in warp order.
template <typename Load>
__global__ void __launch_bounds__(kVecThreads)
    castKernelVec(Load ld, uint8_t* q, uint8_t* qt, int64_t R, int64_t C, CastScaling cs, float* colPart) {
  __shared__ __align__(16) uint8_t tile[kVecTile * kVecTile];
  __shared__ float part[kVecThreads / 32][kVecTile];
  const float scale = castScale(cs);
  const Fp8Format f = cs.f;
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(kVecTile), r0 = blockIdx.y * static_cast<int64_t>(kVecTile);
  const int t = threadIdx.x, ck = t % 8, cl = ck * 8;
  float m = 0.f, sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int rl = t / 8 + 32 * pass;
    const int64_t r = r0 + rl, c = c0 + cl;
    if (r < R && c < C) {
      float v[8];
      ld.eight(r * C + c, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        m = absMaxBits(m, v[i]);
        sum[i] += v[i];
      }
      const uint2 packed = castEight(v, scale, f);
      *reinterpret_cast<uint2*>(q + r * C + c) = packed;
      *reinterpret_cast<uint2*>(&tile[rl * kVecTile + ((ck ^ (rl / 16)) * 8)]) = packed;
    }
  }
  castAmax(cs, m, scale);
  if (colPart) {
    for (int i = 0; i < 8; ++i) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 8);
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 16);
    }
    if (t % 32 < 8)
      for (int i = 0; i < 8; ++i) part[t / 32][cl + i] = sum[i];
    __syncthreads();
    if (t < kVecTile && c0 + t < C) {
      float s = 0.f;
      for (int w = 0; w < kVecThreads / 32; ++w) s += part[w][t];
      colPart[blockIdx.y * C + c0 + t] = s;
    }
  }
  if (!qt) return;
  __syncthreads();
  const int warp = t / 32, lane = t % 32, piece = lane % 4, col = warp * 8 + lane / 4;
  const int64_t cc = c0 + col, rr = r0 + piece * 16;
  if (cc < C && rr < R) {  // R % 16 == 0: the 16 rows are all in or all out
    const uint8_t* src = tile + piece * 16 * kVecTile + ((warp ^ piece) * 8) + lane / 4;
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      out[k] = static_cast<uint32_t>(src[(4 * k) * kVecTile]) | (static_cast<uint32_t>(src[(4 * k + 1) * kVecTile]) << 8) |
               (static_cast<uint32_t>(src[(4 * k + 2) * kVecTile]) << 16) |
               (static_cast<uint32_t>(src[(4 * k + 3) * kVecTile]) << 24);
    *reinterpret_cast<uint4*>(qt + cc * R + rr) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// colSum[c] = sum over the cast's row tiles of colPart[b, c], in tile order (deterministic).
__global__ void colSumKernel(const float* colPart, int64_t tiles, int64_t C, float* colSum) {
  MT_GRID_STRIDE(c, C) {
    float s = 0.f;
    for (int64_t b = 0; b < tiles; ++b) s += colPart[b * C + c];
    colSum[c] = s;
  }
}

// amaxKernel with 16-byte loads (n a multiple of 8, x aligned).
template <typename Load>
__global__ void amaxKernelVec(Load ld, int64_t n8, float* state) {
  float m = 0.f;
  MT_GRID_STRIDE(i, n8) {
    float v[8];
    ld.eight(i * 8, v);
    for (int k = 0; k < 8; ++k) m = absMaxBits(m, v[k]);
  }
  blockAmaxAtomic(m, state + Fp8State::kAmax);
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// One cast of what ld reads, [R, C], scaled as cs says (the vectorized kernel where it applies);
// colSum (optional, f32 [C]) its column sums.
template <typename Load>
void launchCast(const Load& ld, uint8_t* q, uint8_t* qt, int64_t R, int64_t C, const CastScaling& cs,
                Tensor* colSum, cudaStream_t s) {
  const bool vec = C % 8 == 0 && ld.aligned16() && aligned(q, 8) && (!qt || (R % 16 == 0 && aligned(qt, 16)));
  const int tile = vec ? kVecTile : kTile;
  MT_CHECK((C + tile - 1) / tile < (1ll << 31) && (R + tile - 1) / tile <= 65535, "fp8 cast of [", R, ", ", C,
           "]: more than 65535 x ", tile, " rows");
  const dim3 grid(static_cast<unsigned>((C + tile - 1) / tile), static_cast<unsigned>((R + tile - 1) / tile));
  Tensor colPart;
  if (colSum) colPart = Tensor::empty({static_cast<int64_t>(grid.y), C}, DType::kF32, colSum->device());
  float* part = colSum ? colPart.data<float>() : nullptr;
  if (vec)
    castKernelVec<<<grid, kVecThreads, 0, s>>>(ld, q, qt, R, C, cs, part);
  else
    castKernel<<<grid, dim3(kTile, kRowsPerPass), 0, s>>>(ld, q, qt, R, C, cs, part);
  checkLaunch();
  if (colSum) {
    colSumKernel<<<gridFor1d(C), 256, 0, s>>>(part, grid.y, C, colSum->data<float>());
    checkLaunch();
  }
}

template <typename Load>
void launchAmax(const Load& ld, int64_t n, float* state, cudaStream_t s) {
  if (n % 8 == 0 && ld.aligned16())
    amaxKernelVec<<<gridFor1d(n / 8), 256, 0, s>>>(ld, n / 8, state);
  else
    amaxKernel<<<gridFor1d(n), 256, 0, s>>>(ld, n, state);
  checkLaunch();
}

// The scale before a cast (current: from the amax just reduced; delayed: from the history), and
// the amax slot cleared first where the cast itself reduces it.
__global__ void scaleKernel(float* v, int L, Fp8Format f, int margin, bool fromHistory) {
  fp8ScaleBeforeCast(v, L, f, margin, fromHistory, v[Fp8State::kAmax]);
  if (fromHistory) v[Fp8State::kAmax] = 0.f;
}

__global__ void pushKernel(float* v, int L) { fp8PushAmax(v, L, v[Fp8State::kAmax]); }

__global__ void dequantizeKernel(const uint8_t* q, float* x, int64_t n, const float* state, Fp8Format f) {
  const float inv = state[Fp8State::kScaleInv];
  MT_GRID_STRIDE(i, n) x[i] = fp8ToFloat(q[i], f) * inv;
}

__global__ void intrinsicKernel(const float* x, uint8_t* q, int64_t n, Fp8Format f) {
  MT_GRID_STRIDE(i, n) q[i] = castIntrinsic(x[i], f);
}

// One quantization of what ld reads ([R, C]) with st's recipe (the header comment's sequence);
// colSum (optional) gets its column sums from the cast pass.
template <typename Load>
void quantizeWith(const Load& ld, Tensor& q, int64_t R, int64_t C, Fp8State& st, Tensor* qt, Tensor* colSum) {
  float* v = st.values().data<float>();
  const Fp8Options& o = st.options();
  const bool delayed = o.recipe == Fp8Recipe::kDelayed && st.casts() > 0;
  cudaStream_t s = currentStream();
  uint8_t* qp = q.data<uint8_t>();
  uint8_t* qtp = qt ? qt->data<uint8_t>() : nullptr;
  static const bool fused = envInt(EnvParam::kFp8Fused) >= 1;
  CastScaling cs;
  if (fused && producerScaling(st, false, &cs)) {  // delayed, in one kernel
    launchCast(ld, qp, qtp, R, C, cs, colSum, s);
    st.setCasts(st.casts() + 1);
    return;
  }
  cs.state = v;
  cs.f = st.format();
  if (!delayed) {
    CUDA_CHECK(cudaMemsetAsync(v + Fp8State::kAmax, 0, sizeof(float), s));
    launchAmax(ld, R * C, v, s);
  }
  scaleKernel<<<1, 1, 0, s>>>(v, o.historyLength, st.format(), o.margin, delayed);
  checkLaunch();
  cs.withAmax = delayed;
  launchCast(ld, qp, qtp, R, C, cs, colSum, s);
  pushKernel<<<1, 1, 0, s>>>(v, o.historyLength);
  checkLaunch();
  st.setCasts(st.casts() + 1);
}

// f(load) for the loader of what `in` reads (x and pre each f32 or bf16).
template <typename F>
void withLoad(const Fp8CastInput& in, F&& f) {
  const Tensor& x = *in.x;
  const bool xb = x.dtype() == DType::kBF16;
  MT_CHECK(xb || x.dtype() == DType::kF32, "fp8 cast of ", x.str(), ": f32 or bf16 only");
  const auto* xh = static_cast<const __nv_bfloat16*>(x.rawData());
  const auto* xf = static_cast<const float*>(x.rawData());
  if (in.op == Fp8CastOp::kValue) {
    if (xb) f(ValueLoad<__nv_bfloat16>{xh});
    else f(ValueLoad<float>{xf});
  } else if (in.op == Fp8CastOp::kGelu) {
    if (xb) f(GeluLoad<__nv_bfloat16>{xh});
    else f(GeluLoad<float>{xf});
  } else {
    const bool pb = in.pre->dtype() == DType::kBF16;
    const auto* ph = static_cast<const __nv_bfloat16*>(in.pre->rawData());
    const auto* pf = static_cast<const float*>(in.pre->rawData());
    if (xb && pb) f(DGeluLoad<__nv_bfloat16, __nv_bfloat16>{xh, ph});
    else if (xb) f(DGeluLoad<__nv_bfloat16, float>{xh, pf});
    else if (pb) f(DGeluLoad<float, __nv_bfloat16>{xf, ph});
    else f(DGeluLoad<float, float>{xf, pf});
  }
}

void checkStateDevice(const Fp8State& st, const Tensor& x) {
  MT_CHECK(st.values().device() == x.device(), "fp8 state on ", st.values().device().str(), " for ", x.str());
}

int64_t colsOf(const Tensor& x) { return x.ndim() ? x.dim(-1) : 1; }

template <typename T>
__global__ void addBiasKernel(T* d, const __nv_bfloat16* bias, int64_t n, int64_t cols) {
  MT_GRID_STRIDE(i, n) d[i] = fromF32<T>(toF32(d[i]) + __bfloat162float(bias[i % cols]));
}

cudaDataType_t fp8Type(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

bool producerScaling(Fp8State& st, bool replay, CastScaling* cs) {
  const Fp8Options& o = st.options();
  *cs = CastScaling{};
  cs->state = st.values().data<float>();
  cs->f = st.format();
  if (replay) return true;
  if (o.recipe != Fp8Recipe::kDelayed || st.casts() == 0 || o.historyLength > kFusedMaxHistory) return false;
  cs->fused = reinterpret_cast<unsigned*>(st.deviceScratch().data<int32_t>());
  cs->L = o.historyLength;
  cs->margin = o.margin;
  return true;
}

void fp8QuantizeOnDevice(Tensor& q, const Fp8CastInput& in, Fp8State& st, Tensor* transposed) {
  checkStateDevice(st, *in.x);
  if (in.x->numel() == 0) return;
  const int64_t C = colsOf(*in.x), R = in.x->numel() / C;
  withLoad(in, [&](const auto& ld) { quantizeWith(ld, q, R, C, st, transposed, in.colSum); });
}

void fp8QuantizeReplayOnDevice(Tensor& q, const Fp8CastInput& in, const Fp8State& st, Tensor* transposed) {
  checkStateDevice(st, *in.x);
  if (in.x->numel() == 0) return;
  const int64_t C = colsOf(*in.x), R = in.x->numel() / C;
  uint8_t* qt = transposed ? transposed->data<uint8_t>() : nullptr;
  float* v = st.values().data<float>();
  CastScaling cs;
  cs.state = v;
  cs.f = st.format();
  withLoad(in, [&](const auto& ld) { launchCast(ld, q.data<uint8_t>(), qt, R, C, cs, in.colSum, currentStream()); });
}

void fp8DequantizeOnDevice(Tensor& x, const Tensor& q, const Fp8State& st) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dequantizeKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(q.data<uint8_t>(), x.data<float>(), n,
                                                              st.values().data<float>(), st.format());
  checkLaunch();
}

void fp8CastIntrinsic(Tensor& q, const Tensor& x, Fp8Format f) {
  MT_CHECK(x.dtype() == DType::kF32 && q.dtype() == DType::kU8 && q.numel() == x.numel(), "fp8 cast ",
           x.str());
  const int64_t n = x.numel();
  if (n == 0) return;
  intrinsicKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(x.data<float>(), q.data<uint8_t>(), n, f);
  checkLaunch();
}

// cuBLASLt's FP8 rules (Hopper/Ada): TN only (our row-major A[M,K] · B[N,K]^T is its column-major
// A^T B with both operands K-contiguous), E5M2 x E5M2 unsupported, dimensions and leading
// dimensions multiples of 16; the A/B scale pointers multiply the f32 accumulator; a D scale
// exists only for FP8 outputs (ours are bf16/f32); a bf16 bias with a bf16 D. biasCast holds the
// bf16 copy of an f32 bias (freed stream-ordered after the GEMM).
namespace {
GemmCall fp8Call(const Fp8GemmArgs& a, Tensor& biasCast) {
  MT_CHECK(a.M % 16 == 0 && a.N % 16 == 0 && a.K % 16 == 0, "fp8 gemm M=", a.M, " N=", a.N, " K=", a.K,
           ": cuBLASLt's FP8 kernels need multiples of 16");
  MT_CHECK(!(a.fa == Fp8Format::kE5M2 && a.fb == Fp8Format::kE5M2), "fp8 gemm: E5M2 x E5M2 is not supported");
  GemmCall g;
  g.transA = Trans::kNo;
  g.transB = Trans::kYes;
  g.M = a.M, g.N = a.N, g.K = a.K;
  g.A = a.A->rawData();
  g.B = a.B->rawData();
  g.C = a.D->rawData();
  if (a.C) g.Cin = a.C->rawData();
  g.beta = a.beta;
  g.abType = fp8Type(a.fa);
  g.bType = fp8Type(a.fb);
  g.scaleA = a.sa->scaleInvPtr();
  g.scaleB = a.sb->scaleInvPtr();
  g.cType = a.D->dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  g.fastAccum = a.fastAccum;
  if (a.bias) {
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (a.bias->dtype() == DType::kBF16) {
      g.bias = a.bias->rawData();
    } else {
      biasCast = Tensor::empty(a.bias->shape(), DType::kBF16, a.bias->device());
      convertInto(biasCast, *a.bias);
      g.bias = biasCast.rawData();
    }
  }
  return g;
}
}  // namespace

void fp8GemmOnDevice(const Fp8GemmArgs& a) {
  Tensor biasCast;
  GemmCall g = fp8Call(a, biasCast);
  if (tryGemm(g)) return;
  MT_CHECK(a.bias != nullptr, "cuBLASLt has no FP8 algorithm for GEMM M=", a.M, " N=", a.N, " K=", a.K);
  // No FP8 kernel with this bias epilogue here: the GEMM, then the (bf16-rounded) bias added in f32.
  const void* biasPtr = g.bias;
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  g.bias = nullptr;
  gemm(g);
  const int64_t n = a.M * a.N;
  if (a.D->dtype() == DType::kBF16)
    addBiasKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(
        static_cast<__nv_bfloat16*>(a.D->rawData()), static_cast<const __nv_bfloat16*>(biasPtr), n, a.N);
  else
    addBiasKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(
        a.D->data<float>(), static_cast<const __nv_bfloat16*>(biasPtr), n, a.N);
  checkLaunch();
}

// GELU_AUX(_BIAS) writes the pre-activation as its aux matrix and GELU of it as D; DGELU reads the
// pre-activation as aux and multiplies the product by GELU' of it. The aux matrix has D's type.
bool fp8GemmGeluOnDevice(const Fp8GemmArgs& a) {
  Tensor biasCast;
  GemmCall g = fp8Call(a, biasCast);
  if (a.geluPre) {
    g.epilogue = a.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    g.aux = a.geluPre->rawData();
  } else {
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.aux = const_cast<void*>(a.dgeluPre->rawData());
  }
  g.ldAux = a.N;
  return tryGemm(g);
}

}  // namespace mt::cuda
