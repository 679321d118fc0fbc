// libFuzzer target: an environment profile (topo/profiles/*.env) through its parser and the NCCL
// parameter table's validation. Bad input must end in mt::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/Error.h"
#include "topo/Profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    mt::Profile p = mt::Profile::parse(text, "fuzz.env");
    (void)p;
  } catch (const mt::Error&) {
  }
  return 0;
}
