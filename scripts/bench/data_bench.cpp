// data_bench: samples/s of meshtrain's loader on one HDF5 split, for the CPU comparison with
// PyTorch's DataLoader (scripts/bench/data_bench drives both) and, with --feed, for the GPU feeds.
//
//   build/bin/data_bench --file F.h5 [--split train] [--kind images|tokens] [--seq-len 1024]
//        [--batch 256] [--workers 2] [--prefetch 2] [--batches 200] [--warmup 10]
//        [--mode stream|memory] [--feed none|pinned|uvm|device]
//
// Prints one JSON line: samples/s, batches, seconds, mean data-wait per batch, and open_s: the
// time from opening the file to a dataset ready to read (both splits' datasets described, every
// label checked; the load too in memory mode). With a feed the batches go to the GPU and the clock
// stops after the compute stream has drained.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/Error.h"
#include "core/Timer.h"
#include "data/DeviceFeed.h"
#include "data/H5File.h"
#include "data/ImageDataset.h"
#include "data/ImageSource.h"
#include "data/Loader.h"
#include "data/TokenDataset.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"
#endif

using namespace mt;

int main(int argc, char** argv) {
  std::string file, split = "train", kind = "images", mode = "stream", feed = "none";
  int64_t batch = 256, batches = 200, warmup = 10, seqLen = 1024;
  int workers = 2, prefetch = 2;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw ConfigError("data_bench: " + a + " needs a value");
      const std::string v = argv[++i];
      if (a == "--file") file = v;
      else if (a == "--split") split = v;
      else if (a == "--kind") kind = v;
      else if (a == "--mode") mode = v;
      else if (a == "--feed") feed = v;
      else if (a == "--batch") batch = std::atoll(v.c_str());
      else if (a == "--batches") batches = std::atoll(v.c_str());
      else if (a == "--warmup") warmup = std::atoll(v.c_str());
      else if (a == "--seq-len") seqLen = std::atoll(v.c_str());
      else if (a == "--workers") workers = std::atoi(v.c_str());
      else if (a == "--prefetch") prefetch = std::atoi(v.c_str());
      else throw ConfigError("data_bench: unknown argument " + a);
    }
    if (file.empty()) throw ConfigError("data_bench: --file is required");
    Stopwatch opening;
    H5File h5 = H5File::open(file, FileLocking::kAuto);
    std::unique_ptr<ImageDataset> images;
    std::unique_ptr<TokenDataset> tokens;
    std::unique_ptr<BatchSource> source;
    if (kind == "images") {
      images = std::make_unique<ImageDataset>(h5, split, 1);
      if (mode == "memory") images->loadIntoMemory();
      source = std::make_unique<ImageSource>(*images);
    } else {
      tokens = std::make_unique<TokenDataset>(h5, split, seqLen, 1);
      if (mode == "memory") tokens->loadIntoMemory();
      source = std::make_unique<TokenSource>(*tokens);
    }
    const double openSeconds = opening.elapsed();
    LoaderOptions lo;
    lo.batchSize = batch;
    lo.numWorkers = workers;
    lo.prefetchFactor = prefetch;
    lo.seed = 1;
    Allocator* host = &cpuAllocator();
#ifdef MT_WITH_CUDA
    std::unique_ptr<CudaRuntime> rt;  // first: it outlives the loader and the feed
    FeedMode fm = FeedMode::kPinned;
    if (feed != "none") {
      if (!parseFeedMode(feed, &fm)) throw ConfigError("data_bench: --feed none, pinned, uvm or device");
      rt = std::make_unique<CudaRuntime>(0);
      if (fm == FeedMode::kPinned) host = &rt->pinned();
      if (fm == FeedMode::kUvm) host = &rt->managed();
      if (fm == FeedMode::kDevice) lo.numWorkers = 0;
      lo.workerInit = [] { bindThreadToDevice(0); };
    }
#else
    if (feed != "none") throw ConfigError("data_bench: --feed needs a CUDA build");
#endif
    Loader loader(*source, lo, 0, 1, *host);
    std::unique_ptr<DeviceFeed> gpuFeed;
#ifdef MT_WITH_CUDA
    if (rt) gpuFeed = std::make_unique<DeviceFeed>(
          fm, loader, rt->dev(), images ? static_cast<const ResidentSplit*>(images.get()) : tokens.get());
#endif
    auto one = [&]() -> double {
      Batch b = gpuFeed ? gpuFeed->next() : loader.next();
      return gpuFeed ? gpuFeed->lastWaitSeconds() : loader.lastWaitSeconds();
    };
    for (int64_t i = 0; i < warmup; ++i) one();
#ifdef MT_WITH_CUDA
    if (rt) rt->synchronize();
#endif
    Stopwatch sw;
    double wait = 0.0;
    for (int64_t i = 0; i < batches; ++i) wait += one();
#ifdef MT_WITH_CUDA
    if (rt) rt->synchronize();
#endif
    const double s = sw.elapsed();
    std::printf(
        "{\"loader\": \"meshtrain\", \"kind\": \"%s\", \"mode\": \"%s\", \"feed\": \"%s\", \"workers\": %d, "
        "\"batch\": %lld, \"batches\": %lld, \"seconds\": %.4f, \"samples_per_s\": %.1f, \"wait_ms\": %.4f, "
        "\"open_s\": %.4f}\n",
        kind.c_str(), mode.c_str(), feed.c_str(), workers, static_cast<long long>(batch),
        static_cast<long long>(batches), s, static_cast<double>(batches * batch) / s, 1e3 * wait / batches,
        openSeconds);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return static_cast<int>(e.exitCode());
  }
}
