#pragma once
// Typed errors. Library code throws; only launch/ catches, logs and ends the job. The exit code a
// caught error maps to is part of the error: bad input (config, data, checkpoint files) exits 2 on
// every rank so scripts can tell a user mistake from a crash.

#include <stdexcept>
#include <string>

namespace mt {

enum class ExitCode : int {
  kOk = 0,
  kFailure = 1,      // internal error, CUDA/NCCL/MPI failure
  kBadInput = 2,     // config, data or checkpoint the user supplied is wrong
  kCommFailure = 3,  // timeout or lost peer: the job cannot continue
  kDiverged = 4      // training diverged: the loss stayed non-finite (train.divergence_steps)
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ExitCode code = ExitCode::kFailure)
      : std::runtime_error(what), code_(code) {}
  ExitCode exitCode() const { return code_; }

 private:
  ExitCode code_;
};

#define MT_DEFINE_ERROR(Name, code)                                            \
  class Name : public Error {                                                  \
   public:                                                                     \
    explicit Name(const std::string& what) : Error(what, ExitCode::code) {}   \
  }

MT_DEFINE_ERROR(InternalError, kFailure);
MT_DEFINE_ERROR(ConfigError, kBadInput);
MT_DEFINE_ERROR(DataError, kBadInput);
MT_DEFINE_ERROR(CheckpointError, kBadInput);
MT_DEFINE_ERROR(IoError, kFailure);
MT_DEFINE_ERROR(OutOfMemoryError, kFailure);
MT_DEFINE_ERROR(CudaError, kFailure);
MT_DEFINE_ERROR(NcclError, kFailure);
MT_DEFINE_ERROR(MpiError, kFailure);
MT_DEFINE_ERROR(H5Error, kBadInput);
MT_DEFINE_ERROR(CommError, kCommFailure);
MT_DEFINE_ERROR(TimeoutError, kCommFailure);
MT_DEFINE_ERROR(PeerLostError, kCommFailure);

#undef MT_DEFINE_ERROR

}  // namespace mt
