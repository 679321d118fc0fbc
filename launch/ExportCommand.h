#pragma once
// The subcommands that read a checkpoint alone (no MPI, not collective):
//   trainer export --checkpoint DIR --out FILE [--format h5|onnx] [--external-data auto|always|never]
//     h5 (default): every parameter whole and the architecture record (launch/CheckpointFile);
//     onnx: the model as an ONNX model (export/OnnxExport: opset 17, inputs and outputs there),
//     written to a temporary name and renamed like the h5 file. With --quantize int8 (mlp, cnn) an
//     int8 QDQ model, calibrated on training batches or from a train.qat checkpoint's observers
//     (launch/QuantizeExport.h has the options).
//   trainer logits --checkpoint DIR --out FILE.h5 [--data FILE.h5] [--split test] [--first I]
//                  [--count N] [--seq-len T]
//     the trainer's own inference forward (the model rebuilt from the checkpoint's architecture by
//     the trainer's builders, on the CPU in f32) on N samples of a split: /inputs (u8 images
//     [N, H, W, C] or i32 tokens [N, T]), /labels or /targets, /logits (f32 [N, classes] or
//     [N, T, vocab]) — the reference an exported model is checked against. --quantize int8: the
//     int8 fake-quantized forward of a train.qat checkpoint (the QAT export's reference).
// Bad input (a checkpoint without an architecture record, an --out that cannot be written, an
// unknown --format, a sample range outside the split) is a ConfigError / CheckpointError naming it:
// exit 2.

#include <string>
#include <vector>

#include "launch/CheckpointFile.h"
#include "models/Model.h"

namespace mt {

extern const char* const kExportUsage;
extern const char* const kLogitsUsage;
int exportCommand(const std::vector<std::string>& args);
int logitsCommand(const std::vector<std::string>& args);
// The checkpoint's values into a model rebuilt from its architecture (parameters registered, on
// `device`: the CPU by default), matched by name and shape (a CheckpointError naming `ckpt`
// otherwise).
void loadCheckpointValues(Model& model, ConsolidatedCheckpoint& c, const std::string& ckpt,
                          Device device = Device::cpu());

}  // namespace mt
