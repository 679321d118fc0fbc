// libFuzzer target: NCCL's NCCL_DEBUG=INFO output through the log parser and its JSON, dumped as
// trainer topo --nccl-log and topo.report's nccl_report.json do. Nothing in a log is an error: any
// exception, a crash or a slow input (the parser is linear) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "topo/NcclLog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const mt::NcclLogSummary s = mt::parseNcclDebugLog(text);
  (void)mt::toJson(s).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
