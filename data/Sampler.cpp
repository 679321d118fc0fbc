#include "data/Sampler.h"

#include <numeric>

#include "core/Check.h"
#include "core/Random.h"

namespace mt {

std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(seed, 0x5A3D1E00ull + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

DistributedSampler::DistributedSampler(int64_t datasetSize, int rank, int worldSize, bool shuffle, uint64_t seed,
                                       bool dropLast)
    : n_(datasetSize), rank_(rank), world_(worldSize), shuffle_(shuffle), seed_(seed), dropLast_(dropLast) {
  MT_CHECK(worldSize > 0 && rank >= 0 && rank < worldSize, "rank ", rank, " of ", worldSize);
  if (dropLast_ && n_ % world_ != 0) perRank_ = n_ / world_;
  else perRank_ = (n_ + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = epochPermutation(n_, seed_, epoch);
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const int64_t total = perRank_ * world_;
  if (total > n_) {  // pad by wrapping around (several times for tiny datasets)
    const int64_t pad = total - n_;
    for (int64_t i = 0; i < pad; ++i) all.push_back(all[static_cast<size_t>(i % n_)]);
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(perRank_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace mt
