// libFuzzer target: a checkpoint's meta.json through its parser (launch/CheckpointMeta), twice: as
// given (the checksum of itself rejects nearly every mutation), and with meta_crc32 recomputed, so
// that the type and range checks behind the checksum see the mutations too. Bad input must end in
// mt::Error; anything else is a bug. What parses must survive a round trip through toJson().
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "launch/CheckpointMeta.h"

namespace {

void parseAndRoundTrip(const std::string& text) {
  try {
    const mt::CheckpointMeta m = mt::parseCheckpointMeta(text, "fuzz");
    const mt::CheckpointMeta again = mt::parseCheckpointMeta(m.toJson(), "fuzz");
    if (again.toJson() != m.toJson() || again.params.size() != m.params.size() || again.numel != m.numel)
      std::abort();
  } catch (const mt::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parseAndRoundTrip(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return 0;
  j.erase("meta_crc32");
  const std::string body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  j = nlohmann::json::parse(body, nullptr, false);  // what the parser will see, with invalid UTF-8 replaced
  if (j.is_discarded()) return 0;
  const std::string canonical = j.dump();
  j["meta_crc32"] = mt::crc32Of(canonical.data(), canonical.size());
  parseAndRoundTrip(j.dump());
  return 0;
}
