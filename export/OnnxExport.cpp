#include "export/OnnxExport.h"

#include <cmath>

#include "core/Check.h"
#include "export/OnnxLayers.h"

namespace mt {

using Json = nlohmann::json;

std::string OnnxExportHooks::weight(OnnxGraph& g, const std::string& name, const Tensor& w, int channelAxis) {
  return g.addInitializer(name, w);
}

Tensor transposed2d(const Tensor& t) {
  MT_CHECK(t.ndim() == 2 && t.dtype() == DType::kF32 && t.isContiguous(), "transposed2d: ", t.str());
  const int64_t R = t.dim(0), C = t.dim(1);
  Tensor out = Tensor::empty({C, R}, DType::kF32);
  const float* s = t.data<float>();
  float* d = out.data<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      d[c * R + r] = s[r * C + c];
  return out;
}

void OnnxWriter::fail(const std::string& what) const {
  throw CheckpointError("export: " + where + ": " + what);
}

const Tensor& OnnxWriter::param(const std::string& name, const Shape& shape) const {
  const auto it = params.find(name);
  if (it == params.end())
    fail("the architecture names parameter " + name + ", which the checkpoint does not hold");
  if (it->second.shape() != shape)
    fail("parameter " + name + " is " + shapeStr(it->second.shape()) +
         " in the checkpoint, the architecture implies " + shapeStr(shape));
  return it->second;
}

int64_t OnnxWriter::integer(const Json& j, const std::string& key, int64_t lo) const {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < lo)
    fail("architecture record: '" + key + "' must be an integer >= " + std::to_string(lo) +
         (j.contains(key) ? ", got " + j[key].dump() : std::string(", absent")));
  return j[key].get<int64_t>();
}

double OnnxWriter::number(const Json& j, const std::string& key) const {
  if (!j.contains(key) || !j[key].is_number() || !std::isfinite(j[key].get<double>()))
    fail("architecture record: '" + key + "' must be a finite number" +
         (j.contains(key) ? ", got " + j[key].dump() : std::string(", absent")));
  return j[key].get<double>();
}

std::string OnnxWriter::word(const Json& j, const std::string& key) const {
  if (!j.contains(key) || !j[key].is_string())
    fail("architecture record: '" + key + "' must be a string" +
         (j.contains(key) ? ", got " + j[key].dump() : std::string(", absent")));
  return j[key].get<std::string>();
}

std::string OnnxWriter::linear(const std::string& x, const std::string& weightName,
                               const std::string& biasName, const std::string& site) {
  const auto it = params.find(weightName);
  if (it == params.end() || it->second.ndim() != 2)
    fail("parameter " + weightName + " is missing or not a matrix");
  const Tensor& wt = it->second;
  const std::string W = hooks.weight(g, weightName, transposed2d(wt), /*channelAxis=*/1);
  const std::string in = hooks.activation(g, x, site);
  std::string y = g.add("MatMul", {in, W}, site + "/matmul");
  if (!biasName.empty())
    y = g.add("Add", {y, g.addInitializer(biasName, param(biasName, {wt.dim(0)}))}, site + "/bias");
  return y;
}

std::string OnnxWriter::gelu(const std::string& x, bool tanh, const std::string& site) {
  if (!tanh) {  // 0.5 x (1 + erf(x / sqrt 2))
    const std::string e = g.add(
        "Erf", {g.add("Div", {x, scalar(std::sqrt(2.f), site + "/sqrt2")}, site + "/div")}, site + "/erf");
    const std::string one = g.add("Add", {e, scalar(1.f, site + "/one")}, site + "/add1");
    return g.add("Mul", {g.add("Mul", {x, scalar(0.5f, site + "/half")}, site + "/halfx"), one},
                 site + "/gelu");
  }
  // As models/layers/Activation.cpp: u = k (x + c x x x), y = (0.5 x) (1 + tanh u).
  const std::string x3 = g.add("Mul", {g.add("Mul", {x, x}, site + "/x2"), x}, site + "/x3");
  const std::string inner =
      g.add("Add", {x, g.add("Mul", {x3, scalar(0.044715f, site + "/c")}, site + "/cx3")}, site + "/inner");
  const std::string u = g.add("Mul", {inner, scalar(0.7978845608028654f, site + "/k")}, site + "/u");
  const std::string one =
      g.add("Add", {g.add("Tanh", {u}, site + "/tanh"), scalar(1.f, site + "/one")}, site + "/add1");
  return g.add("Mul", {g.add("Mul", {x, scalar(0.5f, site + "/half")}, site + "/halfx"), one},
               site + "/gelu");
}

std::string OnnxWriter::layerNorm(const std::string& x, const std::string& prefix, int64_t channels,
                                  float eps, const std::string& site) {
  const std::string w = g.addInitializer(prefix + "weight", param(prefix + "weight", {channels}));
  const std::string b = g.addInitializer(prefix + "bias", param(prefix + "bias", {channels}));
  // Biased variance, eps inside the square root, statistics in f32: LayerNorm.h's definition.
  return g.add("LayerNormalization", {x, w, b}, site,
               {OnnxAttr::integer("axis", -1), OnnxAttr::real("epsilon", eps)});
}

