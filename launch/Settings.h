#pragma once
// The typed, validated form of a Config. Every key is parsed and checked here, before any file is
// opened or any rank talks to another, so a bad value is reported first and identically on every
// rank. Checks that need the data (e.g. the CNN's pooling against the image size) come later.

#include <chrono>
#include <string>

#include "comm/Compression.h"
#include "comm/DataParallel.h"
#include "data/DeviceFeed.h"
#include "data/H5File.h"
#include "data/Loader.h"
#include "launch/Config.h"
#include "sharding/ShardedEngine.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"
#include "core/optim/LrSchedule.h"
#include "core/optim/Optimizer.h"

namespace mt {

struct Settings {
  // run
  std::string runName, runDir;  // runDir = <run.dir>/<run.name>
  int lockStaleS = 300;         // run.lock_stale_s (launch/RunDirectory.h)
  uint64_t seed = 0;
  int64_t logInterval = 100;
  int64_t profileFrom = 0, profileSteps = 1;  // run.profile_from (1-based; 0 = off), run.profile_steps
  bool trace = false;
  // model
  ModelConfig model;
  GptConfig gpt;  // model.type = gpt
  // data
  std::string dataPath, trainSplit, testSplit, dataMode;
  FeedMode feed = FeedMode::kPinned;
  FileLocking locking = FileLocking::kAuto;
  LoaderOptions loader;  // batchSize is filled in per rank
  // train
  int64_t epochs = 0, maxSteps = 0, globalBatch = 0, evalBatch = 0, evalInterval = 0;
  int64_t gradAccum = 1;                                  // micro-batches per optimizer step
  GradLifetime gradLifetime = GradLifetime::kPersistent;  // train.gradient_buffers, auto resolved (no_shard)
  std::string device = "cpu";
  std::string precision = "f32";
  double lossScaleInit = 65536.0;         // f16's loss scaler (train.loss_scale_*)
  int64_t lossScaleGrowthInterval = 2000;
  int64_t memoryCapMb = 0;
  float gradClip = 0.f;
  int64_t divergenceSteps = 3;  // consecutive non-finite losses that end the run (exit 4)
  int64_t evalBatches = 20;
  double peakFlops = 989e12;
  // quantization-aware training (models/quant): int8 fake quantization of every linear / conv2d
  bool qat = false;
  std::string qatObserver = "minmax";  // minmax | ema
  int64_t qatObserveSteps = 200;       // observers update during the first N optimizer steps
  // optim + schedule (totalSteps filled in once the data is known)
  OptimConfig optim;
  LrSchedule schedule;
  // dist
  std::string backend = "auto";
  DataParallelOptions dp;
  std::chrono::seconds timeout{300};
  bool fingerprint = false, healthMonitor = true;
  CompressionOptions compression;
  // sharding
  ShardingOptions sharding;
  // checkpoint
  std::string checkpointDir, resume = "auto";
  int64_t checkpointInterval = 0, checkpointKeep = 3;
  bool checkpointAtExit = true;
  std::chrono::seconds checkpointTimeout{1800};  // waits while checkpoints are written or read
  // topo
  std::string topoFile, profile;
  bool hierarchical = false, bindCpus = true, bindNic = false, topoReport = false;
  int nodeRanks = 0;

  static Settings fromConfig(const Config& cfg);
  // The GPT configuration for a token file of vocabulary `dataVocab`: model.vocab_size 0 takes
  // it, model.padded_vocab 0 the next multiple of 128; ConfigError when the data holds ids
  // beyond the vocabulary or the padding is smaller than it.
  GptConfig gptForData(int64_t dataVocab, const Config& cfg) const;
};

}  // namespace mt
