#pragma once
// DistributedSampler semantics (as torch.utils.data.DistributedSampler): the epoch's order is a
// permutation drawn from (seed, epoch) — identical on every rank — padded by wrapping around to a
// multiple of the world size (or, with dropLast, cut down to one), and rank r takes every
// world-th index starting at r. The union over ranks of local batch k is then exactly the global
// batch k of a single-process run with the global batch size.
// Memory: up to kMaterializeMax samples the epoch's permutation is a Fisher-Yates array (8 bytes per
// sample); above, a keyed Feistel bijection of [0, n) (cycle-walking over the next power of four)
// gives any position's sample in O(1) with no per-sample state, so a file declaring 1e9 samples
// costs nothing until it is read.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mt {

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, bool shuffle, uint64_t seed, bool dropLast);
  // This rank's indices for an epoch (all of them: for tests and small datasets).
  std::vector<int64_t> indices(int64_t epoch) const;
  // This rank's indices [lo, hi) of an epoch, without building the others.
  std::vector<int64_t> indices(int64_t epoch, int64_t lo, int64_t hi) const;
  static constexpr int64_t kMaterializeMax = int64_t{1} << 20;  // 8 MiB per cached epoch
  int64_t samplesPerRank() const { return perRank_; }
  int64_t datasetSize() const { return n_; }

 private:
  int64_t n_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool dropLast_;
  int64_t perRank_;
  // The global position's sample (position < perRank * world, padding wrapped around).
  int64_t sampleAt(int64_t epoch, int64_t position, const std::vector<int64_t>* perm) const;
  // The Fisher-Yates permutations of the newest epochs asked for (small datasets only; loader
  // workers run at most one epoch ahead of the consumer).
  mutable std::mutex permMutex_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> perms_;
};

// A keyed bijection of [0, n) from (seed, epoch): Feistel rounds on Philox over the smallest power
// of four >= n, cycle-walked into range. O(1) memory; for datasets too large to shuffle an array.
int64_t feistelPermute(int64_t i, int64_t n, uint64_t seed, int64_t epoch);

// Fisher-Yates permutation of [0, n) from (seed, epoch) on our Philox stream, portable across
// standard libraries (std::shuffle is not).
std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace mt