OnnxGraph buildOnnxModel(const std::string& architecture, const ParamMap& params,
                         const OnnxExportOptions& options, const std::string& where) {
  MT_REQUIRE(options.opset >= 17, ConfigError, "export: ONNX opset ", options.opset,
             " is below 17 (LayerNormalization, the lowest this exporter writes)");
  const Json arch = Json::parse(architecture, nullptr, false);
  if (!arch.is_object() || arch.value("format", "") != "meshtrain-architecture")
    throw CheckpointError("export: " + where +
                          ": the architecture record is not meshtrain-architecture JSON");
  if (arch.value("version", 0) != 1)
    throw CheckpointError("export: " + where + ": architecture record version " +
                          arch.value("version", Json()).dump() + " (this build writes version 1)");
  const std::string type = arch.value("type", "");
  OnnxGraph g("meshtrain_" + type, options.opset, "meshtrain", MT_ONNX_PRODUCER_VERSION);
  OnnxExportHooks plain;
  OnnxWriter w{g, params, options.hooks ? *options.hooks : plain, where};
  if (type == "mlp" || type == "cnn")
    addSequentialGraph(w, arch);
  else if (type == "gpt")
    addGptGraph(w, arch);
  else
    w.fail("model type '" + type + "' has no ONNX export (mlp, cnn and gpt do)");
  g.addMetadata("meshtrain.architecture", architecture);
  if (!options.source.empty()) g.addMetadata("meshtrain.checkpoint", options.source);
  if (options.step >= 0) g.addMetadata("meshtrain.step", std::to_string(options.step));
  return g;
}

namespace {

// Where the image activation is, as the trainer holds it and as the graph holds it: convolutions
// run in NCHW in ONNX whatever the model's layout; Flatten and Linear see the trainer's.
enum class Arrangement { kFlat, kNHWC, kNCHW };

struct ImageState {
  std::string x;
  Arrangement trainer = Arrangement::kNHWC, graph = Arrangement::kNHWC;
};

void toGraphNchw(OnnxWriter& w, ImageState& s, const std::string& site) {
  if (s.graph == Arrangement::kNCHW) return;
  if (s.graph != Arrangement::kNHWC) w.fail("layer " + site + " needs an image, its input is flat");
  s.x = w.g.add("Transpose", {s.x}, site + "/to_nchw", {OnnxAttr::integers("perm", {0, 3, 1, 2})});
  s.graph = Arrangement::kNCHW;
}

std::string imageInput(OnnxWriter& w, const Json& layer, const Json& input, ImageState& s) {
  const int64_t H = w.integer(input, "height", 1), W = w.integer(input, "width", 1),
                C = w.integer(input, "channels", 1);
  w.g.addInput("images", OnnxType::kUint8, {std::string("batch"), H, W, C},
               "pixels as the data file holds them: uint8 [batch, height, width, channels] (NHWC)");
  // ImageInput's float arithmetic: a = 1 / (255 std), c0 = -mean / std, y = x a + c0.
  const float mean = static_cast<float>(w.number(layer, "mean")),
              stddev = static_cast<float>(w.number(layer, "std"));
  if (!(stddev > 0.f)) w.fail("image_input std must be positive");
  const float a = 1.f / (255.f * stddev), c0 = -mean / stddev;
  std::string x = w.g.add("Cast", {"images"}, "input/cast", {OnnxAttr::integer("to", 1)});
  x = w.g.add("Mul", {x, w.scalar(a, "input/scale")}, "input/mul");
  x = w.g.add("Add", {x, w.scalar(c0, "input/shift")}, "input/add");
  const std::string out = w.word(layer, "output");
  if (out == "flat_hwc") {
    s.trainer = s.graph = Arrangement::kFlat;
    return w.g.add("Flatten", {x}, "input/flatten", {OnnxAttr::integer("axis", 1)});
  }
  if (out == "nchw") {
    s.trainer = s.graph = Arrangement::kNCHW;
    return w.g.add("Transpose", {x}, "input/to_nchw", {OnnxAttr::integers("perm", {0, 3, 1, 2})});
  }
  if (out != "nhwc") w.fail("image_input output '" + out + "' is not flat_hwc, nhwc or nchw");
  s.trainer = s.graph = Arrangement::kNHWC;
  return x;
}

// Conv2d: the filter as ONNX's [O, C, KH, KW]; an NHWC model's [O, KH, KW, C] is transposed.
void conv2d(OnnxWriter& w, const Json& layer, const std::string& label, ImageState& s) {
  const int64_t in = w.integer(layer, "in_channels", 1), out = w.integer(layer, "out_channels", 1);
  const int64_t k = w.integer(layer, "kernel", 1), stride = w.integer(layer, "stride", 1);
  const int64_t pad = w.integer(layer, "padding", 0);
  const bool nhwc = w.word(layer, "layout") == "nhwc";
  toGraphNchw(w, s, label);
  s.trainer = nhwc ? Arrangement::kNHWC : Arrangement::kNCHW;
  const Tensor& f = w.param(label + ".weight", nhwc ? Shape{out, k, k, in} : Shape{out, in, k, k});
  Tensor oihw = f;
  if (nhwc) {
    oihw = Tensor::empty({out, in, k, k}, DType::kF32);
    const float* src = f.data<float>();
    float* dst = oihw.data<float>();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t y = 0; y < k; ++y)
        for (int64_t x = 0; x < k; ++x)
          for (int64_t c = 0; c < in; ++c)
            dst[((o * in + c) * k + y) * k + x] = src[((o * k + y) * k + x) * in + c];
  }
  std::vector<std::string> inputs = {w.hooks.activation(w.g, s.x, label),
                                     w.hooks.weight(w.g, label + ".weight", oihw, /*channelAxis=*/0)};
  if (w.integer(layer, "bias", 0))
    inputs.push_back(w.hooks.bias(w.g, label + ".bias", w.param(label + ".bias", {out}), label));
  s.x = w.g.add("Conv", inputs, label,
                {OnnxAttr::integers("kernel_shape", {k, k}), OnnxAttr::integers("strides", {stride, stride}),
                 OnnxAttr::integers("pads", {pad, pad, pad, pad})});
  s.x = w.hooks.output(w.g, s.x, label);
}

}  // namespace

