#include "launch/Agreement.h"

#include <cstring>

namespace mt {

std::string broadcastString(Communicator& comm, std::chrono::milliseconds timeout, const std::string& text,
                            int root) {
  if (comm.size() == 1) return text;
  Tensor length = Tensor::empty({1}, DType::kI64);
  length.data<int64_t>()[0] = static_cast<int64_t>(text.size());
  comm.broadcast(length, root)->wait(timeout);
  const int64_t n = length.data<int64_t>()[0];
  if (n == 0) return std::string();
  Tensor bytes = Tensor::empty({n}, DType::kU8);
  if (comm.rank() == root) std::memcpy(bytes.rawData(), text.data(), text.size());
  comm.broadcast(bytes, root)->wait(timeout);
  return std::string(reinterpret_cast<const char*>(bytes.rawData()), static_cast<size_t>(n));
}

std::optional<AgreedFailure> captureFailure(int rank, const std::function<void()>& body) {
  try {
    if (body) body();
  } catch (const Error& e) {
    return AgreedFailure{rank, e.exitCode(), e.what()};
  } catch (const std::exception& e) {
    return AgreedFailure{rank, ExitCode::kFailure, std::string("internal: ") + e.what()};
  }
  return std::nullopt;
}

std::optional<AgreedFailure> agreeOnFailure(Communicator& comm, std::chrono::milliseconds timeout,
                                            const std::function<void()>& body,
                                            const std::function<void()>& onFailure) {
  const std::optional<AgreedFailure> mine = captureFailure(comm.rank(), body);
  if (comm.size() == 1) {
    if (mine && onFailure) onFailure();
    return mine;
  }
  Tensor first = Tensor::empty({1}, DType::kF64);
  first.data<double>()[0] = mine ? comm.rank() : comm.size();
  comm.allReduce(first, ReduceOp::kMin)->wait(timeout);
  const int who = static_cast<int>(first.data<double>()[0]);
  if (who >= comm.size()) return std::nullopt;
  // Before the exchange of the message: the others wait for it there, bounded by `timeout`.
  if (onFailure) onFailure();
  Tensor code = Tensor::empty({1}, DType::kI64);
  code.data<int64_t>()[0] = mine ? static_cast<int64_t>(mine->code) : 0;
  comm.broadcast(code, who)->wait(timeout);
  AgreedFailure agreed;
  agreed.rank = who;
  agreed.code = static_cast<ExitCode>(code.data<int64_t>()[0]);
  agreed.message = broadcastString(comm, timeout, mine ? mine->message : std::string(), who);
  return agreed;
}

void agreeOrThrow(Communicator& comm, std::chrono::milliseconds timeout, const std::string& what,
                  const std::function<void()>& body, const std::function<void()>& onFailure) {
  const std::optional<AgreedFailure> failure = agreeOnFailure(comm, timeout, body, onFailure);
  if (!failure) return;
  std::string message = failure->message;
  if (!what.empty()) message = what + " failed on rank " + std::to_string(failure->rank) + ": " + message;
  throw Error(message, failure->code);
}

}  // namespace mt
