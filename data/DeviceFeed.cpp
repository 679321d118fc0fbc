#include "data/DeviceFeed.h"

#include "core/Error.h"
#include "core/Timer.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaStream.h"
#include "data/kernels/CudaGather.h"
#endif

namespace mt {

const EnumTable<FeedMode>& feedModes() {
  static const EnumTable<FeedMode> kTable = {
      {FeedMode::kPinned, "pinned", "copy stream from page-locked memory"},
      {FeedMode::kUvm, "uvm", "managed memory, prefetched"},
      {FeedMode::kDevice, "device", "split resident on the GPU; needs data.mode = memory"},
  };
  return kTable;
}

#ifdef MT_WITH_CUDA

struct DeviceFeed::Impl {
  CudaStream copy;
  CudaEvent copied;
  // device mode: the resident split
  Tensor images, labels, tokens;
  Shape imageShape;  // one example
  int64_t T = 0;
};

namespace {

// Records that the compute stream uses a tensor the copy stream allocated, so the caching
// allocator does not hand the block back to the copy stream while kernels still read it.
void usedOnCompute(const Tensor& t) {
  CudaRuntime::require().allocator().recordStream(t.rawData(), currentStream());
}

Tensor onCopyStream(const Tensor& host, cudaStream_t copy, Device device) {
  StreamGuard g(copy);
  Tensor d = Tensor::empty(host.shape(), host.dtype(), device);
  CUDA_CHECK(cudaMemcpyAsync(d.rawData(), host.rawData(), host.nbytes(), cudaMemcpyHostToDevice, copy));
  return d;
}

void prefetch(const Tensor& t, cudaStream_t copy, int device) {
  if (t.nbytes() == 0) return;
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = device;
  CUDA_CHECK(cudaMemAdvise(t.rawData(), t.nbytes(), cudaMemAdviseSetPreferredLocation, loc));
  CUDA_CHECK(cudaMemPrefetchAsync(t.rawData(), t.nbytes(), loc, 0, copy));
}

}  // namespace

DeviceFeed::DeviceFeed(FeedMode mode, Loader& loader, Device device, const ResidentSplit* split)
    : mode_(mode), loader_(loader), device_(device), impl_(std::make_unique<Impl>()) {
  MT_CHECK(device.isCuda(), "DeviceFeed on ", device.str());
  if (mode_ != FeedMode::kDevice) return;
  MT_CHECK(loader.numWorkers() == 0, "the device feed gathers on the GPU: the loader needs no workers");
  MT_CHECK(split, "device feed without a dataset");
  const ResidentData r = split->resident();
  if (r.rowInputs.defined()) {
    impl_->imageShape = Shape(r.rowInputs.shape().begin() + 1, r.rowInputs.shape().end());
    impl_->images = r.rowInputs.to(device);
    impl_->labels = r.rowTargets.to(device);
  } else {
    impl_->tokens = r.tokens.to(device);
    impl_->T = r.window;
  }
}

DeviceFeed::~DeviceFeed() = default;

int64_t DeviceFeed::residentBytes() const {
  return static_cast<int64_t>(impl_->images.nbytes() + impl_->labels.nbytes() + impl_->tokens.nbytes());
}

Batch DeviceFeed::next() {
  cudaStream_t compute = currentStream();
  if (mode_ == FeedMode::kDevice) {
    Stopwatch sw;
    const std::vector<int64_t> idx = loader_.batchIndices(loader_.position());
    loader_.advance();
    const int64_t B = static_cast<int64_t>(idx.size());
    // Indices through pinned memory: the upload is asynchronous on the compute stream.
    Tensor hostIdx = Tensor::empty({B}, DType::kI64, CudaRuntime::require().pinned());
    std::copy(idx.begin(), idx.end(), hostIdx.data<int64_t>());
    Tensor devIdx = Tensor::empty({B}, DType::kI64, device_);
    CUDA_CHECK(cudaMemcpyAsync(devIdx.rawData(), hostIdx.rawData(), hostIdx.nbytes(), cudaMemcpyHostToDevice, compute));
    Batch b;
    b.sampleIds = idx;
    if (impl_->images.defined()) {
      Shape shape = {B};
      shape.insert(shape.end(), impl_->imageShape.begin(), impl_->imageShape.end());
      b.inputs = Tensor::empty(shape, DType::kU8, device_);
      b.targets = Tensor::empty({B}, DType::kI64, device_);
      const int64_t rowBytes = static_cast<int64_t>(b.inputs.nbytes()) / std::max<int64_t>(B, 1);
      cuda::gatherRows(b.inputs.rawData(), impl_->images.rawData(), devIdx.data<int64_t>(), B, rowBytes);
      cuda::gatherRows(b.targets.rawData(), impl_->labels.rawData(), devIdx.data<int64_t>(), B, 8);
    } else {
      const int64_t T = impl_->T;
      b.inputs = Tensor::empty({B, T}, DType::kI32, device_);
      b.targets = Tensor::empty({B, T}, DType::kI64, device_);
      cuda::gatherTokenWindows(b.inputs.data<int32_t>(), b.targets.data<int64_t>(), impl_->tokens.data<int32_t>(),
                               devIdx.data<int64_t>(), B, T);
    }
    lastWait_ = sw.elapsed();
    return b;
  }
  Batch host = loader_.next();
  lastWait_ = loader_.lastWaitSeconds();
  cudaStream_t copy = impl_->copy.get();
  Batch b;
  if (mode_ == FeedMode::kPinned) {
    b.inputs = onCopyStream(host.inputs, copy, device_);
    b.targets = onCopyStream(host.targets, copy, device_);
    b.sampleIds = host.sampleIds;
  } else {
    MT_CHECK(host.inputs.device().isCuda(), "uvm feed: the loader did not collate into managed memory");
    prefetch(host.inputs, copy, device_.index);
    prefetch(host.targets, copy, device_.index);
    b = host;
  }
  impl_->copied.record(copy);
  CUDA_CHECK(cudaStreamWaitEvent(compute, impl_->copied.get(), 0));
  if (mode_ == FeedMode::kPinned) {
    usedOnCompute(b.inputs);
    usedOnCompute(b.targets);
  }
  // `host` (pinned) is freed here: its block returns to the cache behind an event on the compute
  // stream, which already waits for the copy.
  return b;
}

#else

struct DeviceFeed::Impl {};

DeviceFeed::DeviceFeed(FeedMode mode, Loader& loader, Device device, const ResidentSplit*)
    : mode_(mode), loader_(loader), device_(device) {
  throw ConfigError(std::string("data.feed = ") + feedModeName(mode) + " needs a build with CUDA");
}
DeviceFeed::~DeviceFeed() = default;
Batch DeviceFeed::next() { return loader_.next(); }
int64_t DeviceFeed::residentBytes() const { return 0; }

#endif

}  // namespace mt
