// export/OnnxGraph and export/OnnxExport: what a saved model holds when read back with the same
// ONNX schema (names, types, symbolic dims, opset, initializer bytes, external data offsets), that a
// failed save leaves an existing file alone, and that records the exporter cannot write are refused
// naming what is wrong. Runtime parity is tests/launch/test_onnx_export.py's.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/Error.h"
#include "export/OnnxExport.h"
#include "export/OnnxGraph.h"
#include "onnx.pb.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/mt_onnx_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

onnx::ModelProto load(const std::string& path) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(slurp(path))) << path;
  return m;
}

Tensor ramp(const Shape& shape, float start) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

TEST(OnnxGraph, FreshNamesNeverRepeat) {
  OnnxGraph g("g", 17, "test", "0");
  EXPECT_EQ(g.fresh("a"), "a");
  EXPECT_EQ(g.fresh("a"), "a_1");
  EXPECT_EQ(g.fresh("a_1"), "a_1_1");
  EXPECT_EQ(g.fresh("a"), "a_2");
  g.addInput("x", OnnxType::kFloat, {int64_t{1}}, "");
  EXPECT_EQ(g.fresh("x"), "x_1");
  EXPECT_THROW(g.addInput("x", OnnxType::kFloat, {int64_t{1}}, ""), InternalError);
  const float v[2] = {1, 2};
  EXPECT_THROW(g.addInitializer("w", OnnxType::kFloat, {3}, v, sizeof v),
               InternalError);  // 3 elements, 2 given
}

