// cpu_adam_bench: the CPU AdamW of ZeRO-Offload (core/optim/CpuAdam) against the host's memory
// bandwidth, measured in the same run with STREAM-style kernels over the same thread counts.
//
//   build/bin/cpu_adam_bench [--params 100000000] [--threads 1,2,...] [--variants scalar,avx2,avx512]
//                            [--grad bf16,f32] [--reps 5]
//
// Per thread count (default 1 .. all cores):
//   stream copy   a = b          8 bytes per element (STREAM's count: no write-allocate)
//   stream triad  a = b + s·c    12 bytes per element
//   fused <isa>   one AdamW pass writing the bf16 copy too: reads p, m, v, g, writes p, m, v, copy
//                 = 12 + 2|4 + 12 + 2 = 28 (bf16 g) | 30 (f32 g) bytes per parameter
//   before        what the offload ran until the fused pass: the scalar AdamW without the copy
//                 (26 | 28 bytes) then a separate f32 -> bf16 packing pass (convertInto, 6 bytes)
// Each row is the best of --reps timed repetitions after one untimed (STREAM's convention), as
// parameters/s, parameters/s per thread, GB/s of the bytes counted above (1 GB = 1e9 bytes) and
// that rate as a fraction of the same thread count's copy bandwidth. A table, then one JSON line
// per row.

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/Convert.h"
#include "core/Error.h"
#include "core/Tensor.h"
#include "core/Timer.h"
#include "core/optim/CpuAdam.h"

using namespace mt;

namespace {

struct Options {
  int64_t params = 100000000;
  std::vector<int> threads;
  std::vector<CpuAdamIsa> variants;
  std::vector<bool> bf16Grads = {true, false};
  int reps = 5;
};

struct Row {
  int threads;
  std::string kernel, grad;
  double seconds, bytesPerElement;
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t parsePositive(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x <= 0)
    throw ConfigError("cpu_adam_bench: " + key + " '" + v + "' is not a positive integer");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw ConfigError("cpu_adam_bench: " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--params") {
      o.params = parsePositive(a, v);
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parsePositive(a, v));
    } else if (a == "--threads") {
      for (const auto& t : splitList(v))
        o.threads.push_back(static_cast<int>(parsePositive(a, t)));
    } else if (a == "--variants") {
      for (const auto& name : splitList(v)) {
        CpuAdamIsa isa;
        if (!parseEnum(cpuAdamIsas(), name, &isa))
          throw ConfigError("cpu_adam_bench: --variants: unknown variant '" + name +
                            "' (scalar, avx2, avx512)");
        if (!cpuAdamSupported(isa))
          throw ConfigError("cpu_adam_bench: this CPU cannot run the " + name + " variant");
        o.variants.push_back(isa);
      }
    } else if (a == "--grad") {
      o.bf16Grads.clear();
      for (const auto& g : splitList(v)) {
        if (g != "bf16" && g != "f32")
          throw ConfigError("cpu_adam_bench: --grad: '" + g + "' is not bf16 or f32");
        o.bf16Grads.push_back(g == "bf16");
      }
    } else {
      throw ConfigError("cpu_adam_bench: unknown argument " + a);
    }
  }
  if (o.threads.empty())
    for (int t = 1; t <= omp_get_num_procs(); ++t)
      o.threads.push_back(t);
  if (o.variants.empty())
    for (const auto& e : cpuAdamIsas())
      if (cpuAdamSupported(e.value)) o.variants.push_back(e.value);
  return o;
}

// Best of reps after one untimed run.
template <typename F>
double bestSeconds(int reps, F&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Stopwatch w;
    fn();
    best = std::min(best, w.elapsed());
  }
  return best;
}

// Explicit loops (the target is built with -fno-tree-loop-distribute-patterns: no memcpy call).
void streamCopy(float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    a[i] = b[i];
}

void streamTriad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    a[i] = b[i] + s * c[i];
}

// First touch by the threads that stream them (pages near their cores on a NUMA host).
void fill(float* x, int64_t n, float scale, float offset) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    x[i] = offset + scale * static_cast<float>((i * 2654435761u) % 1000) / 1000.f;
}

