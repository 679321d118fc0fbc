#pragma once
// An ONNX model under construction: one graph, its inputs and outputs, initializers and nodes, kept
// in the ONNX protobuf schema (onnx.proto of ONNX 1.12, compiled at build time by protoc; the
// generated types stay inside OnnxGraph.cpp) and written to a file with `save`.
//
// The builder knows nothing of meshtrain's models: export/OnnxExport writes each architecture with
// it, and a quantized (QDQ) export adds its QuantizeLinear / DequantizeLinear nodes and int8/uint8
// initializers through the same calls. Every tensor name is unique in the graph: `fresh` makes
// one from a hint ("h0.ln_1/out", "h0.ln_1/out_1", ...).
//
// Large models: protobuf cannot serialise a message above 2 GiB, so with external data (asked, or
// automatic when the initializers pass kExternalDataThreshold) every initializer of kExternalMinBytes
// or more goes into one side file `<out>.data` (ONNX's external-data convention: location relative
// to the model file, offset and length per tensor), which ONNX Runtime, TensorRT and onnx.checker
// read from beside the model.

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/Tensor.h"

namespace mt {

// ONNX TensorProto.DataType values this exporter writes.
enum class OnnxType : int32_t { kFloat = 1, kUint8 = 2, kInt8 = 3, kInt32 = 6, kInt64 = 7, kBool = 9 };
size_t onnxTypeSize(OnnxType t);

// One attribute of a node: an int, a float, a string or a list of ints.
struct OnnxAttr {
  enum class Kind { kInt, kFloat, kString, kInts };
  std::string name;
  Kind kind = Kind::kInt;
  int64_t i = 0;
  float f = 0.f;
  std::string s;
  std::vector<int64_t> ints;

  static OnnxAttr integer(std::string name, int64_t v);
  static OnnxAttr real(std::string name, float v);
  static OnnxAttr text(std::string name, std::string v);
  static OnnxAttr integers(std::string name, std::vector<int64_t> v);
};

// A dimension of a graph input or output: fixed, or symbolic (a name shared by the dims that must
// agree, e.g. "batch").
using OnnxDim = std::variant<int64_t, std::string>;

struct OnnxSaveOptions {
  enum class ExternalData { kAuto, kAlways, kNever };
  ExternalData external = ExternalData::kAuto;
};

class OnnxGraph {
 public:
  // Initializers above this total go to a side file under ExternalData::kAuto (protobuf's hard
  // limit is 2 GiB for the whole model).
  static constexpr int64_t kExternalDataThreshold = int64_t{1536} << 20;
  // Smaller initializers (scalars, shapes, norms' gains) stay in the model file even then.
  static constexpr int64_t kExternalMinBytes = 1024;

  // graphName: the graph's name; opset: the default domain's version (>= 17 here); producer: who
  // wrote it (ModelProto.producer_name / producer_version).
  OnnxGraph(const std::string& graphName, int64_t opset, const std::string& producer,
            const std::string& producerVersion);
  ~OnnxGraph();
  OnnxGraph(OnnxGraph&&) noexcept;
  OnnxGraph& operator=(OnnxGraph&&) noexcept;
  OnnxGraph(const OnnxGraph&) = delete;
  OnnxGraph& operator=(const OnnxGraph&) = delete;

  int64_t opset() const;

  // A name not used yet in the graph, from `hint` (the hint itself when it is free).
  std::string fresh(const std::string& hint);

  void addInput(const std::string& name, OnnxType type, const std::vector<OnnxDim>& dims,
                const std::string& doc);
  void addOutput(const std::string& name, OnnxType type, const std::vector<OnnxDim>& dims,
                 const std::string& doc);

  // An initializer named (a fresh name from) `name` holding `bytes` of type `type` in ONNX's
  // little-endian row-major layout; returns its name. The bytes are copied.
  std::string addInitializer(const std::string& name, OnnxType type, const std::vector<int64_t>& dims,
                             const void* data, size_t bytes);
  // A host tensor (f32, i32, i64 or u8, contiguous) as an initializer of its own shape.
  std::string addInitializer(const std::string& name, const Tensor& t);
  // Small constants: a float scalar (shape []), an int64 scalar, an int64 vector (shape [n]).
  std::string addScalar(const std::string& name, float v);
  std::string addScalarI64(const std::string& name, int64_t v);
  std::string addVectorI64(const std::string& name, const std::vector<int64_t>& v);

  // A node of the default domain: op_type `op` reading `inputs` ("" for an absent optional input),
  // with `numOutputs` outputs named fresh from `name` ("<name>/out", "<name>/out_1", ...).
  // Returns the output names. `name` also names the node (made unique).
  std::vector<std::string> addNode(const std::string& op, const std::vector<std::string>& inputs,
                                   int numOutputs, const std::vector<OnnxAttr>& attrs,
                                   const std::string& name);
  // The one-output form.
  std::string add(const std::string& op, const std::vector<std::string>& inputs, const std::string& name,
                  const std::vector<OnnxAttr>& attrs = {});

  // A one-output node whose output is exactly `output` (a graph output's name; must be free).
  std::string addAs(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                    const std::vector<OnnxAttr>& attrs = {});

  // ModelProto.doc_string and metadata_props (key -> value): what a reader learns without meshtrain.
  void setDoc(const std::string& doc);
  void addMetadata(const std::string& key, const std::string& value);

  int64_t initializerBytes() const;

  // Writes the model to `path` (and `path`.data with external data) under temporary names, flushed
  // and renamed: a failed save leaves an existing file at `path` as it was. IoError naming the path.
  void save(const std::string& path, const OnnxSaveOptions& options = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
