#include "launch/ExportCommand.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "core/Log.h"
#include "data/H5File.h"
#include "data/ImageDataset.h"
#include "data/TokenDataset.h"
#include "export/OnnxExport.h"
#include "launch/Architecture.h"
#include "launch/CheckpointFile.h"
#include "launch/CommandArgs.h"
#include "launch/QuantizeExport.h"
#include "models/quant/QuantizedModel.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaMemory.h"
#include "core/cuda/CudaRuntime.h"
#endif

namespace mt {

namespace fs = std::filesystem;

const char* const kExportUsage =
    "usage: trainer export --checkpoint DIR --out FILE [--format h5|onnx] [--external-data "
    "auto|always|never]\n"
    "  h5 (default): one HDF5 file with the consolidated parameters of a (sharded) checkpoint and its\n"
    "  architecture; onnx: the model as an ONNX model (opset 17, dynamic batch; GPT: dynamic sequence\n"
    "  up to its block size), f32 master weights. --external-data: weights in FILE.data beside the\n"
    "  model (auto: when they pass 1.5 GiB; protobuf's limit is 2 GiB)\n"
    "  int8 (onnx, mlp and cnn): [--quantize int8] [--calibration minmax|percentile|qat]\n"
    "    [--calibration-batches N (8)] [--calibration-batch-size B (128)] [--percentile P (99.99)]\n"
    "    [--calibration-data FILE.h5] [--weight-type uint8|int8]: a QDQ model, int8 weights per output\n"
    "    channel, uint8 activations calibrated on N training batches (qat, the default for a train.qat\n"
    "    checkpoint: its observers); weights stored as uint8 (q + 128, zero point 128: the same result\n"
    "    on every x86 CPU) or int8 (ONNX Runtime's uint8 x int8 kernels, exact only with VNNI)\n";
const char* const kLogitsUsage =
    "usage: trainer logits --checkpoint DIR --out FILE.h5 [--data FILE.h5] [--split test] [--first I]\n"
    "         [--count N] [--seq-len T] [--quantize int8] [--device cpu|cuda] [--precision f32|bf16|f16]\n"
    "  the trainer's own inference forward of a checkpoint (CPU f32 by default; --device cuda runs it\n"
    "  on GPU 0 with the matmul precision of train.precision) on samples first..first+N-1\n"
    "  (default 0..15) of a split of its data (default: the file it trained on, the test split):\n"
    "  /inputs, /labels or /targets, /logits; GPT windows of T tokens (default its block size);\n"
    "  --quantize int8: the int8 fake-quantized forward of a train.qat checkpoint (its observers)\n";

namespace {

// `--flag value` or `--flag=value` into a map, every flag one of `known`.
std::map<std::string, std::string> parseFlags(const std::string& command,
                                              const std::vector<std::string>& args,
                                              const std::vector<std::string>& known, const char* usage) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw ConfigError(command + ": " + flag + " needs a value\n" + usage);
    }
    bool ok = false;
    for (const auto& k : known)
      ok = ok || flag == k;
    if (!ok) throw ConfigError(command + ": unknown argument '" + flag + "'\n" + usage);
    out[flag] = value;
  }
  return out;
}

