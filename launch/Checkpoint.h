#pragma once
// Checkpoints: <dir>/step_<N>/ with one HDF5 file per rank (launch/CheckpointFile.h) and a
// meta.json (launch/CheckpointMeta.h).
//
// Every rank writes the parameters and optimizer state it owns as pieces of the model's global
// flat parameter vector (offset, length): with data parallelism rank r writes its 1/W slice of the
// replicated state, with sharding its shards. Any world size can therefore load any checkpoint:
// each rank reads the global ranges its own segments need from whichever files hold them. Each
// rank also writes its compressor state (error feedback, PowerSGD's Q), which a run of the same
// world size takes back, so a resumed compressed run continues as the uninterrupted one.
//
// Atomic and verified: files go to step_<N>.tmp-<id>/, are fsync-ed, rank 0 adds meta.json with a
// CRC32 of every file and of itself, fsyncs and renames the directory; a crash or a full disk leaves
// the previous checkpoints untouched. Resume takes the newest checkpoint whose files all match their
// checksums — every rank checking its share of the files at once (file q on rank q mod W), each file
// read once — and falls back, with a warning, past corrupt ones. A checkpoint of another model
// (architecture or any parameter's shape) is refused naming the differences; other data or another
// batch size is warned about. The newest `keep` are kept.
//
// All functions are collective over `world` and fail the same way on every rank (launch/Agreement).
// Waiting for the other ranks is bounded by checkpoint.timeout_s, not by the training step's
// dist.timeout_s: reading or writing a large checkpoint takes longer than a step (a lost rank is
// still named by the health monitor within seconds).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "core/ParamTable.h"
#include "launch/Agreement.h"
#include "launch/CheckpointFile.h"
#include "launch/CheckpointMeta.h"
#include "launch/Parallelism.h"

namespace mt {

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int keep, Communicator& world, std::chrono::milliseconds ioTimeout);
  ~CheckpointManager();
  const std::string& dir() const { return dir_; }
  // What this run trains (architecture, data, batch size): recorded in every checkpoint, and
  // compared with a checkpoint's on load.
  void setIdentity(RunIdentity identity);

  // Writes step st.step (rank roles and compressor state from `par`) and returns its directory; a
  // second call for the step just written (a stop landing on a checkpoint.interval step) returns
  // it without writing again. Throws IoError naming the path (disk full, ...) on every rank.
  std::string save(const TrainState& state, Parallelism& par, const ParamTable& table);
  // Newest valid checkpoint, or "" when there is none; corrupt ones are skipped with a warning.
  // Throws CheckpointError (on every rank) when there are checkpoints and none is usable.
  std::string findLatestValid();
  // Rank 0 creates the directory now, so an unusable checkpoint.dir is a setup error (every
  // rank throws ConfigError naming it) rather than a failure at the first save.
  void prepare();
  // Restores this rank's segments and compressor state; `path` from findLatestValid() (verified
  // there) or given by the user (verified here). CheckpointError naming the differences when it
  // holds another model.
  TrainState load(const std::string& path, Parallelism& par, const ParamTable& table);

 private:
  Communicator& control() { return control_ ? *control_ : world_; }
  std::optional<AgreedFailure> verifyShare(const std::string& path, CheckpointMeta* meta);
  std::string makeTmpDir(const std::string& finalDir);
  RankFileContent contentOf(Parallelism& par, int64_t modelNumel) const;
  CheckpointMeta metaOf(const TrainState& st, Parallelism& par, const ParamTable& table,
                        const std::pair<uint32_t, int64_t>& mine, bool compressorState);
  void publish(const std::string& tmpDir, const std::string& finalDir, const CheckpointMeta& meta);
  void prune();
  std::vector<std::string> candidates();
  void checkCompatible(const std::string& path, const CheckpointMeta& meta, const ParamTable& table,
                       Optimizer& opt) const;
  void warnAboutDifferences(const std::string& path, const CheckpointMeta& meta) const;
  void readState(const std::string& path, const CheckpointMeta& meta, Optimizer& opt);
  void restoreCompression(const std::string& path, const CheckpointMeta& meta, BucketReducer* reducer);

  std::string dir_;
  RunIdentity identity_;
  int keep_;
  Communicator& world_;
  std::unique_ptr<Communicator> control_;  // NCCL worlds: an MPI communicator with ioTimeout
  std::chrono::milliseconds timeout_;
  std::string verified_;  // the checkpoint findLatestValid() verified, and its meta
  CheckpointMeta verifiedMeta_;
  int64_t lastSavedStep_ = -1;
};

}  // namespace mt
