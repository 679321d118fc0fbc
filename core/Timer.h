#pragma once
#include <chrono>
#include <cstdint>

namespace mt {

inline double nowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Microseconds since the Unix epoch: comparable across ranks on one host (traces).
inline int64_t wallMicros() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(nowSeconds()) {}
  double elapsed() const { return nowSeconds() - start_; }
  void reset() { start_ = nowSeconds(); }

 private:
  double start_;
};

}  // namespace mt
