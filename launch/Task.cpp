#include "launch/Task.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/Log.h"
#include "core/Timer.h"
#include "data/ImageDataset.h"
#include "data/ImageSource.h"
#include "data/TokenDataset.h"
#include "launch/Architecture.h"
#include "launch/Metrics.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"

namespace mt {

Task::Task(const Settings& s) : s_(s), file_(H5File::open(s.dataPath, s.locking)) {}

namespace {

// Above this many parameters (about 2^53: 36 PB of f32 values) a model's sizes are a typo; its
// element counts could overflow int64 before the memory check (Trainer::setupModel) sees them.
constexpr double kMaxParameters = 9.0e15;

// A CNN's parameters in double precision, in the parts sizeKey weighs: the convolutions'
// k x k x in x out, and the fully-connected layer's input (the pooled feature map) and width.
struct CnnSize {
  double conv = 0.0, fcIn = 0.0, fc = 0.0;
  double total() const { return conv + fcIn * fc; }
};

CnnSize cnnSize(const ModelConfig& mc, const InputSpec& in) {
  CnnSize c;
  double h = static_cast<double>(in.height), w = static_cast<double>(in.width), ch = static_cast<double>(in.channels);
  for (int64_t out : mc.convChannels) {
    c.conv += static_cast<double>(mc.kernel * mc.kernel) * ch * static_cast<double>(out);
    ch = static_cast<double>(out), h = std::floor(h / 2), w = std::floor(w / 2);
  }
  c.fcIn = h * w * ch;
  c.fc = static_cast<double>(mc.fc);
  return c;
}

void refuseAbsurdSize(const Config& cfg, const std::string& key, double parameters) {
  if (parameters > kMaxParameters) {
    char n[32];
    std::snprintf(n, sizeof(n), "%.3g", parameters);
    cfg.fail(key, std::string("about ") + n + " parameters: more than any machine holds");
  }
}

// Both splits into memory (data.mode = memory), timed on rank 0.
template <typename D>
void loadSplits(D& train, D& test, int rank) {
  Stopwatch load;
  train.loadIntoMemory();
  test.loadIntoMemory();
  if (rank == 0) MT_LOG_INFO << "data in memory after " << load.elapsed() << " s";
}

class ImageTask final : public Task {
 public:
  ImageTask(const Settings& s, int worldSize, int rank)
      : Task(s), train_(file_, s.trainSplit, worldSize), test_(file_, s.testSplit, worldSize), trainSrc_(train_),
        testSrc_(test_) {
    bind(train_, test_, trainSrc_, testSrc_);
    // The two splits feed one model: their images must have one shape and the test labels fit
    // the classes the model is built for (else the first evaluation fails, at the end of an epoch).
    const InputSpec& a = train_.spec();
    const InputSpec& b = test_.spec();
    if (a.height != b.height || a.width != b.width || a.channels != b.channels)
      throw DataError("data file " + s.dataPath + ": split " + s.testSplit + " has " + std::to_string(b.height) + "x" +
                      std::to_string(b.width) + "x" + std::to_string(b.channels) + " images, split " + s.trainSplit +
                      " " + std::to_string(a.height) + "x" + std::to_string(a.width) + "x" +
                      std::to_string(a.channels));
    if (b.numClasses > a.numClasses)
      throw DataError("data file " + s.dataPath + ": split " + s.testSplit + " has labels up to " +
                      std::to_string(b.numClasses - 1) + ", split " + s.trainSplit + " only " +
                      std::to_string(a.numClasses) + " classes");
    if (rank == 0) {
      const int64_t bytes = (train_.size() + test_.size()) * static_cast<int64_t>(train_.imageBytes());
      MT_LOG_INFO << "data " << s.dataPath << ": " << train_.size() << " train and " << test_.size() << " test "
                  << a.height << "x" << a.width << "x" << a.channels << " images, " << a.numClasses << " classes"
                  << (s.dataMode == "memory" ? "; loading " + formatBytes(bytes) + " into memory"
                                             : std::string("; read from the file"));
    }
    if (s.dataMode == "memory") loadSplits(train_, test_, rank);
  }