// --out must be a file this process can create beside: its directory exists and takes a new file
// (tried, since permission bits say nothing to root or of a read-only mount); and it must not be
// what the command reads: a file inside the checkpoint directory (a rank file replaced by an
// export is a checkpoint lost) or one of the input files.
void checkWritableOutput(const std::string& command, const std::string& out, const std::string& checkpoint,
                         const std::vector<std::string>& inputs = {}) {
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(out, ec);
  const fs::path ckptDir = fs::weakly_canonical(checkpoint, ec);
  for (fs::path p = target.parent_path(); !ckptDir.empty() && !p.empty(); p = p.parent_path()) {
    if (p == ckptDir)
      throw ConfigError(command + ": --out " + out + " is inside the checkpoint it reads (" + checkpoint +
                        "): writing there would destroy it");
    if (p == p.root_path()) break;
  }
  for (const std::string& in : inputs)
    if (!in.empty() && fs::weakly_canonical(in, ec) == target)
      throw ConfigError(command + ": --out " + out + " is the input file " + in + ": writing it would destroy it");
  if (fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    throw ConfigError(command + ": --out " + out + " exists and is not a regular file");
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec))
    throw ConfigError(command + ": --out " + out + ": its directory " + dir.string() + " does not exist");
  const std::string probe = (dir / (".meshtrain-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw ConfigError(command + ": --out " + out + ": cannot create a file in " + dir.string() + ": " +
                      std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

template <typename F>
void rethrowingInternal(F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // (the subcommands' handler takes mt::Error only)
    throw InternalError(std::string("internal: ") + e.what());
  }
}

void exportOnnxFile(const std::string& ckpt, const std::string& out, OnnxSaveOptions::ExternalData external,
                    const Int8ExportRequest* int8) {
  ConsolidatedCheckpoint c = consolidateCheckpoint(ckpt);
  if (c.meta.identity.architecture.empty())
    throw CheckpointError(
        "export: checkpoint " + ckpt +
        " records no architecture (written by an older build): only --format h5 exports it");
  OnnxGraph g = [&] {
    if (int8) return buildInt8Model(c, ckpt, *int8);
    ParamMap params;
    for (const CheckpointParam& p : c.meta.params)
      params[p.name] = c.param(p);
    OnnxExportOptions options;
    options.source = ckpt;
    options.step = c.meta.state.step;
    return buildOnnxModel(c.meta.identity.architecture, params, options, "checkpoint " + ckpt);
  }();
  OnnxSaveOptions save;
  save.external = external;
  const double mib = static_cast<double>(g.initializerBytes()) / (1 << 20);
  g.save(out, save);
  const bool side = external == OnnxSaveOptions::ExternalData::kAlways ||
                    (external == OnnxSaveOptions::ExternalData::kAuto &&
                     g.initializerBytes() > OnnxGraph::kExternalDataThreshold);
  std::printf("exported %s to %s (ONNX opset %lld, %.1f MiB of %s weights%s)\n", ckpt.c_str(), out.c_str(),
              static_cast<long long>(g.opset()), mib, int8 ? "int8" : "f32",
              side ? (", in " + out + ".data").c_str() : "");
}

// --quantize and the calibration options (each refused without --quantize int8 and --format onnx).
std::optional<Int8ExportRequest> int8Request(std::map<std::string, std::string>& f, const std::string& format) {
  const bool calibrationFlag = f.count("--calibration") || f.count("--calibration-batches") ||
                               f.count("--calibration-batch-size") || f.count("--percentile") ||
                               f.count("--calibration-data") || f.count("--weight-type");
  if (!f.count("--quantize")) {
    if (calibrationFlag)
      throw ConfigError("export: --calibration, --calibration-batches, --calibration-batch-size, --percentile, "
                        "--calibration-data and --weight-type are options of --quantize int8");
    return std::nullopt;
  }
  if (f["--quantize"] != "int8") throw ConfigError("export: --quantize " + f["--quantize"] + ": expected int8");
  if (format != "onnx") throw ConfigError("export: --quantize int8 is an option of --format onnx");
  Int8ExportRequest r;
  if (f.count("--calibration")) {
    r.calibration = f["--calibration"];
    if (r.calibration != "minmax" && r.calibration != "percentile" && r.calibration != "qat")
      throw ConfigError("export: --calibration " + r.calibration + ": expected minmax, percentile or qat");
  }
  if (f.count("--calibration-batches"))
    r.batches = integerOption("export", "--calibration-batches", f["--calibration-batches"], 1, 1 << 20);
  if (f.count("--calibration-batch-size"))
    r.batchSize = integerOption("export", "--calibration-batch-size", f["--calibration-batch-size"], 1, 1 << 16);
  if (f.count("--percentile")) {
    if (r.calibration != "percentile")
      throw ConfigError("export: --percentile is an option of --calibration percentile");
    r.percentile = numberOption("export", "--percentile", f["--percentile"], 50.0, 100.0, /*loOpen=*/true);
  }
  if (f.count("--calibration-data")) r.data = f["--calibration-data"];
  if (f.count("--weight-type")) {
    if (f["--weight-type"] != "uint8" && f["--weight-type"] != "int8")
      throw ConfigError("export: --weight-type " + f["--weight-type"] + ": expected uint8 or int8");
    r.int8Weights = f["--weight-type"] == "int8";
  }
  if (r.calibration == "qat" && (f.count("--calibration-batches") || f.count("--calibration-batch-size") ||
                                 f.count("--calibration-data")))
    throw ConfigError("export: --calibration qat uses the checkpoint's observers: no calibration batches to give");
  return r;
}

}  // namespace

