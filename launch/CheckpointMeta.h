#pragma once
// A checkpoint's meta.json (docs/data-format.md, "Checkpoints"): the training state, what the
// checkpoint was trained on (architecture, parameters, data), its files and their checksums.
//
// meta.json is input like any data file: parseCheckpointMeta checks every field's type and range
// and the file's checksum of itself, and refuses anything else with a CheckpointError (exit 2)
// that names the file and the key. Nothing read from it reaches a shape, an offset or a loop bound
// unchecked (tests/fuzz/fuzz_checkpoint_meta drives it with arbitrary text).

#include <cstdint>
#include <string>
#include <vector>

#include "core/Tensor.h"

namespace mt {

// Format versions this build reads. 2 added "data", "compression" and the piece index in the
// files' checksums (rank<r>.h5's /pieces, and the compressor state of data-parallel compression).
constexpr int kCheckpointVersion = 2;
constexpr int kOldestCheckpointVersion = 1;

struct TrainState {
  int64_t step = 0;       // optimizer steps completed
  int64_t loaderSeq = 0;  // batches consumed by the model
  float lossScale = 0.f;  // 0: no loss scaler
  int64_t scalerClean = 0;
  int64_t scalerSkipped = 0;  // steps the loss scaler skipped (absent in older checkpoints: 0)
  uint64_t seed = 0;
  std::string strategy = "no_shard";
  // Quantization-aware training's observer state (models/quant/QuantizedModel::stateJson, JSON
  // text, "qat" in meta.json); "" without train.qat.
  std::string qat;
  // FP8 scaling states (train.precision = fp8; core/Fp8.h): the model's state names in order, and
  // this rank's states packed as, per state, its cast count then the f32 bits of its values. On
  // save, every rank's; on load, this rank's (rank 0's on another world size: amax values are
  // per rank, as each rank scales its own activations).
  std::vector<std::string> fp8Names;
  std::vector<int64_t> fp8;
};

// What a checkpoint was trained on besides its state: a resume on another model is refused, on
// other data or another batch size warned about (launch/Checkpoint compares them).
struct RunIdentity {
  std::string architecture;  // launch/Architecture's JSON; "" unknown
  std::string dataPath, trainSplit;
  int64_t globalBatch = 0;  // 0: unknown (a version 1 checkpoint)
  std::string runDir;       // the run directory that wrote it (canonical); "" unknown (older builds)
};

struct CheckpointParam {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in the packed flat parameter vector
};

struct CheckpointFile {
  std::string name;  // rank<q>.h5
  uint32_t crc32 = 0;
  int64_t payloadBytes = 0;
};

struct CheckpointMeta {
  int version = kCheckpointVersion;
  TrainState state;
  int64_t optimizerSteps = 0;
  RunIdentity identity;
  int worldSize = 1;
  int64_t numel = 0;
  double time = 0.0;
  std::vector<std::string> stateNames;  // optimizer state buffers, /state/<name> in every file
  std::string compression;              // method whose per-rank state the files hold; "" none
  std::vector<CheckpointParam> params;
  std::vector<CheckpointFile> files;
  // "fp8": every rank's packed FP8 state (TrainState::fp8), same length for all; empty: none.
  std::vector<std::vector<int64_t>> fp8Ranks;

  // The JSON text of meta.json, with its checksum.
  std::string toJson() const;
};

uint32_t crc32Of(const void* data, size_t bytes, uint32_t crc = 0);

// Parses and checks meta.json's text; `dir` (the checkpoint) is named in every message.
CheckpointMeta parseCheckpointMeta(const std::string& text, const std::string& dir);
// <dir>/meta.json: a regular file of at most 64 MiB, then parseCheckpointMeta.
CheckpointMeta readCheckpointMeta(const std::string& dir);

}  // namespace mt
