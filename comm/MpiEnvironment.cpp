#include "comm/MpiEnvironment.h"

#include <unistd.h>

#include <mutex>

#include "core/EnvParams.h"
#include "core/Log.h"
#include "comm/MpiCheck.h"

namespace mt {

namespace {
std::mutex gMpiMutex;
bool gNeedLock = false;
}  // namespace

MpiCallGuard::MpiCallGuard() : locked_(gNeedLock) {
  if (locked_) gMpiMutex.lock();
}
MpiCallGuard::~MpiCallGuard() {
  if (locked_) gMpiMutex.unlock();
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    ownsInit_ = true;
  } else {
    MPI_CHECK(MPI_Query_thread(&provided));
  }
  threadMultiple_ = provided >= MPI_THREAD_MULTIPLE;
  gNeedLock = !threadMultiple_;
  // Errors come back as codes so MPI_CHECK can turn them into exceptions with context.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  setLogRank(rank_, size_);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;

  // A bad MT_NODE_SPLIT is reported by setupError() (every rank sees the same environment, so
  // every rank reports it): thrown from here it would escape main before MPI is finalised.
  try {
    emulated_ = static_cast<int>(envInt(EnvParam::kNodeSplit));
    if (emulated_ > 0 && size_ % emulated_ != 0)
      throw ConfigError("MT_NODE_SPLIT=" + std::to_string(emulated_) + " does not divide the world size " +
                        std::to_string(size_));
  } catch (const ConfigError& e) {
    setupError_ = e.what();
    emulated_ = 0;
  }
  {
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &machineLocalRank_));
    MPI_CHECK(MPI_Comm_size(local, &machineLocalSize_));
    // Machine index = rank of this machine's leader (local rank 0) among all leaders.
    MPI_Comm leaders;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, machineLocalRank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
    int machineInfo[2] = {0, 1};
    if (machineLocalRank_ == 0) {
      MPI_CHECK(MPI_Comm_rank(leaders, &machineInfo[0]));
      MPI_CHECK(MPI_Comm_size(leaders, &machineInfo[1]));
      MPI_CHECK(MPI_Comm_free(&leaders));
    }
    MPI_CHECK(MPI_Bcast(machineInfo, 2, MPI_INT, 0, local));
    MPI_CHECK(MPI_Comm_free(&local));
    machine_ = machineInfo[0];
    localRank_ = machineLocalRank_;
    localSize_ = machineLocalSize_;
    node_ = machine_;
    numNodes_ = machineInfo[1];
  }
  if (emulated_ > 0) {
    localSize_ = emulated_;
    localRank_ = rank_ % emulated_;
    node_ = rank_ / emulated_;
    numNodes_ = size_ / emulated_;
  }
  if (!threadMultiple_ && rank_ == 0) {
    MT_LOG_WARN << "MPI library provides thread level " << provided
                << " (< MPI_THREAD_MULTIPLE); MPI calls are serialised";
  }
}

MpiEnvironment::~MpiEnvironment() {
  if (!ownsInit_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::vector<std::string> allGatherStrings(MPI_Comm comm, const std::string& mine) {
  MpiCallGuard guard;
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r)
    offsets[static_cast<size_t>(r)] = total, total += lens[static_cast<size_t>(r)];
  std::string all(static_cast<size_t>(total), '\0');
  MPI_CHECK(
      MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r)
    out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                             static_cast<size_t>(lens[static_cast<size_t>(r)])));
  return out;
}

}  // namespace mt