void addSequentialGraph(OnnxWriter& w, const Json& arch) {
  if (!arch.contains("layers") || !arch["layers"].is_array() || arch["layers"].empty())
    w.fail("architecture record: no layers");
  if (!arch.contains("input") || !arch["input"].is_object())
    w.fail("architecture record: no input description");
  const Json& input = arch["input"];
  const int64_t classes = w.integer(input, "classes", 1);
  ImageState s;
  bool first = true;
  for (const Json& layer : arch["layers"]) {
    const std::string kind = w.word(layer, "kind"), label = w.word(layer, "name");
    if (first != (kind == "image_input"))
      w.fail("layer " + label + ": image_input must come first, and only there");
    first = false;
    if (kind == "image_input") {
      s.x = imageInput(w, layer, input, s);
    } else if (kind == "linear") {
      if (s.trainer != Arrangement::kFlat)
        w.fail("linear layer " + label + " reads an image: flatten it first");
      const int64_t in = w.integer(layer, "in_features", 1), out = w.integer(layer, "out_features", 1);
      w.param(label + ".weight", {out, in});
      s.x = w.linear(s.x, label + ".weight", w.integer(layer, "bias", 0) ? label + ".bias" : "", label);
    } else if (kind == "relu") {
      s.x = w.g.add("Relu", {s.x}, label);
    } else if (kind == "gelu") {
      const std::string approx = w.word(layer, "approximate");
      if (approx != "tanh" && approx != "none") w.fail("gelu " + label + ": approximate '" + approx + "'");
      s.x = w.gelu(s.x, approx == "tanh", label);
    } else if (kind == "dropout") {
      continue;  // identity at inference
    } else if (kind == "conv2d") {
      conv2d(w, layer, label, s);
    } else if (kind == "maxpool2d") {
      const int64_t k = w.integer(layer, "kernel", 1), stride = w.integer(layer, "stride", 1);
      toGraphNchw(w, s, label);
      s.x = w.g.add(
          "MaxPool", {s.x}, label,
          {OnnxAttr::integers("kernel_shape", {k, k}), OnnxAttr::integers("strides", {stride, stride})});
      s.x = w.hooks.pooled(w.g, s.x, label);
    } else if (kind == "flatten") {
      if (s.trainer == Arrangement::kNHWC &&
          s.graph == Arrangement::kNCHW)  // flatten H, W, C as the trainer does
        s.x = w.g.add("Transpose", {s.x}, label + "/to_nhwc", {OnnxAttr::integers("perm", {0, 2, 3, 1})});
      s.x = w.g.add("Flatten", {s.x}, label, {OnnxAttr::integer("axis", 1)});
      s.trainer = s.graph = Arrangement::kFlat;
    } else {
      w.fail("layer " + label + " of kind '" + kind + "' has no ONNX export");
    }
  }
  if (s.trainer != Arrangement::kFlat) w.fail("the last layer's output is not [batch, classes]");
  w.g.addAs("Identity", {s.x}, "logits");
  w.g.addOutput("logits", OnnxType::kFloat, {std::string("batch"), classes},
                "unnormalised class scores (softmax gives the probabilities): float [batch, classes]");
  w.g.setDoc("meshtrain " + arch.value("type", std::string()) +
             ": images uint8 [batch, H, W, C] -> logits float [batch, classes]");
}

}  // namespace mt
