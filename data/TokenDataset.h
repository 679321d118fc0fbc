#pragma once
// A token stream of a meshtrain HDF5 file (docs/data-format.md):
//   /<split>/tokens       1-D, u8/u16/u32/i32 (token ids)
//   /<split>/doc_offsets  1-D i64, optional: where each document starts (informative)
// Sample i is the window tokens[i*T, i*T + T + 1): inputs its first T tokens, targets its last T
// (next-token prediction). Validated at open like the image datasets: a DataError naming the file
// and dataset for a missing dataset, a wrong type or rank, too few tokens for one sample per rank,
// or a vocab_size attribute that is not an integer in [1, 2^31 - 1]. Every id is checked against
// the vocabulary (the attribute, else the int32 range) when it is read: all of them at once in
// memory mode, a window at a time when streamed; a bad one is a DataError naming the file, the
// dataset, the index and the id.

#include <memory>
#include <string>

#include "data/H5File.h"
#include "data/Loader.h"
#include "data/ResidentSplit.h"
#include "data/RowReader.h"

namespace mt {

class TokenDataset final : public ResidentSplit {
 public:
  TokenDataset(const H5File& file, const std::string& split, int64_t seqLen, int64_t minSamples);
  int64_t size() const { return samples_; }          // windows
  int64_t numTokens() const { return tokens_; }
  int64_t seqLen() const { return T_; }
  int64_t vocabSize() const { return vocab_; }       // from the vocab_size attribute, else max id + 1
  // inputs [T] and targets [T] of window `index`.
  void read(int64_t index, int32_t* inputs, int64_t* targets, ChunkCache* cache) const;
  void loadIntoMemory();
  bool inMemory() const { return !mem_.empty(); }
  const std::vector<int32_t>& memoryTokens() const { return mem_; }  // after loadIntoMemory
  // The token stream i32 in memory, windows of seqLen() (after loadIntoMemory).
  ResidentData resident() const override;
  // Ids must also be below `limit` (the model's vocabulary, when this split's own is larger): the
  // tokens in memory are checked now, streamed ones as they are read; `why` names the limit.
  void limitIds(int64_t limit, const std::string& why);

 private:
  std::string file_, split_;
  void checkId(int64_t index, int64_t id) const;  // a DataError naming file, dataset, index and id
  int64_t T_ = 0, tokens_ = 0, samples_ = 0, vocab_ = 0;
  int64_t idLimit_ = kMaxIdCount;  // ids must be in [0, idLimit_)
  std::string idLimitWhy_ = "token ids are int32";
  std::unique_ptr<RowReader> reader_;
  std::string type_;
  std::vector<int32_t> mem_;
};

class TokenSource : public BatchSource {
 public:
  explicit TokenSource(const TokenDataset& ds) : ds_(ds) {}
  int64_t size() const override { return ds_.size(); }
  Batch collate(const std::vector<int64_t>& indices, ChunkCache* cache, Allocator& host) const override;

 private:
  const TokenDataset& ds_;
};

}  // namespace mt