int exportCommand(const std::vector<std::string>& args) {
  auto f = parseFlags("export", args,
                      {"--checkpoint", "--out", "--format", "--external-data", "--quantize", "--calibration",
                       "--calibration-batches", "--calibration-batch-size", "--percentile", "--calibration-data",
                       "--weight-type"},
                      kExportUsage);
  const std::string ckpt = f["--checkpoint"], out = f["--out"];
  const std::string format = f.count("--format") ? f["--format"] : "h5";
  if (ckpt.empty() || out.empty())
    throw ConfigError(std::string("export: --checkpoint and --out are required\n") + kExportUsage);
  if (format != "h5" && format != "onnx")
    throw ConfigError("export: --format " + format + ": unknown format (h5 or onnx)");
  OnnxSaveOptions::ExternalData external = OnnxSaveOptions::ExternalData::kAuto;
  if (f.count("--external-data")) {
    const std::string e = f["--external-data"];
    if (format != "onnx") throw ConfigError("export: --external-data is an option of --format onnx");
    if (e == "always")
      external = OnnxSaveOptions::ExternalData::kAlways;
    else if (e == "never")
      external = OnnxSaveOptions::ExternalData::kNever;
    else if (e != "auto")
      throw ConfigError("export: --external-data " + e + ": expected auto, always or never");
  }
  const std::optional<Int8ExportRequest> int8 = int8Request(f, format);
  checkWritableOutput("export", out, ckpt, {f.count("--calibration-data") ? f.at("--calibration-data") : ""});
  rethrowingInternal([&] {  // a file already at --out is replaced only by a complete export
    if (format == "onnx") {
      exportOnnxFile(ckpt, out, external, int8 ? &*int8 : nullptr);
    } else {
      exportConsolidated(ckpt, out);
      std::printf("exported %s to %s\n", ckpt.c_str(), out.c_str());
    }
  });
  return 0;
}

// The checkpoint's values into the rebuilt model's parameters (f32, on `device`), matched by name
// and shape.
void loadCheckpointValues(Model& model, ConsolidatedCheckpoint& c, const std::string& ckpt, Device device) {
  ParamTable& table = model.params();
  table.materialize(device);
  if (static_cast<int64_t>(c.meta.params.size()) != static_cast<int64_t>(table.size()))
    throw CheckpointError("checkpoint " + ckpt + ": " + std::to_string(c.meta.params.size()) +
                          " parameters, its architecture has " + std::to_string(table.size()));
  for (const CheckpointParam& p : c.meta.params) {
    Param* q = table.find(p.name);
    if (!q || q->shape != p.shape)
      throw CheckpointError(
          "checkpoint " + ckpt + ": parameter " + p.name + " " + shapeStr(p.shape) +
          (q ? " is " + shapeStr(q->shape) + " in its architecture" : " is not in its architecture"));
    q->value.copyFrom(c.param(p));
  }
}