  std::unique_ptr<Model> buildModel(Settings& s, const Config& cfg) override {
    const ModelConfig& mc = s.model;
    const InputSpec in = train_.spec();
    if (mc.type == "cnn") {
      const CnnSize c = cnnSize(mc, in);
      if (c.fcIn <= 0)
        cfg.fail("model.conv_channels", std::to_string(mc.convChannels.size()) + " pooling stages shrink a " +
                                            std::to_string(in.height) + "x" + std::to_string(in.width) +
                                            " image to nothing");
      refuseAbsurdSize(cfg, sizeKey(cfg), c.total());
    } else {
      double params = 0.0, width = static_cast<double>(in.height * in.width * in.channels);
      for (int64_t h : mc.hidden) params += (width + 1.0) * static_cast<double>(h), width = static_cast<double>(h);
      refuseAbsurdSize(cfg, sizeKey(cfg), params);
    }
    return buildImageModel(mc, in);
  }
  std::string modelDetail() const override { return ""; }
  // mlp: its widths; cnn: the convolutions' channels or the fully-connected width, whichever is
  // the larger factor of the parameters (the fc layer's input, the flattened feature map, against
  // model.fc; or the k x k x in x out of the convolutions when they hold more than the fc layer).
  std::string sizeKey(const Config&) const override {
    if (s_.model.type != "cnn") return "model.hidden";
    const CnnSize c = cnnSize(s_.model, train_.spec());
    return c.fcIn * c.fc > c.conv && c.fc > c.fcIn ? "model.fc" : "model.conv_channels";
  }
  std::string architecture(const Model& model) const override {
    const InputSpec images = train_.spec();
    return describeArchitecture(model, &images, nullptr);
  }

  // Rank r evaluates test examples r, r+W, ...: every example exactly once over all ranks, in
  // batches of this rank's share of train.eval_batch_size.
  std::vector<std::vector<int64_t>> evalSchedule(int rank, int worldSize, int64_t, int64_t) const override {
    const int64_t localEval = std::max<int64_t>(1, s_.evalBatch / worldSize);
    std::vector<std::vector<int64_t>> batches;
    for (int64_t i = rank; i < test_.size(); i += worldSize) {
      if (batches.empty() || static_cast<int64_t>(batches.back().size()) == localEval) batches.emplace_back();
      batches.back().push_back(i);
    }
    return batches;
  }

  std::string progressLine(const Progress& p) const override {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "step %lld/%lld epoch %lld/%lld loss %.4f acc %.3f lr %.3e samples/s %.0f data-wait %.1f%% ETA %s",
                  static_cast<long long>(p.step), static_cast<long long>(p.totalSteps),
                  static_cast<long long>(p.epoch), static_cast<long long>(p.epochs), p.loss, p.accuracy, p.lr,
                  p.samplesPerS, p.waitPercent, formatDuration(p.etaSeconds).c_str());
    return line;
  }
  void addStepFields(const Progress&, nlohmann::json&) const override {}
  std::string finalLine(const EvalResult& e) const override {
    char line[96];
    std::snprintf(line, sizeof(line), "final test_accuracy=%.4f test_loss=%.4f", e.accuracy, e.loss);
    return line;
  }

 private:
  ImageDataset train_, test_;
  ImageSource trainSrc_, testSrc_;
};

class TokenTask final : public Task {
 public:
  TokenTask(const Settings& s, int worldSize, int rank)
      : Task(s), train_(file_, s.trainSplit, s.gpt.maxT, worldSize), test_(file_, s.testSplit, s.gpt.maxT, worldSize),
        trainSrc_(train_), testSrc_(test_) {
    bind(train_, test_, trainSrc_, testSrc_);
    if (rank == 0)
      MT_LOG_INFO << "data " << s.dataPath << ": " << train_.numTokens() << " train tokens (" << train_.size()
                  << " windows of " << s.gpt.maxT << "), " << test_.numTokens() << " test tokens, vocabulary "
                  << train_.vocabSize()
                  << (s.dataMode == "memory" ? "; loading both splits into memory" : "; read from the file");
    if (s.dataMode == "memory") loadSplits(train_, test_, rank);
  }

