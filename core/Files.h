#pragma once
// Whole small text files (topology XML, profiles, NCCL logs) read in one go.

#include <fstream>
#include <sstream>
#include <string>

namespace mt {

// The bytes of `path` into *out; false when it cannot be opened (the caller names what it is).
inline bool readWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace mt