namespace {

struct LogitsRequest {
  std::string ckpt, out, data, split = "test";
  int64_t first = 0, count = 16, seqLen = 0;
  bool fakeQuant = false;
  std::string device = "cpu", precision = "f32";
};

// The device the forward runs on: the CPU, or GPU 0 under a runtime of its own (held for the
// command's lifetime) whose matmul precision is the requested one, as the trainer sets it.
class LogitsDevice {
 public:
  explicit LogitsDevice(const LogitsRequest& r) {
    if (r.device == "cpu") {
      if (r.precision != "f32")
        throw ConfigError("logits: --precision " + r.precision + " needs --device cuda (the CPU computes in f32)");
      return;
    }
#ifdef MT_WITH_CUDA
    if (cudaDeviceCountOrZero() == 0) throw ConfigError("logits: --device cuda: no CUDA device is visible");
    cuda_ = std::make_unique<CudaRuntime>(0);
    cuda_->setMatmulPrecision(r.precision == "bf16"  ? MatmulPrecision::kBF16
                              : r.precision == "f16" ? MatmulPrecision::kF16
                                                     : MatmulPrecision::kF32);
    device_ = cuda_->dev();
#else
    throw ConfigError("logits: --device cuda: this trainer was built without CUDA");
#endif
  }
  Device device() const { return device_; }

