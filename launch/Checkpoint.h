#pragma once
// Checkpoints: <dir>/step_<N>/ with one HDF5 file per rank and a meta.json.
//
// Every rank writes the parameters and optimizer state it owns as pieces of the model's global
// flat parameter vector (offset, length): with data parallelism rank r writes its 1/W slice of the
// replicated state, with sharding its shards. Any world size can therefore load any checkpoint:
// each rank reads the global ranges its own segments need from whichever files hold them.
//
// Atomic and verified: files go to step_<N>.tmp-<id>/, are fsync-ed, rank 0 adds meta.json with a
// CRC32 of every file's payload, fsyncs and renames the directory; a crash or a full disk leaves
// the previous checkpoints untouched. Resume takes the newest checkpoint whose files all match their
// checksums and falls back, with a warning, past corrupt ones. The newest `keep` are kept.
// All functions are collective over `world` and fail the same way on every rank.

#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "core/ParamTable.h"
#include "core/optim/Optimizer.h"

namespace mt {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  int64_t loaderSeq = 0;     // batches consumed by the model
  float lossScale = 0.f;     // 0: no loss scaler
  int64_t scalerClean = 0;
  uint64_t seed = 0;
  std::string strategy = "no_shard";
};

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int keep, Communicator& world);
  const std::string& dir() const { return dir_; }

  // replicated: every rank holds the same optimizer (data parallelism), so each writes a slice.
  // Returns the checkpoint's directory. Throws IoError naming the path (disk full, ...).
  // writes = false: this rank's state is a copy of another's (hybrid sharding replicas).
  // `table` names the parameters in meta.json (so a checkpoint can be exported without the model).
  std::string save(const TrainState& state, Optimizer& opt, const ParamTable& table, bool replicated,
                   bool writes = true);
  // Newest valid checkpoint, or "" when there is none; corrupt ones are skipped with a warning.
  // Throws CheckpointError (on every rank) when there are checkpoints and none is usable.
  std::string findLatestValid();
  // Rank 0 creates the directory now, so an unusable checkpoint.dir is a setup error (every
  // rank throws ConfigError naming it) rather than a failure at the first save.
  void prepare();
  // Restores this rank's segments; `path` from findLatestValid() or given by the user.
  TrainState load(const std::string& path, Optimizer& opt, int64_t modelNumel);
  // Throws CheckpointError naming the file when the checkpoint is not usable.
  static void verify(const std::string& path, int64_t modelNumel);
  // One HDF5 file with every parameter whole (/params/<name>, f32) from a checkpoint of any
  // world size and strategy. Not collective.
  static void exportConsolidated(const std::string& path, const std::string& out);
  // The model's architecture (launch/Architecture.h, JSON), recorded in every checkpoint from now.
  void setArchitecture(std::string json) { architecture_ = std::move(json); }

 private:
  static void verifyMeta(const std::string& path, int64_t modelNumel);
  std::string dir_;
  std::string architecture_;
  int keep_;
  Communicator& world_;
};

uint32_t crc32Of(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace mt
