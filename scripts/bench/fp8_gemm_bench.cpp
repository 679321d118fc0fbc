// fp8_gemm_bench: the GPT block Linears' GEMMs in FP8 (core/Fp8.h, cuBLASLt) against bf16, at
// every GPT preset width (CUDA builds only).
//
//   build/bin/fp8_gemm_bench [--widths 768,1024,1280,1600,2560] [--tokens 16384] [--reps 20]
//
// Per width C and layer (qkv: C -> 3C, proj: C -> C, fc: C -> 4C, fcproj: 4C -> C), with
// M = --tokens rows (B*T), the three GEMMs of a training step:
//   fwd    y[M,O]  = x[M,I] W[O,I]^T        bf16: (no, trans)      fp8: E4M3 x E4M3 -> bf16, fast accum
//   dgrad  dx[M,I] = dy[M,O] W[O,I]         bf16: (no, no)         fp8: E5M2 dy x E4M3 W^T -> bf16
//   wgrad  dW[O,I] += dy^T x                bf16: (trans, no) f32  fp8: E5M2 dy^T x E4M3 x^T -> f32, beta 1
// (FP8 is TN only, hence the transposed copies W^T, dy^T, x^T the cast kernels write.) Each
// column is the median of --reps timed runs after 3 untimed, as TFLOP/s (2·M·N·K per GEMM). "step"
// sums the three GEMMs; "fp8+cast" adds what FP8 needs besides: casting x (with x^T), dy (with
// dy^T) and W (with W^T) once each, delayed scaling. The last column is bf16 step time over fp8
// step-with-casts time: above 1, FP8 wins for that layer; "cast GB/s" the casts' bytes (bf16 in,
// codes and transposed codes out) over their time (with their scale and history kernels). A
// table, then one JSON line per row.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/Convert.h"
#include "core/Error.h"
#include "core/Fp8.h"
#include "core/Tensor.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaStream.h"

using namespace mt;

namespace {

struct Options {
  std::vector<int64_t> widths = {768, 1024, 1280, 1600, 2560};
  int64_t tokens = 16384;
  int reps = 20;
};

std::vector<int64_t> parseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    out.push_back(std::stoll(item));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--widths")
      o.widths = parseList(next());
    else if (a == "--tokens")
      o.tokens = std::stoll(next());
    else if (a == "--reps")
      o.reps = std::stoi(next());
    else
      throw ConfigError("unknown argument " + a + " (--widths, --tokens, --reps)");
  }
  if (o.reps < 1 || o.tokens < 16 || o.tokens % 16)
    throw ConfigError("--reps >= 1, --tokens a multiple of 16");
  for (int64_t w : o.widths)
    if (w < 16 || w % 16)
      throw ConfigError("--widths: multiples of 16 (cuBLASLt's FP8 rule), got " + std::to_string(w));
  return o;
}

