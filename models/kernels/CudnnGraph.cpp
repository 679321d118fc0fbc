#include "models/kernels/CudnnGraph.h"

#include <algorithm>

#include "core/cuda/CudaCheck.h"

namespace mt::cuda {

namespace {

cudnnStatus_t setAttr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                      cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  return cudnnBackendSetAttribute(d, name, type, count, values);
}
cudnnStatus_t setDesc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                      cudnnBackendDescriptor_t v) {
  return setAttr(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

}  // namespace

void CudnnPlan::execute(cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& io,
                        void* workspace) const {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  uids.reserve(io.size() + constants_.size());
  ptrs.reserve(io.size() + constants_.size());
  for (const auto& [uid, ptr] : io)
    uids.push_back(uid), ptrs.push_back(ptr);
  for (const auto& [uid, value] : constants_)
    uids.push_back(uid), ptrs.push_back(const_cast<float*>(&value));
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  CUDNN_CHECK(pack.createStatus());
  CUDNN_CHECK(setAttr(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                      static_cast<int64_t>(uids.size()), uids.data()));
  CUDNN_CHECK(setAttr(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                      static_cast<int64_t>(ptrs.size()), ptrs.data()));
  CUDNN_CHECK(setAttr(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan_.get(), pack.get()));
}

bool CudnnGraph::check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return true;
  if (error_.empty()) {
    char last[512] = {0};
    cudnnGetLastErrorString(last, sizeof(last));
    error_ =
        std::string(what) + ": " + cudnnGetErrorString(s) + (last[0] ? std::string(" (") + last + ")" : "");
  }
  return false;
}

CudnnDescriptor CudnnGraph::make(cudnnBackendDescriptorType_t type, const char* what) {
  CudnnDescriptor d(type);
  check(d.createStatus(), what);
  return d;
}

int64_t CudnnGraph::tensor(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                           cudnnDataType_t t, bool isVirtual, bool isByValue) {
  if (!ok()) return uid;
  CudnnDescriptor d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
  const int64_t n = static_cast<int64_t>(dims.size()), alignment = 16;
  const bool done =
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t), "tensor type") &&
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data()),
            "tensor dims") &&
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data()),
            "tensor strides") &&
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid), "tensor uid") &&
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment),
            "tensor alignment") &&
      check(setAttr(d.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual),
            "tensor virtual") &&
      (!isByValue || check(setAttr(d.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &isByValue),
                           "tensor by value")) &&
      check(cudnnBackendFinalize(d.get()), "tensor finalize");
  if (done) tensors_.emplace_back(uid, std::move(d));
  return uid;
}

int64_t CudnnGraph::io(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                       cudnnDataType_t t) {
  return tensor(uid, dims, strides, t, false, false);
}
int64_t CudnnGraph::byValue(int64_t uid) {
  return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
}
int64_t CudnnGraph::virt(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                         cudnnDataType_t t) {
  return tensor(nextVirtual_++, dims, strides, t, true, false);
}
int64_t CudnnGraph::constant(float value) {
  const int64_t uid = tensor(nextVirtual_++, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
  constants_.emplace_back(uid, value);
  return uid;
}

cudnnBackendDescriptor_t CudnnGraph::tensorDesc(int64_t uid) {
  for (const auto& [u, d] : tensors_)
    if (u == uid) return d.get();
  if (ok()) error_ = "graph: tensor " + std::to_string(uid) + " was never made";
  return nullptr;
}

void CudnnGraph::matmul(int64_t a, int64_t b, int64_t c) {
  if (!ok()) return;
  CudnnDescriptor desc = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  check(setAttr(desc.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp),
        "matmul compute type");
  check(cudnnBackendFinalize(desc.get()), "matmul finalize");
  CudnnDescriptor op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  (void)(check(setDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensorDesc(a)), "matmul A") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensorDesc(b)), "matmul B") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensorDesc(c)), "matmul C") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, desc.get()), "matmul desc") &&
         check(cudnnBackendFinalize(op.get()), "matmul operation finalize"));
  aux_.push_back(std::move(desc));
  ops_.push_back(std::move(op));
}

void CudnnGraph::pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t y, int64_t b, int64_t t,
                           cudnnDataType_t math, int64_t axis) {
  if (!ok()) return;
  CudnnDescriptor desc = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
  check(setAttr(desc.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode),
        "pointwise mode");
  check(setAttr(desc.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math),
        "pointwise precision");
  if (mode == CUDNN_POINTWISE_GEN_INDEX)
    check(setAttr(desc.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis), "pointwise axis");
  check(cudnnBackendFinalize(desc.get()), "pointwise finalize");
  CudnnDescriptor op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  (void)(check(setDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc.get()),
               "pointwise desc") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensorDesc(x)), "pointwise x") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensorDesc(y)), "pointwise y") &&
         (b < 0 ||
          check(setDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensorDesc(b)), "pointwise b")) &&
         (t < 0 ||
          check(setDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensorDesc(t)), "pointwise t")) &&
         check(cudnnBackendFinalize(op.get()), "pointwise operation finalize"));
  aux_.push_back(std::move(desc));
  ops_.push_back(std::move(op));
}

