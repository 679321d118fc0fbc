// trainer: the meshtrain training program.
//   trainer [--config FILE.ini] [--section.key=value ...]   train (defaults: Fashion-MNIST MLP)
//   trainer --help | --help-env | --devices
// Exit codes: 0 ok, 1 internal/library failure, 2 bad input (config, data), 3 lost peer/timeout.

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "comm/MpiEnvironment.h"
#include "core/EnvParams.h"
#include "core/Log.h"
#include "launch/Config.h"
#include "launch/Failure.h"
#include "launch/Trainer.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaMemory.h"
#endif

namespace {

void printEnvHelp() {
  std::printf("environment variables read by meshtrain:\n");
  for (const auto& p : mt::envParamTable()) std::printf("  %-22s default %-6s %s\n", p.name, p.defaultValue, p.help);
}

// All ranks agree on the worst setup outcome; the message is printed once when identical.
int agreeOnSetup(int code, const std::string& message, int rank, int size) {
  if (size == 1) {
    if (code) mt::writeLine(message);
    return code;
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!worst) return 0;
  char rootMsg[1024] = {0};
  if (rank == 0) std::snprintf(rootMsg, sizeof(rootMsg), "%s", message.c_str());
  MPI_Bcast(rootMsg, sizeof(rootMsg), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (code && (rank == 0 || message != rootMsg)) mt::writeLine("[r" + std::to_string(rank) + "] " + message);
  if (!code && rank == 0)
    mt::writeLine("[r0] error: another rank failed during setup (see its message above)");
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "--help-env") {
      printEnvHelp();
      return 0;
    }
    if (a == "--devices") {  // for scripts: how many GPUs this build can use here
#ifdef MT_WITH_CUDA
      std::printf("cuda devices: %d\n", mt::cudaDeviceCountOrZero());
#else
      std::printf("cuda devices: 0 (built without CUDA)\n");
#endif
      return 0;
    }
  }
  mt::MpiEnvironment mpi(&argc, &argv);
  std::unique_ptr<mt::Trainer> trainer;
  int code = 0;
  std::string message;
  try {
    mt::Config cfg = mt::Config::fromArgs(args);
    if (cfg.helpRequested()) {
      if (mpi.rank() == 0) std::cout << mt::configHelp();
      return 0;
    }
    trainer = std::make_unique<mt::Trainer>(cfg, mpi);
  } catch (const mt::Error& e) {
    code = static_cast<int>(e.exitCode());
    message = std::string("error: ") + e.what();
  } catch (const std::exception& e) {
    code = static_cast<int>(mt::ExitCode::kFailure);
    message = std::string("error: internal: ") + e.what();
  }
  code = agreeOnSetup(code, message, mpi.rank(), mpi.size());
  if (code) {
    trainer.reset();
    return code;
  }
  try {
    code = trainer->run();
  } catch (const mt::Error& e) {
    mt::abortJob(e.what(), e.exitCode(), &trainer->world(), trainer->health());
  } catch (const std::exception& e) {
    mt::abortJob(std::string("internal: ") + e.what(), mt::ExitCode::kFailure, &trainer->world(), trainer->health());
  }
  trainer.reset();
  return code;
}