// Median milliseconds of fn over reps runs after 3 warm-ups, timed with events on the stream.
double medianMs(const std::function<void()>& fn, int reps) {
  cudaStream_t s = currentStream();
  for (int i = 0; i < 3; ++i)
    fn();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor randomish(const Shape& s, float amp, DType t, Device d) {
  Tensor f = Tensor::empty(s, DType::kF32);
  uint32_t x = 12345;
  for (int64_t i = 0; i < f.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    f.data<float>()[i] = amp * (static_cast<float>(x >> 8) / 16777216.f - 0.5f);
  }
  return f.toDType(t).to(d);
}

struct Row {
  int64_t width, M, O, I;
  std::string layer;
  double bf16Ms[3], fp8Ms[3], castMs;
};

double tflops(int64_t m, int64_t n, int64_t k, double ms) {
  return 2.0 * m * n * k / (ms * 1e-3) / 1e12;
}

Row measure(int64_t width, const std::string& layer, int64_t M, int64_t O, int64_t I, int reps, Device dev) {
  Row r{width, M, O, I, layer, {}, {}, 0};
  Tensor x = randomish({M, I}, 2.f, DType::kBF16, dev), w = randomish({O, I}, 0.1f, DType::kBF16, dev);
  Tensor dy = randomish({M, O}, 1e-3f, DType::kBF16, dev);
  Tensor y = Tensor::empty({M, O}, DType::kBF16, dev), dx = Tensor::empty({M, I}, DType::kBF16, dev);
  Tensor dw = Tensor::zeros({O, I}, DType::kF32, dev);
  auto call = [](const Tensor& a, const Tensor& b, Tensor& c, Trans ta, Trans tb, int64_t m, int64_t n,
                 int64_t k, float beta) {
    cuda::GemmCall g;
    g.transA = ta, g.transB = tb, g.M = m, g.N = n, g.K = k, g.beta = beta;
    g.A = a.rawData(), g.B = b.rawData(), g.C = c.rawData();
    g.abType = CUDA_R_16BF;
    g.cType = c.dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    cuda::gemm(g);
  };
  r.bf16Ms[0] = medianMs([&] { call(x, w, y, Trans::kNo, Trans::kYes, M, O, I, 0.f); }, reps);
  r.bf16Ms[1] = medianMs([&] { call(dy, w, dx, Trans::kNo, Trans::kNo, M, I, O, 0.f); }, reps);
  r.bf16Ms[2] = medianMs([&] { call(dy, x, dw, Trans::kYes, Trans::kNo, O, I, M, 1.f); }, reps);

  Fp8Options o;  // delayed: the cast is one pass with the amax fused
  Fp8State sx(Fp8Format::kE4M3, o, dev), sw(Fp8Format::kE4M3, o, dev), sdy(Fp8Format::kE5M2, o, dev);
  Tensor qx = Tensor::empty({M, I}, DType::kU8, dev), qxt = Tensor::empty({I, M}, DType::kU8, dev);
  Tensor qw = Tensor::empty({O, I}, DType::kU8, dev), qwt = Tensor::empty({I, O}, DType::kU8, dev);
  Tensor qdy = Tensor::empty({M, O}, DType::kU8, dev), qdyt = Tensor::empty({O, M}, DType::kU8, dev);
  auto casts = [&] {
    fp8Quantize(qx, x, sx, &qxt);
    fp8Quantize(qw, w, sw, &qwt);
    fp8Quantize(qdy, dy, sdy, &qdyt);
  };
  casts();  // past the first (current-scaling) cast of each state
  r.castMs = medianMs(casts, reps);
  auto fp8 = [&](const Tensor& a, Fp8Format fa, const Fp8State& sa, const Tensor& b, Fp8Format fb,
                 const Fp8State& sb, Tensor& d, int64_t m, int64_t n, int64_t k, float beta, bool fast) {
    Fp8GemmArgs g;
    g.M = m, g.N = n, g.K = k, g.A = &a, g.B = &b, g.fa = fa, g.fb = fb, g.sa = &sa, g.sb = &sb, g.D = &d;
    g.beta = beta, g.fastAccum = fast;
    fp8Gemm(g);
  };
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  r.fp8Ms[0] = medianMs([&] { fp8(qx, e4, sx, qw, e4, sw, y, M, O, I, 0.f, true); }, reps);
  r.fp8Ms[1] = medianMs([&] { fp8(qdy, e5, sdy, qwt, e4, sw, dx, M, I, O, 0.f, false); }, reps);
  r.fp8Ms[2] = medianMs([&] { fp8(qdyt, e5, sdy, qxt, e4, sx, dw, O, I, M, 1.f, false); }, reps);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    CudaRuntime rt(0);
    const Device dev = Device::cuda(0);
    std::printf("fp8_gemm_bench on %s, M = %lld tokens, median of %d\n", rt.deviceName().c_str(),
                static_cast<long long>(opt.tokens), opt.reps);
    std::printf("%6s %-7s %6s %6s | %-22s | %-22s | %8s %8s %8s %6s %8s\n", "C", "layer", "O", "I",
                "bf16 TFLOP/s fwd/dg/wg", "fp8 TFLOP/s fwd/dg/wg", "bf16 ms", "fp8 ms", "+cast ms", "win",
                "cast GB/s");
    std::vector<Row> rows;
    for (int64_t c : opt.widths) {
      const struct {
        const char* name;
        int64_t O, I;
      } layers[] = {{"qkv", 3 * c, c}, {"proj", c, c}, {"fc", 4 * c, c}, {"fcproj", c, 4 * c}};
      for (const auto& l : layers) {
        const Row r = measure(c, l.name, opt.tokens, l.O, l.I, opt.reps, dev);
        const int64_t M = r.M, O = r.O, I = r.I;
        const double tb[3] = {tflops(M, O, I, r.bf16Ms[0]), tflops(M, I, O, r.bf16Ms[1]),
                              tflops(O, I, M, r.bf16Ms[2])};
        const double tf[3] = {tflops(M, O, I, r.fp8Ms[0]), tflops(M, I, O, r.fp8Ms[1]),
                              tflops(O, I, M, r.fp8Ms[2])};
        const double bStep = r.bf16Ms[0] + r.bf16Ms[1] + r.bf16Ms[2];
        const double fStep = r.fp8Ms[0] + r.fp8Ms[1] + r.fp8Ms[2];
        // The casts' bytes: each bf16 operand read once, its codes and their transpose written.
        const double castGBs = 4.0 * static_cast<double>(M * I + O * I + M * O) / (r.castMs * 1e-3) / 1e9;
        std::printf(
            "%6lld %-7s %6lld %6lld | %6.0f %6.0f %6.0f     | %6.0f %6.0f %6.0f     | %8.3f %8.3f %8.3f "
            "%6.2f %8.0f\n",
            static_cast<long long>(c), l.name, static_cast<long long>(O), static_cast<long long>(I), tb[0],
            tb[1], tb[2], tf[0], tf[1], tf[2], bStep, fStep, fStep + r.castMs, bStep / (fStep + r.castMs), castGBs);
        rows.push_back(r);
      }
    }
    for (const Row& r : rows)
      std::printf(
          "{\"width\":%lld,\"layer\":\"%s\",\"M\":%lld,\"O\":%lld,\"I\":%lld,\"bf16_ms\":[%.4f,%.4f,%.4f],"
          "\"fp8_ms\":[%.4f,%.4f,%.4f],\"fp8_cast_ms\":%.4f}\n",
          static_cast<long long>(r.width), r.layer.c_str(), static_cast<long long>(r.M),
          static_cast<long long>(r.O), static_cast<long long>(r.I), r.bf16Ms[0], r.bf16Ms[1], r.bf16Ms[2],
          r.fp8Ms[0], r.fp8Ms[1], r.fp8Ms[2], r.castMs);
    return 0;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", e.what());
    return 1;
  }
}
