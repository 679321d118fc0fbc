// libFuzzer target: an NCCL topology XML file through the reader and the typed model (both
// summaries). Malformed input must end in mt::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/Error.h"
#include "topo/TopoXml.h"
#include "topo/Topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    mt::XmlDocument doc = mt::parseTopologyXmlString(text, "fuzz.xml");
    mt::Topology t = mt::Topology::fromDocument(doc);
    (void)t.summary();
    (void)t.json();
  } catch (const mt::Error&) {
  }
  return 0;
}