  std::unique_ptr<Model> buildModel(Settings& s, const Config& cfg) override {
    s.gpt = s.gptForData(train_.vocabSize(), cfg);
    s_.gpt = s.gpt;
    // The test split's own vocabulary (its attribute, or max id + 1) may exceed the model's.
    test_.limitIds(s.gpt.vocab,
                   "the model's vocabulary: model.vocab_size, else the " + s.trainSplit + " split's");
    refuseAbsurdSize(cfg, sizeKey(cfg), s.gpt.numParamsEstimate());
    return std::make_unique<Gpt>(s.gpt);
  }
  std::string modelDetail() const override {
    return " (" + std::to_string(s_.gpt.layers) + " blocks x " + std::to_string(s_.gpt.channels) +
           " channels, vocabulary " + std::to_string(s_.gpt.vocab) + ")";
  }
  // The key behind most of the parameters: the vocabulary (the data file's, or model.vocab_size)
  // when the embedding outweighs the blocks (12 C^2 each), else the width or depth set over the
  // preset, else the preset.
  std::string sizeKey(const Config& cfg) const override {
    const double C = static_cast<double>(s_.gpt.channels);
    if (static_cast<double>(s_.gpt.paddedVocab) * C > 12.0 * C * C * static_cast<double>(s_.gpt.layers))
      return "model.vocab_size";
    if (cfg.i64("model.channels") > 0) return "model.channels";
    if (cfg.i64("model.layers") > 0) return "model.layers";
    return "model.gpt_preset";
  }
  std::string architecture(const Model& model) const override {
    const GptConfig gpt = s_.gpt;
    return describeArchitecture(model, nullptr, &gpt);
  }

  // A fixed prefix of the test split: train.eval_batches of this rank's step rows (at most what the
  // split holds per rank), in micro-batches (the activation memory of one).
  std::vector<std::vector<int64_t>> evalSchedule(int rank, int worldSize, int64_t localBatch,
                                                 int64_t microBatch) const override {
    const int64_t perRank = std::max<int64_t>(1, test_.size() / worldSize);
    const int64_t batches =
        std::min<int64_t>(s_.evalBatches, std::max<int64_t>(1, perRank / localBatch)) * s_.gradAccum;
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(batches));
    for (int64_t k = 0; k < batches; ++k)
      for (int64_t i = 0; i < microBatch; ++i)
        out[static_cast<size_t>(k)].push_back((rank + worldSize * (k * microBatch + i)) % test_.size());
    return out;
  }

  std::string progressLine(const Progress& p) const override {
    double tps = 0, mfu = 0;
    throughput(p, &tps, &mfu);
    char line[320];
    std::snprintf(line, sizeof(line),
                  "step %lld/%lld epoch %lld/%lld loss %.4f lr %.3e tokens/s %.0f MFU %.1f%% step %.1f ms data-wait "
                  "%.1f%% ETA %s",
                  static_cast<long long>(p.step), static_cast<long long>(p.totalSteps),
                  static_cast<long long>(p.epoch), static_cast<long long>(p.epochs), p.loss, p.lr, tps, 100.0 * mfu,
                  1000.0 * p.stepSeconds, p.waitPercent, formatDuration(p.etaSeconds).c_str());
    return line;
  }
  void addStepFields(const Progress& p, nlohmann::json& record) const override {
    double tps = 0, mfu = 0;
    throughput(p, &tps, &mfu);
    record["tokens_per_s"] = tps;
    record["mfu"] = mfu;
  }
  std::string finalLine(const EvalResult& e) const override {
    char line[64];
    std::snprintf(line, sizeof(line), "final test_loss=%.4f", e.loss);
    return line;
  }

 private:
  // Tokens per second, and the model FLOP utilisation of the GPUs (of one CPU process on CPU ranks).
  void throughput(const Progress& p, double* tps, double* mfu) const {
    const int64_t T = s_.gpt.maxT;
    *tps = p.samplesPerS * static_cast<double>(T);
    const double gpus = p.gpus > 0 ? static_cast<double>(p.gpus) : 1.0;
    *mfu = *tps * s_.gpt.flopsPerToken(T) / (s_.peakFlops * gpus);
  }

  TokenDataset train_, test_;
  TokenSource trainSrc_, testSrc_;
};

}  // namespace

std::unique_ptr<Task> Task::open(const Settings& s, int worldSize, int rank) {
  if (s.model.type == "gpt") return std::make_unique<TokenTask>(s, worldSize, rank);
  return std::make_unique<ImageTask>(s, worldSize, rank);
}

}  // namespace mt
