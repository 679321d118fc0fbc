#pragma once
// cuDNN 9's graph ("backend") API in C++ without NVIDIA's header-only frontend: an operation graph
// of tensors (by unique id) and operations (matmul, pointwise, reduction, reshape) is finalized,
// cuDNN's heuristics (mode A, then the fallback list) propose engine configurations, and the first
// one that finalizes into an execution plan is kept. The runtime-fusion engines pattern-match the
// graph (models/kernels/CudnnAttention.cpp builds the fused-attention pattern with it).
//
// Building reports instead of throwing: a graph the installed cuDNN or the GPU cannot run is an
// expected outcome (the caller falls back to another kernel), so the first failing call is
// recorded with cuDNN's own message and build() returns null with that reason. Executing a plan
// that was built is not expected to fail and throws CudaError (CUDNN_CHECK) when it does.

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mt::cuda {

// One cuDNN backend descriptor, owned (destroyed with the object; move-only).
class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  explicit CudnnDescriptor(cudnnBackendDescriptorType_t type) {
    status_ = cudnnBackendCreateDescriptor(type, &d_);
  }
  ~CudnnDescriptor() { reset(); }
  CudnnDescriptor(CudnnDescriptor&& o) noexcept : d_(o.d_), status_(o.status_) { o.d_ = nullptr; }
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = o.d_, status_ = o.status_;
      o.d_ = nullptr;
    }
    return *this;
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnStatus_t createStatus() const { return status_; }
  void reset() noexcept {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = nullptr;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_NOT_INITIALIZED;
};

// A built execution plan with every descriptor it refers to, and the values of its by-value
// constants (bound again at every execution).
class CudnnPlan {
 public:
  int64_t workspaceBytes() const { return workspace_; }
  int64_t engineId() const { return engineId_; }  // cuDNN's global engine index (logs)
  // Runs on the handle's stream. `io`: (uid, pointer) for every non-virtual tensor of the graph,
  // by-value tensors as host pointers; `workspace`: workspaceBytes() of device memory.
  void execute(cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& io, void* workspace) const;

 private:
  friend class CudnnGraph;
  std::vector<CudnnDescriptor> keep_;  // tensors, operations, the operation graph, the engine config
  CudnnDescriptor plan_;
  std::vector<std::pair<int64_t, float>> constants_;
  int64_t workspace_ = 0, engineId_ = -1;
};

class CudnnGraph {
 public:
  explicit CudnnGraph(cudnnHandle_t handle) : handle_(handle) {}

  // A tensor bound to memory at execution (uid chosen by the caller, > 0 and < 1 << 20).
  int64_t io(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
             cudnnDataType_t t);
  // A scalar f32 passed by value at execution (the caller binds a host pointer to `uid`).
  int64_t byValue(int64_t uid);
  // An intermediate that lives inside the fused kernel only; its uid is allocated here.
  int64_t virt(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, cudnnDataType_t t);
  // A by-value f32 constant; the plan keeps the value.
  int64_t constant(float value);

  void matmul(int64_t a, int64_t b, int64_t c);  // c = a b over the last two dims (f32 accumulate)
  // y = mode(x[, b[, t]]) in `math` precision; axis for GEN_INDEX. BINARY_SELECT: y = t ? x : b.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t y, int64_t b = -1, int64_t t = -1,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1);
  void reduction(cudnnReduceTensorOp_t op, int64_t x, int64_t y);  // over the dims where y is 1
  void reshape(int64_t x, int64_t y);                              // a view: y's dims and strides

  // Finalizes the graph and returns its first working plan, or null with *whyNot set.
  std::unique_ptr<CudnnPlan> build(std::string* whyNot);
  bool ok() const { return error_.empty(); }

 private:
  int64_t tensor(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                 cudnnDataType_t t, bool isVirtual, bool isByValue);
  cudnnBackendDescriptor_t tensorDesc(int64_t uid);
  // Records the first failure (with cuDNN's last error string); false when s is not success.
  bool check(cudnnStatus_t s, const char* what);
  CudnnDescriptor make(cudnnBackendDescriptorType_t type, const char* what);
  bool planFrom(cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t opGraph, CudnnPlan& out,
                std::string* tried);

  cudnnHandle_t handle_;
  std::vector<std::pair<int64_t, CudnnDescriptor>> tensors_;
  std::vector<CudnnDescriptor> ops_;  // operations, in the order added
  std::vector<CudnnDescriptor> aux_;  // the pointwise / matmul / reduction descriptors they use
  std::vector<std::pair<int64_t, float>> constants_;
  int64_t nextVirtual_ = int64_t{1} << 20;
  std::string error_;
};

}  // namespace mt::cuda
