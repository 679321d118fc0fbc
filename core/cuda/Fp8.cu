// The CUDA half of core/Fp8.h: cast kernels (with the amax reduction fused into the cast, and the
// transposed copy the TN FP8 GEMMs need), the scale updates on the device (no host round trip per
// tensor), and the FP8 GEMM through cuBLASLt.
//
// One quantization (Fp8State layout [scale, scaleInv, amax, h_0..h_{L-1}]):
//   current:        amax pass -> scale kernel (scaleFrom(amax)) -> cast pass -> history push
//   delayed:        scale kernel (scaleFrom(max h)) -> cast pass, amax fused -> history push
//   delayed, first: as current (no history yet; the host counts casts, Fp8State::casts).
// The cast is CUDA's __nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE, f) (cvt.rn.satfinite on
// sm_89+); the product x * scale is one IEEE f32 multiply, as on the CPU, and the scale math is
// the same __host__ __device__ code (IEEE division; the tree builds without fast-math), so the
// codes and scales are bit-identical to the CPU emulation.
// amax: |x| is non-negative, so its f32 bits order as unsigned integers and atomicMax on them is
// the float max; a NaN's bits exceed infinity's, so a NaN wins, as on the CPU.

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "core/Check.h"
#include "core/Convert.h"
#include "core/Fp8.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/ElementConvert.cuh"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;  // a 32 x 32 tile per block of 32 x 8 threads

__device__ inline uint8_t castIntrinsic(float v, Fp8Format f) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ inline void amaxAtomic(float* amax, float blockAmax) {
  atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(blockAmax));
}

// Block-wide max of non-negative values (NaN bits win as in amaxAtomic), then one atomic per block.
__device__ inline void blockAmaxAtomic(float v, float* amax) {
  __shared__ unsigned int sh;
  if (threadIdx.x == 0 && threadIdx.y == 0) sh = 0;
  __syncthreads();
  unsigned int b = __float_as_uint(v);
  for (int o = 16; o > 0; o >>= 1)
    b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
  if ((threadIdx.x % 32) == 0) atomicMax(&sh, b);
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) amaxAtomic(amax, __uint_as_float(sh));
}

template <typename T>
__global__ void amaxKernel(const T* x, int64_t n, float* state) {
  float m = 0.f;
  MT_GRID_STRIDE(i, n) m = __uint_as_float(max(__float_as_uint(m), __float_as_uint(fabsf(toF32(x[i])))));
  blockAmaxAtomic(m, state + Fp8State::kAmax);
}

// x viewed as [R, C]: q[r, c] and (when qt) qt[c, r] = fp8(x[r, c] * scale); amax of x fused when
// withAmax (the delayed recipe: the scale came from the history, the amax is this tensor's).
template <typename T>
__global__ void castKernel(const T* x, uint8_t* q, uint8_t* qt, int64_t R, int64_t C, float* state,
                           Fp8Format f, bool withAmax) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float scale = state[Fp8State::kScale];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kTile);
  float m = 0.f;
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t r = r0 + j;
    if (r < R && c < C) {
      const float v = toF32(x[r * C + c]);
      m = __uint_as_float(max(__float_as_uint(m), __float_as_uint(fabsf(v))));
      const uint8_t code = castIntrinsic(v * scale, f);
      q[r * C + c] = code;
      tile[j][threadIdx.x] = code;
    }
  }
  if (withAmax) blockAmaxAtomic(m, state + Fp8State::kAmax);
  if (!qt) return;
  __syncthreads();
  // Transposed write: thread x runs along r (coalesced in qt's rows).
  const int64_t rr = r0 + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t cc = blockIdx.x * static_cast<int64_t>(kTile) + j;
    if (rr < R && cc < C) qt[cc * R + rr] = tile[threadIdx.x][j];
  }
}

// The scale before a cast (current: from the amax just reduced; delayed: from the history), and
// the amax slot cleared first where the cast itself reduces it.
__global__ void scaleKernel(float* v, int L, Fp8Format f, int margin, bool fromHistory) {
  const float src = fromHistory ? fp8HistoryMax(v + Fp8State::kHistory, L) : v[Fp8State::kAmax];
  v[Fp8State::kScale] = fp8ScaleFrom(src, v[Fp8State::kScale], f, margin);
  v[Fp8State::kScaleInv] = 1.f / v[Fp8State::kScale];
  if (fromHistory) v[Fp8State::kAmax] = 0.f;
}

__global__ void pushKernel(float* v, int L) {
  for (int i = L - 1; i > 0; --i)
    v[Fp8State::kHistory + i] = v[Fp8State::kHistory + i - 1];
  v[Fp8State::kHistory] = v[Fp8State::kAmax];
}

__global__ void dequantizeKernel(const uint8_t* q, float* x, int64_t n, const float* state, Fp8Format f) {
  const float inv = state[Fp8State::kScaleInv];
  MT_GRID_STRIDE(i, n) x[i] = fp8ToFloat(q[i], f) * inv;
}

__global__ void intrinsicKernel(const float* x, uint8_t* q, int64_t n, Fp8Format f) {
  MT_GRID_STRIDE(i, n) q[i] = castIntrinsic(x[i], f);
}

