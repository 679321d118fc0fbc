#include "export/OnnxGraph.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/Check.h"
#include "core/Error.h"
#include "onnx.pb.h"  // generated at build time from onnx.proto (export/CMakeLists.txt)

namespace mt {

size_t onnxTypeSize(OnnxType t) {
  switch (t) {
    case OnnxType::kFloat:
    case OnnxType::kInt32:
      return 4;
    case OnnxType::kInt64:
      return 8;
    case OnnxType::kUint8:
    case OnnxType::kInt8:
    case OnnxType::kBool:
      return 1;
  }
  return 0;
}

OnnxAttr OnnxAttr::integer(std::string name, int64_t v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
OnnxAttr OnnxAttr::real(std::string name, float v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
OnnxAttr OnnxAttr::text(std::string name, std::string v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}
OnnxAttr OnnxAttr::integers(std::string name, std::vector<int64_t> v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kInts;
  a.ints = std::move(v);
  return a;
}
namespace {

// A file written under a temporary name in its directory and renamed over its target by commit();
// removed when destroyed uncommitted (an exception on the way). Errors are IoErrors naming the target.
class PendingFile {
 public:
  explicit PendingFile(std::string target) : target_(std::move(target)) {
    tmp_ = target_ + ".tmp-" + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("creating " + tmp_, errno);
  }
  ~PendingFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

  int64_t size() const { return written_; }
  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("writing", errno);
      p += n;
      bytes -= static_cast<size_t>(n);
      written_ += n;
    }
  }
  void pad(int64_t to) {
    static const char zeros[64] = {};
    while (written_ < to)
      write(zeros, static_cast<size_t>(std::min<int64_t>(64, to - written_)));
  }
  // Flushed to disk (network filesystems report a full disk at fsync or close) and closed.
  void finish() {
    if (::fsync(fd_) != 0) fail("flushing", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing", errno);
  }
  void commit() {
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("renaming " + tmp_ + " over it", errno);
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const {
    throw IoError("cannot write " + target_ + ": " + what + ": " + std::strerror(err));
  }
  std::string target_, tmp_;
  int fd_ = -1;
  int64_t written_ = 0;
  bool committed_ = false;
};

std::string baseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void setShape(onnx::ValueInfoProto* v, OnnxType type, const std::vector<OnnxDim>& dims) {
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(static_cast<int32_t>(type));
  onnx::TensorShapeProto* shape = t->mutable_shape();
  for (const OnnxDim& d : dims) {
    onnx::TensorShapeProto_Dimension* dim = shape->add_dim();
    if (const auto* n = std::get_if<int64_t>(&d))
      dim->set_dim_value(*n);
    else
      dim->set_dim_param(std::get<std::string>(d));
  }
}

void setAttribute(onnx::AttributeProto* p, const OnnxAttr& a) {
  p->set_name(a.name);
  switch (a.kind) {
    case OnnxAttr::Kind::kInt:
      p->set_type(onnx::AttributeProto::INT);
      p->set_i(a.i);
      break;
    case OnnxAttr::Kind::kFloat:
      p->set_type(onnx::AttributeProto::FLOAT);
      p->set_f(a.f);
      break;
    case OnnxAttr::Kind::kString:
      p->set_type(onnx::AttributeProto::STRING);
      p->set_s(a.s);
      break;
    case OnnxAttr::Kind::kInts:
      p->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : a.ints)
        p->add_ints(v);
      break;
  }
}

}  // namespace

struct OnnxGraph::Impl {
  onnx::ModelProto model;
  onnx::GraphProto* graph = nullptr;
  int64_t opset = 0;
  std::unordered_set<std::string> taken;          // every name in the graph
  std::unordered_map<std::string, int> suffixes;  // hint -> the last suffix tried for it
  int64_t initBytes = 0;
};

OnnxGraph::OnnxGraph(const std::string& graphName, int64_t opset, const std::string& producer,
                     const std::string& producerVersion)
    : impl_(std::make_unique<Impl>()) {
  impl_->opset = opset;
  onnx::ModelProto& m = impl_->model;
  m.set_ir_version(onnx::IR_VERSION);  // the schema's own: 8 for ONNX 1.12
  m.set_producer_name(producer);
  m.set_producer_version(producerVersion);
  onnx::OperatorSetIdProto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  impl_->graph = m.mutable_graph();
  impl_->graph->set_name(graphName);
}

OnnxGraph::~OnnxGraph() = default;
OnnxGraph::OnnxGraph(OnnxGraph&&) noexcept = default;
OnnxGraph& OnnxGraph::operator=(OnnxGraph&&) noexcept = default;

int64_t OnnxGraph::opset() const {
  return impl_->opset;
}
int64_t OnnxGraph::initializerBytes() const {
  return impl_->initBytes;
}

std::string OnnxGraph::fresh(const std::string& hint) {
  std::string name = hint;
  int& k = impl_->suffixes[hint];
  while (impl_->taken.count(name))
    name = hint + "_" + std::to_string(++k);
  impl_->taken.insert(name);
  return name;
}

void OnnxGraph::addInput(const std::string& name, OnnxType type, const std::vector<OnnxDim>& dims,
                         const std::string& doc) {
  MT_CHECK(impl_->taken.insert(name).second, "onnx: input name ", name, " already used");
  onnx::ValueInfoProto* v = impl_->graph->add_input();
  v->set_name(name);
  v->set_doc_string(doc);
  setShape(v, type, dims);
}

void OnnxGraph::addOutput(const std::string& name, OnnxType type, const std::vector<OnnxDim>& dims,
                          const std::string& doc) {
  onnx::ValueInfoProto* v = impl_->graph->add_output();
  v->set_name(name);
  v->set_doc_string(doc);
  setShape(v, type, dims);
}

std::string OnnxGraph::addInitializer(const std::string& name, OnnxType type,
                                      const std::vector<int64_t>& dims, const void* data, size_t bytes) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  MT_CHECK(static_cast<size_t>(n) * onnxTypeSize(type) == bytes, "onnx: initializer ", name, " of ", n,
           " elements given ", bytes, " bytes");
  const std::string unique = fresh(name);
  onnx::TensorProto* t = impl_->graph->add_initializer();
  t->set_name(unique);
  t->set_data_type(static_cast<int32_t>(type));
  for (int64_t d : dims)
    t->add_dims(d);
  t->set_raw_data(data, bytes);  // little-endian, row-major: the host's own layout on x86/ARM
  impl_->initBytes += static_cast<int64_t>(bytes);
  return unique;
}

std::string OnnxGraph::addInitializer(const std::string& name, const Tensor& t) {
  MT_CHECK(t.device().isCpu() && t.isContiguous(), "onnx: initializer ", name,
           " must be a contiguous host tensor");
  OnnxType type;
  switch (t.dtype()) {
    case DType::kF32:
      type = OnnxType::kFloat;
      break;
    case DType::kI32:
      type = OnnxType::kInt32;
      break;
    case DType::kI64:
      type = OnnxType::kInt64;
      break;
    case DType::kU8:
      type = OnnxType::kUint8;
      break;
    default:
      MT_CHECK(false, "onnx: initializer ", name, " of dtype ", dtypeName(t.dtype()), " is not exported");
  }
  return addInitializer(name, type, t.shape(), t.rawData(), t.nbytes());
}

std::string OnnxGraph::addScalar(const std::string& name, float v) {
  return addInitializer(name, OnnxType::kFloat, {}, &v, sizeof v);
}

std::string OnnxGraph::addScalarI64(const std::string& name, int64_t v) {
  return addInitializer(name, OnnxType::kInt64, {}, &v, sizeof v);
}

std::string OnnxGraph::addVectorI64(const std::string& name, const std::vector<int64_t>& v) {
  return addInitializer(name, OnnxType::kInt64, {static_cast<int64_t>(v.size())}, v.data(), v.size() * 8);
}

std::vector<std::string> OnnxGraph::addNode(const std::string& op, const std::vector<std::string>& inputs,
                                            int numOutputs, const std::vector<OnnxAttr>& attrs,
                                            const std::string& name) {
  onnx::NodeProto* n = impl_->graph->add_node();
  n->set_op_type(op);
  n->set_name(fresh(name + "#node"));
  for (const auto& in : inputs)
    n->add_input(in);
  std::vector<std::string> outs;
  for (int k = 0; k < numOutputs; ++k) {
    outs.push_back(fresh(name + (k == 0 ? "/out" : "/out" + std::to_string(k))));
    n->add_output(outs.back());
  }
  for (const auto& a : attrs)
    setAttribute(n->add_attribute(), a);
  return outs;
}

std::string OnnxGraph::add(const std::string& op, const std::vector<std::string>& inputs,
                           const std::string& name, const std::vector<OnnxAttr>& attrs) {
  return addNode(op, inputs, 1, attrs, name)[0];
}

std::string OnnxGraph::addAs(const std::string& op, const std::vector<std::string>& inputs,
                             const std::string& output, const std::vector<OnnxAttr>& attrs) {
  MT_CHECK(impl_->taken.insert(output).second, "onnx: tensor name ", output, " already used");
  onnx::NodeProto* n = impl_->graph->add_node();
  n->set_op_type(op);
  n->set_name(fresh(output + "#node"));
  for (const auto& in : inputs)
    n->add_input(in);
  n->add_output(output);
  for (const auto& a : attrs)
    setAttribute(n->add_attribute(), a);
  return output;
}

void OnnxGraph::setDoc(const std::string& doc) {
  impl_->model.set_doc_string(doc);
}

void OnnxGraph::addMetadata(const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto* e = impl_->model.add_metadata_props();
  e->set_key(key);
  e->set_value(value);
}

void OnnxGraph::save(const std::string& path, const OnnxSaveOptions& options) {
  onnx::GraphProto& g = *impl_->graph;
  const bool external =
      options.external == OnnxSaveOptions::ExternalData::kAlways ||
      (options.external == OnnxSaveOptions::ExternalData::kAuto && impl_->initBytes > kExternalDataThreshold);
  const std::string dataPath = path + ".data";
  std::unique_ptr<PendingFile> data;
  if (external) {
    // Each tensor at a 4 KiB boundary, so a reader may map it in place.
    data = std::make_unique<PendingFile>(dataPath);
    for (onnx::TensorProto& t : *g.mutable_initializer()) {
      if (static_cast<int64_t>(t.raw_data().size()) < kExternalMinBytes) continue;
      const int64_t offset = (data->size() + 4095) / 4096 * 4096;
      data->pad(offset);
      data->write(t.raw_data().data(), t.raw_data().size());
      const auto entry = [&t](const std::string& key, const std::string& value) {
        onnx::StringStringEntryProto* e = t.add_external_data();
        e->set_key(key);
        e->set_value(value);
      };
      entry("location", baseName(dataPath));
      entry("offset", std::to_string(offset));
      entry("length", std::to_string(t.raw_data().size()));
      t.set_data_location(onnx::TensorProto::EXTERNAL);
      t.clear_raw_data();
    }
    data->finish();
  }
  if (impl_->model.ByteSizeLong() > static_cast<size_t>(INT_MAX))
    throw IoError("cannot write " + path + ": the model is " +
                  std::to_string(impl_->model.ByteSizeLong() >> 20) +
                  " MiB, above protobuf's 2 GiB: export its weights as external data");
  std::string bytes;
  if (!impl_->model.SerializeToString(&bytes))
    throw IoError("cannot write " + path + ": protobuf serialisation failed");
  PendingFile model(path);
  model.write(bytes.data(), bytes.size());
  model.finish();
  // The data first: a model file never names a data file that is not complete.
  if (data) data->commit();
  model.commit();
}

}  // namespace mt