TEST(OnnxGraph, SavedModelReadsBackWithTheSchema) {
  TempDir d;
  OnnxGraph g("tiny", 17, "meshtrain-test", "9.9");
  g.addInput("x", OnnxType::kFloat, {std::string("batch"), int64_t{3}}, "the input");
  const Tensor w = ramp({3}, 0.5f);
  const std::string wn = g.addInitializer("w", w);
  const std::string sum = g.add("Add", {"x", wn}, "add");
  g.addAs("Relu", {sum}, "y");
  g.addOutput("y", OnnxType::kFloat, {std::string("batch"), int64_t{3}}, "");
  g.addMetadata("k", "v");
  g.save(d / "m.onnx");

  const onnx::ModelProto m = load(d / "m.onnx");
  EXPECT_EQ(m.ir_version(), 8);
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).domain(), "");
  EXPECT_EQ(m.opset_import(0).version(), 17);
  EXPECT_EQ(m.producer_name(), "meshtrain-test");
  const onnx::GraphProto& gr = m.graph();
  ASSERT_EQ(gr.input_size(), 1);
  const auto& shape = gr.input(0).type().tensor_type().shape();
  EXPECT_EQ(gr.input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  ASSERT_EQ(shape.dim_size(), 2);
  EXPECT_EQ(shape.dim(0).dim_param(), "batch");
  EXPECT_EQ(shape.dim(1).dim_value(), 3);
  ASSERT_EQ(gr.node_size(), 2);
  EXPECT_EQ(gr.node(0).op_type(), "Add");
  EXPECT_EQ(gr.node(0).input(1), "w");
  EXPECT_EQ(gr.node(1).op_type(), "Relu");
  EXPECT_EQ(gr.node(1).output(0), "y");
  EXPECT_EQ(gr.output(0).name(), "y");
  ASSERT_EQ(gr.initializer_size(), 1);
  EXPECT_EQ(gr.initializer(0).raw_data(), std::string(static_cast<const char*>(w.rawData()), w.nbytes()));
  EXPECT_EQ(gr.initializer(0).dims_size(), 1);
  ASSERT_EQ(m.metadata_props_size(), 1);
  EXPECT_EQ(m.metadata_props(0).value(), "v");
  EXPECT_FALSE(fs::exists(d / "m.onnx.data"));
  for (const auto& e : fs::directory_iterator(d.path()))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(OnnxGraph, ExternalDataIsAlignedAndHoldsEveryLargeTensor) {
  TempDir d;
  OnnxGraph g("ext", 17, "t", "0");
  g.addInput("x", OnnxType::kFloat, {int64_t{2000}}, "");
  const Tensor a = ramp({2000}, 1.f), b = ramp({10, 300}, -7.f);
  const std::string an = g.addInitializer("a", a), bn = g.addInitializer("b", b), s = g.addScalar("s", 2.f);
  g.addAs("Add", {g.add("Mul", {"x", an}, "mul"), s}, "y");
  g.addOutput("y", OnnxType::kFloat, {int64_t{2000}}, "");
  g.save(d / "m.onnx", {OnnxSaveOptions::ExternalData::kAlways});

  const onnx::ModelProto m = load(d / "m.onnx");
  const std::string data = slurp(d / "m.onnx.data");
  int external = 0;
  for (const auto& t : m.graph().initializer()) {
    if (t.name() == "s") {  // small ones stay in the model
      EXPECT_NE(t.data_location(), onnx::TensorProto::EXTERNAL);
      EXPECT_EQ(t.raw_data().size(), 4u);
      continue;
    }
    ++external;
    EXPECT_EQ(t.data_location(), onnx::TensorProto::EXTERNAL);
    EXPECT_TRUE(t.raw_data().empty());
    std::map<std::string, std::string> kv;
    for (const auto& e : t.external_data())
      kv[e.key()] = e.value();
    EXPECT_EQ(kv["location"], "m.onnx.data");
    const size_t offset = std::stoul(kv["offset"]), length = std::stoul(kv["length"]);
    EXPECT_EQ(offset % 4096, 0u);
    const Tensor& src = t.name() == "a" ? a : b;
    ASSERT_EQ(length, src.nbytes());
    ASSERT_LE(offset + length, data.size());
    EXPECT_EQ(data.substr(offset, length),
              std::string(static_cast<const char*>(src.rawData()), src.nbytes()));
  }
  EXPECT_EQ(external, 2);
}

TEST(OnnxGraph, FailedSaveLeavesTheExistingFile) {
  TempDir d;
  { std::ofstream(d / "m.onnx") << "previous model"; }
  fs::create_directory(d / "m.onnx.data");  // the side file cannot be renamed over a directory
  OnnxGraph g("g", 17, "t", "0");
  g.addInput("x", OnnxType::kFloat, {int64_t{600}}, "");
  g.addAs("Add", {"x", g.addInitializer("w", ramp({600}, 0.f))}, "y");
  g.addOutput("y", OnnxType::kFloat, {int64_t{600}}, "");
  EXPECT_THROW(g.save(d / "m.onnx", {OnnxSaveOptions::ExternalData::kAlways}), IoError);
  EXPECT_EQ(slurp(d / "m.onnx"), "previous model");
  for (const auto& e : fs::directory_iterator(d.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// A one-linear MLP record as launch/Architecture writes it.
std::string mlpRecord(const std::string& extraLayer = "") {
  return R"({"format":"meshtrain-architecture","version":1,"type":"mlp",
    "input":{"dtype":"u8","layout":"nhwc","height":2,"width":2,"channels":1,"classes":3},
    "layers":[{"name":"input","kind":"image_input","scale":0.00392156862745098,"mean":0.5,"std":0.25,
               "output":"flat_hwc"},)" +
         extraLayer + R"(
              {"name":"fc1","kind":"linear","in_features":4,"out_features":3,"bias":1,
               "params":[{"name":"fc1.weight","shape":[3,4]},{"name":"fc1.bias","shape":[3]}]}],
    "output":"logits"})";
}

TEST(OnnxExport, WritesAnMlpAndRefusesWhatItCannot) {
  ParamMap params{{"fc1.weight", ramp({3, 4}, 0.f)}, {"fc1.bias", ramp({3}, 1.f)}};
  OnnxGraph g = buildOnnxModel(mlpRecord(), params, {}, "checkpoint X");
  TempDir d;
  g.save(d / "mlp.onnx");
  const onnx::ModelProto m = load(d / "mlp.onnx");
  EXPECT_EQ(m.graph().input(0).name(), "images");
  EXPECT_EQ(m.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::UINT8);
  EXPECT_EQ(m.graph().output(0).name(), "logits");

  auto refused = [&](const std::string& record, const ParamMap& p, const std::string& needle) {
    try {
      buildOnnxModel(record, p, {}, "checkpoint X");
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("checkpoint X"), std::string::npos) << e.what();
    }
  };
  refused(mlpRecord(R"({"name":"odd","kind":"lstm"},)"), params, "layer odd of kind 'lstm'");
  refused(mlpRecord(), {{"fc1.weight", ramp({3, 4}, 0.f)}}, "fc1.bias");
  refused(mlpRecord(), {{"fc1.weight", ramp({4, 3}, 0.f)}, {"fc1.bias", ramp({3}, 1.f)}}, "fc1.weight");
  refused(R"({"format":"meshtrain-architecture","version":1,"type":"rnn"})", params, "model type 'rnn'");
  refused("not json", params, "not meshtrain-architecture");
  OnnxExportOptions old;
  old.opset = 13;
  EXPECT_THROW(buildOnnxModel(mlpRecord(), params, old, "checkpoint X"), ConfigError);
}

}  // namespace
}  // namespace mt
