#pragma once
// How batches reach the GPU (config data.feed), after the Loader built them:
//   pinned  workers collate into page-locked host memory; next() copies the batch on a copy stream
//           and makes the compute stream wait for the copy's event — no host synchronisation, so
//           the copy overlaps the GPU's tail of the previous step (the host runs ahead of it).
//   uvm     workers collate into CUDA managed memory (the allocator never takes more than the GPU
//           has free); next() advises the GPU as preferred location and prefetches the batch there
//           (cudaMemPrefetchAsync with a cudaMemLocation) on the copy stream; the compute stream
//           waits for it. Kernels then read it without faults.
//   device  the whole split is copied into GPU memory once; next() gathers the batch's rows with
//           a kernel on the compute stream from indices the sampler chose (no host copy of data
//           at all). For datasets that fit beside the model (Fashion-MNIST, small token sets).
// Every mode returns the loader's batches in the loader's order, so sampling, resume and the
// loss trajectory do not depend on the mode.

#include <memory>

#include "core/EnumTable.h"
#include "core/Tensor.h"
#include "data/Loader.h"
#include "data/ResidentSplit.h"

namespace mt {

enum class FeedMode { kPinned, kUvm, kDevice };
const EnumTable<FeedMode>& feedModes();
inline bool parseFeedMode(const std::string& name, FeedMode* out) { return parseEnum(feedModes(), name, out); }
inline const char* feedModeName(FeedMode m) { return enumName(feedModes(), m); }

class DeviceFeed {
 public:
  // split: the loader's split, needed (in memory) for the device mode only. In device mode the
  // loader must have no workers: it only supplies indices.
  DeviceFeed(FeedMode mode, Loader& loader, Device device, const ResidentSplit* split);
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  // The loader's next batch, on the device, ordered before work later queued on the current stream.
  Batch next();
  // Seconds the host waited for the batch (the loader's wait; copies are asynchronous).
  double lastWaitSeconds() const { return lastWait_; }
  FeedMode mode() const { return mode_; }
  // Bytes of the split held on the GPU (device mode).
  int64_t residentBytes() const;

 private:
  struct Impl;
  FeedMode mode_;
  Loader& loader_;
  Device device_;
  std::unique_ptr<Impl> impl_;
  double lastWait_ = 0.0;
};

}  // namespace mt
