#include "launch/QuantizeExport.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/Log.h"
#include "data/H5File.h"
#include "data/ImageDataset.h"
#include "export/OnnxQuantize.h"
#include "launch/Architecture.h"
#include "launch/ExportCommand.h"
#include "models/quant/QuantizedModel.h"

namespace mt {

namespace {

// The trainer's f32 forward over N batches spread evenly over the split: every observer sees them.
void calibrate(Sequential& model, const RebuiltModel& m, const Int8ExportRequest& r,
               const std::string& split) {
  const H5File file = H5File::open(r.data);
  ImageDataset ds(file, split, 1);
  const InputSpec s = ds.spec();
  if (s.height != m.images.height || s.width != m.images.width || s.channels != m.images.channels)
    throw DataError("export: calibration data " + r.data + " split '" + split + "' holds " +
                    std::to_string(s.height) + "x" + std::to_string(s.width) + "x" +
                    std::to_string(s.channels) + " images, the model takes " +
                    std::to_string(m.images.height) + "x" + std::to_string(m.images.width) + "x" +
                    std::to_string(m.images.channels));
  const int64_t total = r.batches * r.batchSize;
  if (total > ds.size())
    throw ConfigError("export: --calibration-batches " + std::to_string(r.batches) +
                      " x --calibration-batch-size " + std::to_string(r.batchSize) + " = " +
                      std::to_string(total) + " images, split '" + split + "' of " + r.data + " holds " +
                      std::to_string(ds.size()));
  ChunkCache cache;
  Context ctx;
  ctx.training = false;
  for (int64_t b = 0; b < r.batches; ++b) {
    Tensor images = Tensor::empty({r.batchSize, s.height, s.width, s.channels}, DType::kU8);
    int64_t label = 0;
    for (int64_t i = 0; i < r.batchSize; ++i) {
      const int64_t index = (b * r.batchSize + i) * ds.size() / total;
      ds.read(index, images.data<uint8_t>() + i * static_cast<int64_t>(ds.imageBytes()), &label, &cache);
    }
    model.logits(images, ctx);
  }
}

std::string describe(const Int8ExportRequest& r) {
  nlohmann::json j;
  j["weights"] = r.int8Weights ? "int8 symmetric per output channel"
                               : "int8 symmetric per output channel, stored as uint8 q + 128 (zero point 128)";
  j["activations"] = "uint8 asymmetric per tensor";
  j["calibration"] = r.calibration;
  if (r.calibration != "qat") {
    j["calibration_batches"] = r.batches;
    j["calibration_batch_size"] = r.batchSize;
    j["calibration_data"] = r.data;
  }
  if (r.calibration == "percentile") j["percentile"] = r.percentile;
  return j.dump();
}

}  // namespace

OnnxGraph buildInt8Model(ConsolidatedCheckpoint& c, const std::string& ckpt, Int8ExportRequest r) {
  RebuiltModel m = rebuildFromArchitecture(c.meta.identity.architecture, "checkpoint " + ckpt);
  if (m.type != "mlp" && m.type != "cnn")
    throw ConfigError("export: --quantize int8 supports the mlp and cnn models; checkpoint " + ckpt +
                      " holds a " + m.type);
  const bool hasQat = !c.meta.state.qat.empty();
  if (r.calibration.empty()) r.calibration = hasQat ? "qat" : "minmax";
  QuantOptions q;
  if (r.calibration == "qat") {
    if (!hasQat)
      throw ConfigError(
          "export: --calibration qat: checkpoint " + ckpt +
          " holds no quantization state (trained without train.qat); use --calibration minmax or "
          "percentile");
    q.mode = QuantMode::kTrain;
  } else if (!parseObserverKind(r.calibration, &q.observer) || q.observer == ObserverKind::kEma) {
    throw ConfigError("export: --calibration " + r.calibration + ": expected minmax, percentile or qat");
  } else {
    q.mode = QuantMode::kCalibrate;
    q.percentile = r.percentile;
  }
  QuantizedModel qm(*m.model, q);
  loadCheckpointValues(*m.model, c, ckpt);
  if (r.calibration == "qat") {
    qm.loadState(c.meta.state.qat, "checkpoint " + ckpt);
  } else {
    if (r.data.empty()) r.data = c.meta.identity.dataPath;
    if (r.data.empty())
      throw ConfigError("export: checkpoint " + ckpt +
                        " does not name its data file: give --calibration-data");
    const std::string split = c.meta.identity.trainSplit.empty() ? "train" : c.meta.identity.trainSplit;
    calibrate(static_cast<Sequential&>(*m.model), m, r, split);
  }
  const std::string where = "checkpoint " + ckpt + " (--calibration " + r.calibration + ")";
  QdqHooks hooks(qm.activationParams(), where, r.int8Weights ? WeightType::kInt8 : WeightType::kUint8);
  ParamMap params;
  for (const CheckpointParam& p : c.meta.params)
    params[p.name] = c.param(p);
  OnnxExportOptions options;
  options.source = ckpt;
  options.step = c.meta.state.step;
  options.hooks = &hooks;
  OnnxGraph g = buildOnnxModel(c.meta.identity.architecture, params, options, where);
  g.addMetadata("meshtrain.quantization", describe(r));
  return g;
}

}  // namespace mt