 private:
#ifdef MT_WITH_CUDA
  std::unique_ptr<CudaRuntime> cuda_;
#endif
  Device device_ = Device::cpu();
};

void checkRange(const LogitsRequest& r, int64_t size) {
  if (r.first >= size || r.count > size - r.first)
    throw ConfigError("logits: samples " + std::to_string(r.first) + ".." +
                      std::to_string(r.first + r.count - 1) + " are outside split '" + r.split + "' of " +
                      r.data + " (" + std::to_string(size) + " samples)");
}

void writeLogits(const LogitsRequest& r, const ConsolidatedCheckpoint& c, const Tensor& inputs,
                 const std::string& labelName, const Tensor& labels, const Tensor& logits) {
  const std::string tmp = r.out + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  try {
    H5Writer w(tmp);
    w.writeStringAttribute("/", "format", "meshtrain-logits");
    w.writeStringAttribute("/", "checkpoint", r.ckpt);
    w.writeIntAttribute("/", "step", c.meta.state.step);
    w.writeStringAttribute("/", "data", r.data);
    w.writeStringAttribute("/", "split", r.split);
    w.writeIntAttribute("/", "first", r.first);
    w.write("/inputs", inputs);
    w.write("/" + labelName, labels);
    w.write("/logits", logits);
    w.close();
    fs::rename(tmp, r.out, ec);
    if (ec) throw IoError("cannot rename " + tmp + " to " + r.out + ": " + ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

void runLogits(LogitsRequest& r) {
  const LogitsDevice dev(r);  // first: the model's GPU tensors go before the runtime does
  ConsolidatedCheckpoint c = consolidateCheckpoint(r.ckpt);
  RebuiltModel m = rebuildFromArchitecture(c.meta.identity.architecture, "checkpoint " + r.ckpt);
  std::unique_ptr<QuantizedModel> qat;
  if (r.fakeQuant) {
    if (c.meta.state.qat.empty() || m.type == "gpt")
      throw ConfigError("logits: --quantize int8: checkpoint " + r.ckpt +
                        " holds no quantization state (trained without train.qat)");
    qat = std::make_unique<QuantizedModel>(*m.model, QuantOptions{});
    qat->loadState(c.meta.state.qat, "checkpoint " + r.ckpt);
  }
  loadCheckpointValues(*m.model, c, r.ckpt, dev.device());
  if (r.data.empty()) r.data = c.meta.identity.dataPath;
  if (r.data.empty())
    throw ConfigError("logits: checkpoint " + r.ckpt + " does not name its data file: give --data");
  const H5File file = H5File::open(r.data);
  Context ctx;
  ctx.training = false;
  ctx.device = dev.device();
  Tensor inputs, labels, logits;
  ChunkCache cache;
  if (m.type == "gpt") {
    if (r.seqLen == 0) r.seqLen = m.gpt.maxT;
    if (r.seqLen > m.gpt.maxT)
      throw ConfigError("logits: --seq-len " + std::to_string(r.seqLen) + " exceeds the model's block size " +
                        std::to_string(m.gpt.maxT));
    TokenDataset ds(file, r.split, r.seqLen, 1);
    ds.limitIds(m.gpt.vocab, "the model's vocabulary");
    checkRange(r, ds.size());
    inputs = Tensor::empty({r.count, r.seqLen}, DType::kI32);
    labels = Tensor::empty({r.count, r.seqLen}, DType::kI64);
    for (int64_t i = 0; i < r.count; ++i)
      ds.read(r.first + i, inputs.data<int32_t>() + i * r.seqLen, labels.data<int64_t>() + i * r.seqLen,
              &cache);
    logits = static_cast<Gpt&>(*m.model).logits(inputs.to(ctx.device), ctx).to(Device::cpu());
  } else {
    ImageDataset ds(file, r.split, 1);
    const InputSpec s = ds.spec();
    if (s.height != m.images.height || s.width != m.images.width || s.channels != m.images.channels)
      throw DataError("logits: " + r.data + " split '" + r.split + "' holds " + std::to_string(s.height) +
                      "x" + std::to_string(s.width) + "x" + std::to_string(s.channels) +
                      " images, the model takes " + std::to_string(m.images.height) + "x" +
                      std::to_string(m.images.width) + "x" + std::to_string(m.images.channels));
    checkRange(r, ds.size());
    inputs = Tensor::empty({r.count, s.height, s.width, s.channels}, DType::kU8);
    labels = Tensor::empty({r.count}, DType::kI64);
    for (int64_t i = 0; i < r.count; ++i)
      ds.read(r.first + i, inputs.data<uint8_t>() + i * static_cast<int64_t>(ds.imageBytes()),
              labels.data<int64_t>() + i, &cache);
    logits = static_cast<Sequential&>(*m.model).logits(inputs.to(ctx.device), ctx).to(Device::cpu());
  }
  writeLogits(r, c, inputs, m.type == "gpt" ? "targets" : "labels", labels, logits);
  std::printf("logits of %s samples %lld..%lld of %s:%s written to %s\n", r.ckpt.c_str(),
              static_cast<long long>(r.first), static_cast<long long>(r.first + r.count - 1), r.data.c_str(),
              r.split.c_str(), r.out.c_str());
}

}  // namespace

int logitsCommand(const std::vector<std::string>& args) {
  auto f = parseFlags("logits", args,
                      {"--checkpoint", "--out", "--data", "--split", "--first", "--count", "--seq-len", "--quantize",
                       "--device", "--precision"},
                      kLogitsUsage);
  LogitsRequest r;
  r.ckpt = f["--checkpoint"];
  r.out = f["--out"];
  r.data = f["--data"];
  if (f.count("--split")) r.split = f["--split"];
  if (f.count("--first")) r.first = integerOption("logits", "--first", f["--first"], 0, int64_t{1} << 40);
  if (f.count("--count")) r.count = integerOption("logits", "--count", f["--count"], 1, 1 << 20);
  if (f.count("--seq-len")) r.seqLen = integerOption("logits", "--seq-len", f["--seq-len"], 1, 1 << 20);
  if (f.count("--quantize")) {
    if (f["--quantize"] != "int8") throw ConfigError("logits: --quantize " + f["--quantize"] + ": expected int8");
    r.fakeQuant = true;
  }
  if (f.count("--device")) r.device = f["--device"];
  if (f.count("--precision")) r.precision = f["--precision"];
  if (r.device != "cpu" && r.device != "cuda")
    throw ConfigError("logits: --device " + r.device + ": expected cpu or cuda\n" + kLogitsUsage);
  if (r.precision != "f32" && r.precision != "bf16" && r.precision != "f16")
    throw ConfigError("logits: --precision " + r.precision + ": expected f32, bf16 or f16\n" + kLogitsUsage);
  if (r.ckpt.empty() || r.out.empty())
    throw ConfigError(std::string("logits: --checkpoint and --out are required\n") + kLogitsUsage);
  checkWritableOutput("logits", r.out, r.ckpt, {r.data});
  rethrowingInternal([&] { runLogits(r); });
  return 0;
}

}  // namespace mt
