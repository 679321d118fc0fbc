#pragma once
// DistributedSampler semantics (as torch.utils.data.DistributedSampler): the epoch's order is a
// permutation drawn from (seed, epoch) — identical on every rank — padded by wrapping around to a
// multiple of the world size (or, with dropLast, cut down to one), and rank r takes every
// world-th index starting at r. The union over ranks of local batch k is then exactly the global
// batch k of a single-process run with the global batch size.

#include <cstdint>
#include <vector>

namespace mt {

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, bool shuffle, uint64_t seed, bool dropLast);
  // This rank's indices for an epoch.
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t samplesPerRank() const { return perRank_; }
  int64_t datasetSize() const { return n_; }

 private:
  int64_t n_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool dropLast_;
  int64_t perRank_;
};

// Fisher-Yates permutation of [0, n) from (seed, epoch) on our Philox stream, portable across
// standard libraries (std::shuffle is not).
std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace mt
