#pragma once
// `trainer export --format onnx --quantize int8`: a checkpoint's model as an int8 QDQ ONNX model
// (export/OnnxQuantize.h) with its activation ranges from
//   --calibration minmax|percentile   post-training calibration: the trainer's own f32 forward
//                                     (CPU) over --calibration-batches N batches of
//                                     --calibration-batch-size B images of the checkpoint's training
//                                     split, spread evenly over it, observed at every quantized
//                                     layer (models/quant/Observer.h; percentile: --percentile P)
//   --calibration qat                 the observers a train.qat run checkpointed (its default)
// Weights are quantized per output channel from the checkpoint's values either way, stored as
// --weight-type uint8 (q + 128, zero point 128: exact on every x86 CPU; the default) or int8 (zero
// point 0: ORT's uint8 x int8 kernels, exact only on CPUs with VNNI). mlp and cnn
// only (GPT has no int8 path): anything else, or bad options, is a ConfigError naming them, exit 2.

#include <cstdint>
#include <string>

#include "export/OnnxGraph.h"
#include "launch/CheckpointFile.h"

namespace mt {

struct Int8ExportRequest {
  std::string calibration;  // minmax | percentile | qat; "" = qat for a QAT checkpoint, else minmax
  int64_t batches = 8;
  int64_t batchSize = 128;
  double percentile = 99.99;
  std::string data;  // the calibration data file; "" = the one the checkpoint trained on
  bool int8Weights = false;  // --weight-type int8 (default uint8: export/OnnxQuantize.h says why)
};

// The calibrated model (mutates nothing of `c` but reads its parameters).
OnnxGraph buildInt8Model(ConsolidatedCheckpoint& c, const std::string& ckpt, Int8ExportRequest r);

}  // namespace mt
