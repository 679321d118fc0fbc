// The GPU feeds (pinned, uvm, device) deliver exactly the batches the CPU loader builds, in the
// same order, for images (the Fashion-MNIST fixture) and token windows (a file written here).

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"
#include "data/DeviceFeed.h"
#include "data/H5File.h"
#include "data/ImageSource.h"
#include "data/TokenDataset.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

bool sameBytes(const Tensor& a, const Tensor& b) {
  Tensor ha = a.device().isCpu() ? a : a.to(Device::cpu());
  Tensor hb = b.device().isCpu() ? b : b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.rawData(), hb.rawData(), ha.nbytes()) == 0;
}

void compareFeeds(const BatchSource& src, const ResidentSplit& split, int64_t batch) {
  CudaRuntime& rt = CudaRuntime::require();
  for (FeedMode mode : {FeedMode::kPinned, FeedMode::kUvm, FeedMode::kDevice}) {
    LoaderOptions lo;
    lo.batchSize = batch;
    lo.seed = 9;
    lo.numWorkers = 2;
    Loader reference(src, lo, 1, 2);  // rank 1 of 2: a shard, shuffled
    LoaderOptions lg = lo;
    Allocator* host = &cpuAllocator();
    if (mode == FeedMode::kPinned) host = &rt.pinned();
    if (mode == FeedMode::kUvm) host = &rt.managed();
    if (mode == FeedMode::kDevice) lg.numWorkers = 0;
    lg.workerInit = [] { bindThreadToDevice(0); };
    Loader loader(src, lg, 1, 2, *host);
    DeviceFeed feed(mode, loader, rt.dev(), &split);
    for (int i = 0; i < 12; ++i) {
      Batch want = reference.next();
      Batch got = feed.next();
      ASSERT_TRUE(got.inputs.device().isCuda());
      rt.synchronize();
      ASSERT_TRUE(sameBytes(got.inputs, want.inputs)) << feedModeName(mode) << " batch " << i;
      ASSERT_TRUE(sameBytes(got.targets, want.targets)) << feedModeName(mode) << " batch " << i;
    }
    EXPECT_EQ(loader.position(), 12);
  }
}

TEST(GpuFeed, ImagesMatchTheHostLoader) {
  const std::string path = test::fixturePath("FASHION_H5");
  if (path.empty()) GTEST_SKIP() << "FASHION_H5 not set";
  H5File f = H5File::open(path, FileLocking::kAuto);
  ImageDataset ds(f, "train", 2);
  ds.loadIntoMemory();
  ImageSource src(ds);
  compareFeeds(src, ds, 128);
}

TEST(GpuFeed, TokenWindowsMatchTheHostLoader) {
  const std::string path = ::testing::TempDir() + "/feed_tokens.h5";
  {
    H5Writer w(path);
    Tensor t = Tensor::empty({50000}, DType::kI32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % 50257);
    w.write("/train/tokens", t, 4096);
    w.close();
  }
  H5File f = H5File::open(path, FileLocking::kAuto);
  TokenDataset ds(f, "train", 256, 2);
  ds.loadIntoMemory();
  TokenSource src(ds);
  compareFeeds(src, ds, 8);
}

}  // namespace
}  // namespace mt
