// libFuzzer target: an INI config file, through the parser and every key's validation
// (Settings::fromConfig). A bad file must end in mt::Error (exit 2 in the trainer); a crash, a
// sanitizer report, or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/Error.h"
#include "launch/Config.h"
#include "launch/Settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    std::istringstream in(text);
    mt::Config c = mt::Config::fromStream(in, "fuzz.ini");
    mt::Settings s = mt::Settings::fromConfig(c);
    (void)c.toIni();
    (void)s;
  } catch (const mt::Error&) {
  }
  return 0;
}