void CudnnGraph::reduction(cudnnReduceTensorOp_t opType, int64_t x, int64_t y) {
  if (!ok()) return;
  CudnnDescriptor desc = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  check(setAttr(desc.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &opType),
        "reduction operator");
  check(setAttr(desc.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp),
        "reduction compute type");
  check(cudnnBackendFinalize(desc.get()), "reduction finalize");
  CudnnDescriptor op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
  (void)(check(setDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc.get()), "reduction desc") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensorDesc(x)), "reduction x") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensorDesc(y)), "reduction y") &&
         check(cudnnBackendFinalize(op.get()), "reduction operation finalize"));
  aux_.push_back(std::move(desc));
  ops_.push_back(std::move(op));
}

void CudnnGraph::reshape(int64_t x, int64_t y) {
  if (!ok()) return;
  CudnnDescriptor op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  (void)(check(setDesc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensorDesc(x)), "reshape x") &&
         check(setDesc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensorDesc(y)), "reshape y") &&
         check(cudnnBackendFinalize(op.get()), "reshape operation finalize"));
  ops_.push_back(std::move(op));
}

// Heuristics of one mode: every proposed configuration is tried until one finalizes into a plan.
bool CudnnGraph::planFrom(cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t opGraph, CudnnPlan& out,
                          std::string* tried) {
  CudnnDescriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (heur.createStatus() != CUDNN_STATUS_SUCCESS ||
      setDesc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, opGraph) != CUDNN_STATUS_SUCCESS ||
      setAttr(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS)
    return false;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                               &count, nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return false;
  std::vector<CudnnDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               count, &count, raw.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < count; ++i) {
    CudnnDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = configs[static_cast<size_t>(i)].get();
    const cudnnStatus_t s =
        plan.createStatus() == CUDNN_STATUS_SUCCESS &&
                setAttr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_) ==
                    CUDNN_STATUS_SUCCESS &&
                setDesc(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg) == CUDNN_STATUS_SUCCESS
            ? cudnnBackendFinalize(plan.get())
            : CUDNN_STATUS_BAD_PARAM;
    // The engine's global index, for the log line that says what runs.
    int64_t engineId = -1;
    CudnnDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &e) == CUDNN_STATUS_SUCCESS)
      cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &engineId);
    if (s != CUDNN_STATUS_SUCCESS) {
      *tried += " engine " + std::to_string(engineId) + ": " + cudnnGetErrorString(s) + ";";
      continue;
    }
    int64_t ws = 0;
    cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                             &ws);
    out.plan_ = std::move(plan);
    out.keep_.push_back(std::move(configs[static_cast<size_t>(i)]));
    out.workspace_ = std::max<int64_t>(ws, 0);
    out.engineId_ = engineId;
    return true;
  }
  return false;
}

std::unique_ptr<CudnnPlan> CudnnGraph::build(std::string* whyNot) {
  CudnnDescriptor opGraph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  if (ok()) {
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const auto& op : ops_)
      ops.push_back(op.get());
    (void)(check(setAttr(opGraph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_),
                 "graph handle") &&
           check(setAttr(opGraph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                         static_cast<int64_t>(ops.size()), ops.data()),
                 "graph operations") &&
           check(cudnnBackendFinalize(opGraph.get()), "operation graph finalize"));
  }
  if (!ok()) {
    *whyNot = error_;
    return nullptr;
  }
  auto plan = std::make_unique<CudnnPlan>();
  std::string tried;
  if (!planFrom(CUDNN_HEUR_MODE_A, opGraph.get(), *plan, &tried) &&
      !planFrom(CUDNN_HEUR_MODE_FALLBACK, opGraph.get(), *plan, &tried)) {
    char last[512] = {0};
    cudnnGetLastErrorString(last, sizeof(last));
    *whyNot = "no cuDNN engine runs this graph" +
              (tried.empty() ? std::string(" (heuristics proposed none)") : tried) +
              (last[0] ? std::string(" ") + last : "");
    return nullptr;
  }
  for (auto& [uid, d] : tensors_)
    plan->keep_.push_back(std::move(d));
  for (auto& d : aux_)
    plan->keep_.push_back(std::move(d));
  for (auto& d : ops_)
    plan->keep_.push_back(std::move(d));
  plan->keep_.push_back(std::move(opGraph));
  plan->constants_ = constants_;
  tensors_.clear(), aux_.clear(), ops_.clear();
  return plan;
}

}  // namespace mt::cuda
