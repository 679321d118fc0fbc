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

int64_t feistelPermute(int64_t i, int64_t n, uint64_t seed, int64_t epoch) {
  int bits = 2;
  while ((int64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const uint64_t key = seed ^ 0x9E3779B97F4A7C15ull;
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle-walking: at most a few rounds, the domain is < 4n
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const Philox4 f = philox4x32(key, (static_cast<uint64_t>(epoch) << 8) | round, r);
      const uint64_t nl = r;
      r = (l ^ ((static_cast<uint64_t>(f.v[0]) | (static_cast<uint64_t>(f.v[1]) << 32)) & mask)) & mask;
      l = nl;
    }
    x = (l << half) | r;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

int64_t DistributedSampler::sampleAt(int64_t epoch, int64_t position, const std::vector<int64_t>* perm) const {
  const int64_t pos = position < n_ ? position : (position - n_) % n_;  // padding wraps around
  if (!shuffle_) return pos;
  return perm ? (*perm)[static_cast<size_t>(pos)] : feistelPermute(pos, n_, seed_, epoch);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch, int64_t lo, int64_t hi) const {
  MT_CHECK(lo >= 0 && lo <= hi && hi <= perRank_, "sampler range [", lo, ", ", hi, ") of ", perRank_);
  std::shared_ptr<const std::vector<int64_t>> perm;
  if (shuffle_ && n_ <= kMaterializeMax) {
    std::lock_guard<std::mutex> lock(permMutex_);
    auto it = perms_.find(epoch);
    if (it == perms_.end()) {
      it = perms_.emplace(epoch, std::make_shared<const std::vector<int64_t>>(epochPermutation(n_, seed_, epoch))).first;
      while (perms_.size() > 3) perms_.erase(perms_.begin());
    }
    perm = it->second;
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(hi - lo));
  for (int64_t i = lo; i < hi; ++i) out.push_back(sampleAt(epoch, rank_ + i * world_, perm.get()));
  return out;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const { return indices(epoch, 0, perRank_); }

}  // namespace mt