std::string cpuModel() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const int64_t n = o.params;
    const int maxThreads = *std::max_element(o.threads.begin(), o.threads.end());
    omp_set_num_threads(maxThreads);
    std::printf("cpu_adam_bench: %s, %d cores; variants this CPU runs:", cpuModel().c_str(),
                omp_get_num_procs());
    for (const auto& e : cpuAdamIsas())
      if (cpuAdamSupported(e.value)) std::printf(" %s", e.name);
    std::printf("; %lld parameters, best of %d\n", static_cast<long long>(n), o.reps);

    Tensor p = Tensor::empty({n}, DType::kF32), m = Tensor::empty({n}, DType::kF32),
           v = Tensor::empty({n}, DType::kF32), gf = Tensor::empty({n}, DType::kF32),
           gb = Tensor::empty({n}, DType::kBF16), copy = Tensor::empty({n}, DType::kBF16);
    fill(p.data<float>(), n, 2.f, -1.f);
    fill(m.data<float>(), n, 0.f, 0.f);
    fill(v.data<float>(), n, 0.f, 0.f);
    fill(gf.data<float>(), n, 0.02f, -0.01f);
    convertInto(gb, gf);
    convertInto(copy, p);
    Tensor a = Tensor::empty({n}, DType::kF32), b = Tensor::empty({n}, DType::kF32),
           c = Tensor::empty({n}, DType::kF32);
    fill(a.data<float>(), n, 1.f, 0.f);
    fill(b.data<float>(), n, 1.f, 1.f);
    fill(c.data<float>(), n, 1.f, 2.f);

    std::vector<Row> rows;
    int64_t step = 0;
    for (int t : o.threads) {
      omp_set_num_threads(t);
      rows.push_back({t, "stream copy", "-",
                      bestSeconds(o.reps, [&] { streamCopy(a.data<float>(), b.data<float>(), n); }), 8});
      rows.push_back(
          {t, "stream triad", "-",
           bestSeconds(o.reps,
                       [&] { streamTriad(a.data<float>(), b.data<float>(), c.data<float>(), 3.f, n); }),
           12});
      for (bool bf16 : o.bf16Grads) {
        AdamwSpans s;
        s.p = p.data<float>(), s.m = m.data<float>(), s.v = v.data<float>(), s.n = n;
        s.gBf16 = bf16;
        s.g = bf16 ? gb.rawData() : gf.rawData();
        const double gBytes = bf16 ? 2 : 4;
        auto hyper = [&] { return AdamwHyper{1e-4f, 0.1f, 0.9f, 0.999f, 1e-8f, ++step}; };
        for (CpuAdamIsa isa : o.variants) {
          AdamwSpans fused = s;
          fused.copy = copy.data<BFloat16>();
          rows.push_back({t, std::string("fused ") + cpuAdamIsaName(isa), bf16 ? "bf16" : "f32",
                          bestSeconds(o.reps, [&] { cpuAdamw(fused, hyper(), isa); }), 26 + gBytes});
        }
        rows.push_back({t, "before: scalar + pack", bf16 ? "bf16" : "f32",
                        bestSeconds(o.reps,
                                    [&] {
                                      cpuAdamw(s, hyper(), CpuAdamIsa::kScalar);
                                      convertInto(copy, p);
                                    }),
                        24 + gBytes + 6});
      }
    }

    std::printf(
        "\n| threads | kernel | grad | bytes/param | M params/s | M params/s per thread | GB/s | of copy "
        "|\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    double copyRate = 0;
    std::vector<std::string> json;
    for (const Row& r : rows) {
      const double gbs = r.bytesPerElement * static_cast<double>(n) / r.seconds / 1e9;
      if (r.kernel == "stream copy") copyRate = gbs;
      const bool adam = r.kernel.rfind("stream", 0) != 0;
      const double rate = static_cast<double>(n) / r.seconds;
      if (adam)
        std::printf("| %d | %s | %s | %.0f | %.1f | %.1f | %.2f | %.0f %% |\n", r.threads, r.kernel.c_str(),
                    r.grad.c_str(), r.bytesPerElement, rate / 1e6, rate / 1e6 / r.threads, gbs,
                    100 * gbs / copyRate);
      else
        std::printf("| %d | %s | - | %.0f | - | - | %.2f | %.0f %% |\n", r.threads, r.kernel.c_str(),
                    r.bytesPerElement, gbs, 100 * gbs / copyRate);
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"cpu_adam\",\"threads\":%d,\"kernel\":\"%s\",\"grad\":\"%s\",\"n\":%lld,"
                    "\"seconds\":%.6f,\"bytes_per_element\":%.0f,\"gb_per_s\":%.3f,\"elements_per_s\":%.4e,"
                    "\"elements_per_s_per_thread\":%.4e,\"fraction_of_copy\":%.4f}",
                    r.threads, r.kernel.c_str(), r.grad.c_str(), static_cast<long long>(n), r.seconds,
                    r.bytesPerElement, gbs, rate, rate / r.threads, gbs / copyRate);
      json.push_back(line);
    }
    std::printf("\n");
    for (const auto& j : json)
      std::printf("%s\n", j.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return static_cast<int>(e.exitCode());
  }
}
