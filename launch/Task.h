#pragma once
// What a run trains on, by kind of data: both splits of the HDF5 file and the batch sources over
// them, the model the data implies, which test batches an evaluation runs, and how the progress
// reads. ImageTask (classification: mlp, cnn) and TokenTask (next-token prediction: gpt); the
// trainer, evaluator and reporter ask the task instead of branching on the model type.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/H5File.h"
#include "data/Loader.h"
#include "data/ResidentSplit.h"
#include "launch/Config.h"
#include "launch/Settings.h"
#include "models/Model.h"

namespace mt {

// One progress line's numbers (rank 0, every run.log_interval steps); steps and epochs count from 1.
struct Progress {
  int64_t step = 0, totalSteps = 0, epoch = 0, epochs = 0;
  double loss = 0.0, accuracy = 0.0, lr = 0.0;
  double samplesPerS = 0.0, stepSeconds = 0.0, waitPercent = 0.0, etaSeconds = 0.0;
  int gpus = 0;  // GPUs the throughput ran on (0 on CPU ranks)
};

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t count = 0;
  bool stopped = false;  // a stop signal ended the pass early: the figures are partial, not reported
};

class Task {
 public:
  virtual ~Task() = default;
  // Opens the train and test splits of s.dataPath for `worldSize` ranks (data.mode = memory loads
  // them), checks them against each other, and on rank 0 logs what they hold. DataError naming the
  // file and dataset on bad data.
  static std::unique_ptr<Task> open(const Settings& s, int worldSize, int rank);

  const BatchSource& trainSource() const { return *trainSource_; }
  const BatchSource& testSource() const { return *testSource_; }
  const ResidentSplit& trainSplit() const { return *trainSplit_; }
  const ResidentSplit& testSplit() const { return *testSplit_; }
  // The model of `s` for this data; gpt takes its vocabulary from the file (s.gpt is completed).
  // Configuration errors through cfg.fail.
  virtual std::unique_ptr<Model> buildModel(Settings& s, const Config& cfg) = 0;
  // What the log says of the model before it is built (gpt: " (12 blocks x 768 channels)").
  virtual std::string modelDetail() const = 0;
  // The key that sizes the model, named when it does not fit the machine.
  virtual std::string sizeKey(const Config& cfg) const = 0;
  // The architecture record of checkpoints (launch/Architecture).
  virtual std::string architecture(const Model& model) const = 0;
  // This rank's evaluation batches (test-split indices), the same at every evaluation.
  virtual std::vector<std::vector<int64_t>> evalSchedule(int rank, int worldSize, int64_t localBatch,
                                                         int64_t microBatch) const = 0;
  virtual std::string progressLine(const Progress& p) const = 0;
  // The task's own fields of a metrics.jsonl step record.
  virtual void addStepFields(const Progress& p, nlohmann::json& record) const = 0;
  // The unprefixed last line of a run, for scripts.
  virtual std::string finalLine(const EvalResult& e) const = 0;

 protected:
  explicit Task(const Settings& s);
  // The derived task's datasets and their sources (members it owns).
  void bind(const ResidentSplit& train, const ResidentSplit& test, const BatchSource& trainSource,
            const BatchSource& testSource) {
    trainSplit_ = &train, testSplit_ = &test, trainSource_ = &trainSource, testSource_ = &testSource;
  }
  Settings s_;  // a copy: buildModel completes its gpt
  H5File file_;

 private:
  const ResidentSplit *trainSplit_ = nullptr, *testSplit_ = nullptr;
  const BatchSource *trainSource_ = nullptr, *testSource_ = nullptr;
};

}  // namespace mt
