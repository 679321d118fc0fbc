#include "core/Random.h"

#include "core/Parallel.h"

namespace mt {

void Rng::seekWord(uint64_t pos) {
  // The state nextU32() would be in after returning word pos - 1: the block holding word pos is
  // buffered (counter_ is one past it) and idx_ points into it.
  counter_ = pos / 4 + 1;
  idx_ = static_cast<int>(pos % 4);
  buf_ = philox4x32(seed_, stream_, counter_ - 1);
}

void Rng::fillNormal(float* out, int64_t n, float mean, float stddev) {
  if (n <= 0) return;
  int64_t i = 0;
  if (hasSpare_) {
    out[i++] = mean + stddev * spare_;
    hasSpare_ = false;
  }
  const int64_t pairs = (n - i + 1) / 2;  // the last one may leave its sine value as the spare
  const uint64_t base = wordPosition();
  const int64_t first = i;
  parallelFor(pairs, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const uint64_t w = base + 2 * static_cast<uint64_t>(k);
      // Words w and w + 1 share a Philox block (w is even and blocks hold 4) unless base is odd.
      const Philox4 b1 = philox4x32(seed_, stream_, w / 4);
      const uint32_t w1 = b1.v[w % 4];
      const uint32_t w2 = (w + 1) % 4 != 0 ? b1.v[(w + 1) % 4] : philox4x32(seed_, stream_, (w + 1) / 4).v[0];
      float sine = 0.f;
      const float cosine = boxMuller(w1, w2, &sine);
      const int64_t o = first + 2 * k;
      out[o] = mean + stddev * cosine;
      if (o + 1 < n) out[o + 1] = mean + stddev * sine;
      else spare_ = sine, hasSpare_ = true;  // only the last pair, on one thread
    }
  });
  seekWord(base + 2 * static_cast<uint64_t>(pairs));
}

}  // namespace mt