template <typename T>
void quantizeTyped(Tensor& q, const Tensor& x, Fp8State& st, Tensor* qt) {
  const int64_t n = x.numel(), C = x.ndim() ? x.dim(-1) : 1, R = n / C;
  float* v = st.values().data<float>();
  const Fp8Options& o = st.options();
  const bool delayed = o.recipe == Fp8Recipe::kDelayed && st.casts() > 0;
  cudaStream_t s = currentStream();
  if (!delayed) {
    CUDA_CHECK(cudaMemsetAsync(v + Fp8State::kAmax, 0, sizeof(float), s));
    amaxKernel<<<gridFor1d(n), 256, 0, s>>>(static_cast<const T*>(x.rawData()), n, v);
    checkLaunch();
  }
  scaleKernel<<<1, 1, 0, s>>>(v, o.historyLength, st.format(), o.margin, delayed);
  checkLaunch();
  MT_CHECK((C + kTile - 1) / kTile < (1ll << 31) && (R + kTile - 1) / kTile <= 65535, "fp8 cast of ", x.str(),
           ": more than 65535 x 32 rows");
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile),
                  static_cast<unsigned>((R + kTile - 1) / kTile));
  castKernel<<<grid, dim3(kTile, kRowsPerPass), 0, s>>>(static_cast<const T*>(x.rawData()), q.data<uint8_t>(),
                                                        qt ? qt->data<uint8_t>() : nullptr, R, C, v,
                                                        st.format(), delayed);
  checkLaunch();
  pushKernel<<<1, 1, 0, s>>>(v, o.historyLength);
  checkLaunch();
  st.setCasts(st.casts() + 1);
}

template <typename T>
__global__ void addBiasKernel(T* d, const __nv_bfloat16* bias, int64_t n, int64_t cols) {
  MT_GRID_STRIDE(i, n) d[i] = fromF32<T>(toF32(d[i]) + __bfloat162float(bias[i % cols]));
}

cudaDataType_t fp8Type(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

void fp8QuantizeOnDevice(Tensor& q, const Tensor& x, Fp8State& st, Tensor* transposed) {
  MT_CHECK(st.values().device() == x.device(), "fp8 state on ", st.values().device().str(), " for ", x.str());
  if (x.numel() == 0) return;
  if (x.dtype() == DType::kBF16)
    quantizeTyped<__nv_bfloat16>(q, x, st, transposed);
  else if (x.dtype() == DType::kF32)
    quantizeTyped<float>(q, x, st, transposed);
  else
    MT_CHECK(false, "fp8 cast of ", x.str(), ": f32 or bf16 only");
}

void fp8QuantizeReplayOnDevice(Tensor& q, const Tensor& x, const Fp8State& st, Tensor* transposed) {
  MT_CHECK(st.values().device() == x.device(), "fp8 state on ", st.values().device().str(), " for ", x.str());
  if (x.numel() == 0) return;
  MT_CHECK(x.dtype() == DType::kBF16 || x.dtype() == DType::kF32, "fp8 cast of ", x.str(),
           ": f32 or bf16 only");
  const int64_t C = x.ndim() ? x.dim(-1) : 1, R = x.numel() / C;
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile),
                  static_cast<unsigned>((R + kTile - 1) / kTile));
  uint8_t* qt = transposed ? transposed->data<uint8_t>() : nullptr;
  float* v = st.values().data<float>();
  if (x.dtype() == DType::kBF16)
    castKernel<<<grid, dim3(kTile, kRowsPerPass), 0, currentStream()>>>(
        static_cast<const __nv_bfloat16*>(x.rawData()), q.data<uint8_t>(), qt, R, C, v, st.format(), false);
  else
    castKernel<<<grid, dim3(kTile, kRowsPerPass), 0, currentStream()>>>(x.data<float>(), q.data<uint8_t>(),
                                                                        qt, R, C, v, st.format(), false);
  checkLaunch();
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
// exists only for FP8 outputs (ours are bf16/f32); a bf16 bias with a bf16 D.
void fp8GemmOnDevice(const Fp8GemmArgs& a) {
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
  g.beta = a.beta;
  g.abType = fp8Type(a.fa);
  g.bType = fp8Type(a.fb);
  g.scaleA = a.sa->scaleInvPtr();
  g.scaleB = a.sb->scaleInvPtr();
  g.cType = a.D->dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  g.fastAccum = a.fastAccum;
  Tensor biasCast;
  const void* biasPtr = nullptr;
  if (a.bias) {
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (a.bias->dtype() == DType::kBF16) {
      biasPtr = a.bias->rawData();
    } else {  // cuBLASLt's FP8 kernels take a bf16 bias (freed stream-ordered after the GEMM)
      biasCast = Tensor::empty(a.bias->shape(), DType::kBF16, a.bias->device());
      convertInto(biasCast, *a.bias);
      biasPtr = biasCast.rawData();
    }
    g.bias = biasPtr;
  }
  if (tryGemm(g)) return;
  MT_CHECK(a.bias != nullptr, "cuBLASLt has no FP8 algorithm for GEMM M=", a.M, " N=", a.N, " K=", a.K);
  // No FP8 kernel with this bias epilogue here: the GEMM, then the (bf16-rounded) bias added in f32.
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

}  // namespace mt::cuda
