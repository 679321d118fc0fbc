#include "core/cuda/DeviceBinding.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include <cuda_runtime.h>

#include "core/Error.h"
#include "core/cuda/CudaCheck.h"

namespace mt {

namespace {
thread_local int tlDevice = -1;
std::atomic<int64_t> gViolations{0};
std::mutex gFirstMutex;
std::string gFirst;

std::string describe(int device, const char* what) {
  char name[32] = "?";
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return std::string(what) + " on thread '" + name + "', which is bound to " +
         (tlDevice < 0 ? std::string("no device") : "GPU " + std::to_string(tlDevice)) + " instead of " +
         (device < 0 ? std::string("a device") : "GPU " + std::to_string(device)) +
         " (a thread that touches CUDA must call bindThreadToDevice first)";
}
}  // namespace

void bindThreadToDevice(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  tlDevice = device;
}

int threadDevice() {
  return tlDevice;
}

void requireThreadDevice(int device, const char* what) {
  if (tlDevice >= 0 && (device < 0 || tlDevice == device)) return;
  throw InternalError(describe(device, what));
}

void noteThreadDevice(int device, const char* what) noexcept {
  if (tlDevice >= 0 && (device < 0 || tlDevice == device)) return;
  try {
    std::string message = describe(device, what);
    {
      std::lock_guard<std::mutex> lock(gFirstMutex);
      if (gFirst.empty()) gFirst = std::move(message);
    }
  } catch (...) {
  }
  gViolations.fetch_add(1);
  if (device >= 0 && cudaSetDevice(device) == cudaSuccess) tlDevice = device;
}

int64_t threadDeviceViolations() {
  return gViolations.load();
}

std::string firstThreadDeviceViolation() {
  std::lock_guard<std::mutex> lock(gFirstMutex);
  return gFirst;
}

}  // namespace mt
