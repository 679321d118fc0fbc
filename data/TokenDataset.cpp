#include "data/TokenDataset.h"

#include <algorithm>

namespace mt {

namespace {
[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError("data file " + file + ": " + what); }

int64_t widen(const char* p, const std::string& type) {
  if (type == "u16") return *reinterpret_cast<const uint16_t*>(p);
  if (type == "u32") return *reinterpret_cast<const uint32_t*>(p);
  if (type == "i32") return *reinterpret_cast<const int32_t*>(p);
  return *reinterpret_cast<const uint8_t*>(p);
}
}  // namespace

TokenDataset::TokenDataset(const H5File& file, const std::string& split, int64_t seqLen, int64_t minSamples)
    : file_(file.path()), split_(split), T_(seqLen) {
  const std::string name = "/" + split + "/tokens";
  H5DatasetInfo info = file.describe(name);
  if (info.type != "u8" && info.type != "u16" && info.type != "u32" && info.type != "i32")
    bad(file_, "dataset " + name + " has type " + info.type + ", expected u16, u32, i32 or u8 token ids");
  if (info.shape.size() != 1) bad(file_, "dataset " + name + " has shape " + shapeStr(info.shape) + ", expected [N]");
  type_ = info.type;
  tokens_ = info.shape[0];
  samples_ = tokens_ > T_ ? (tokens_ - 1) / T_ : 0;
  if (samples_ < std::max<int64_t>(1, minSamples))
    bad(file_, "dataset " + name + " has " + std::to_string(tokens_) + " tokens: " + std::to_string(samples_) +
                   " windows of " + std::to_string(T_ + 1) + ", fewer than the " + std::to_string(minSamples) +
                   " ranks that each need one");
  reader_ = std::make_unique<RowReader>(file, std::move(info));
  const std::string gap = reader_->storageGap();
  if (!gap.empty())
    bad(file_, "dataset " + name + " declares " + std::to_string(tokens_) + " tokens but " + gap +
                   " (truncated or incompletely written file)");
  vocab_ = file.readCountAttribute(name, "vocab_size", kMaxIdCount);
  if (vocab_ > 0) {
    idLimit_ = vocab_;
    idLimitWhy_ = "its vocab_size attribute";
  } else {
    loadIntoMemory();  // every id checked against int32 on the way
    vocab_ = 1 + *std::max_element(mem_.begin(), mem_.end());
  }
}

void TokenDataset::checkId(int64_t index, int64_t id) const {
  if (id < 0 || id >= idLimit_)
    bad(file_, "dataset /" + split_ + "/tokens[" + std::to_string(index) + "] = " + std::to_string(id) +
                   " is outside [0, " + std::to_string(idLimit_) + ") (" + idLimitWhy_ + ")");
}

void TokenDataset::limitIds(int64_t limit, const std::string& why) {
  if (limit >= idLimit_) return;
  idLimit_ = limit;
  idLimitWhy_ = why;
  for (size_t i = 0; i < mem_.size(); ++i)
    checkId(static_cast<int64_t>(i), mem_[i]);
}

void TokenDataset::loadIntoMemory() {
  if (!mem_.empty()) return;
  std::vector<char> raw(static_cast<size_t>(tokens_) * reader_->rowBytes());
  reader_->readRows(0, tokens_, raw.data());
  mem_.resize(static_cast<size_t>(tokens_));
  for (int64_t i = 0; i < tokens_; ++i) {
    const int64_t id = widen(raw.data() + i * reader_->rowBytes(), type_);
    checkId(i, id);  // before the cast: a u32 id of 2^31 or more would turn negative
    mem_[static_cast<size_t>(i)] = static_cast<int32_t>(id);
  }
}

void TokenDataset::read(int64_t index, int32_t* inputs, int64_t* targets, ChunkCache* cache) const {
  const int64_t start = index * T_;
  std::vector<int32_t> window(static_cast<size_t>(T_ + 1));
  if (!mem_.empty()) {
    std::copy(mem_.begin() + start, mem_.begin() + start + T_ + 1, window.begin());
  } else {
    std::vector<char> raw(static_cast<size_t>(T_ + 1) * reader_->rowBytes());
    reader_->readRows(start, T_ + 1, raw.data(), cache);
    // Streamed ids are checked as their window is read (a scan at open would read the whole file).
    for (int64_t i = 0; i <= T_; ++i) {
      const int64_t id = widen(raw.data() + i * reader_->rowBytes(), type_);
      checkId(start + i, id);
      window[static_cast<size_t>(i)] = static_cast<int32_t>(id);
    }
  }
  for (int64_t i = 0; i < T_; ++i) {
    inputs[i] = window[static_cast<size_t>(i)];
    targets[i] = window[static_cast<size_t>(i + 1)];
  }
}

Batch TokenSource::collate(const std::vector<int64_t>& indices, ChunkCache* cache, Allocator& host) const {
  const int64_t B = static_cast<int64_t>(indices.size()), T = ds_.seqLen();
  Batch b;
  b.inputs = Tensor::empty({B, T}, DType::kI32, host);
  b.targets = Tensor::empty({B, T}, DType::kI64, host);
  for (int64_t i = 0; i < B; ++i)
    ds_.read(indices[static_cast<size_t>(i)], b.inputs.data<int32_t>() + i * T, b.targets.data<int64_t>() + i * T, cache);
  return b;
}

ResidentData TokenDataset::resident() const {
  if (!inMemory())
    throw ConfigError("data.feed = device needs data.mode = memory (the split is loaded once, then copied)");
  ResidentData r;
  r.tokens = Tensor::fromBlob(const_cast<int32_t*>(mem_.data()), {static_cast<int64_t>(mem_.size())}, DType::kI32);
  r.window = T_;
  return r;
}

}  // namespace mt
