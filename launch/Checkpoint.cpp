#include "launch/Checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "comm/MpiCommunicator.h"
#include "core/Log.h"
#include "core/Timer.h"
#include "data/H5File.h"
#include "data/RowReader.h"
#include "launch/Architecture.h"
#include "launch/Metrics.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxListed = 8;  // differences named in one message

std::string stepName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%09lld", static_cast<long long>(step));
  return buf;
}

std::string bulleted(const std::vector<std::string>& lines) {
  std::string s;
  for (size_t i = 0; i < lines.size() && i < kMaxListed; ++i)
    s += "\n  - " + lines[i];
  if (lines.size() > kMaxListed) s += "\n  ... and " + std::to_string(lines.size() - kMaxListed) + " more";
  return s;
}

// Parameter by parameter: name, shape and place in the flat vector.
std::vector<std::string> parameterDifferences(const CheckpointMeta& meta, const ParamTable& table) {
  std::vector<std::string> out;
  std::map<std::string, const CheckpointParam*> stored;
  for (const auto& p : meta.params)
    stored[p.name] = &p;
  for (size_t i = 0; i < table.size(); ++i) {
    const Param& p = table[i];
    auto it = stored.find(p.name);
    if (it == stored.end()) {
      out.push_back("parameter " + p.name + " " + shapeStr(p.shape) + ": only in this model");
      continue;
    }
    const CheckpointParam& s = *it->second;
    if (s.shape != p.shape)
      out.push_back("parameter " + p.name + ": " + shapeStr(s.shape) + " in the checkpoint, " +
                    shapeStr(p.shape) + " in this model");
    else if (s.offset != p.offset)
      out.push_back("parameter " + p.name + ": at offset " + std::to_string(s.offset) +
                    " in the checkpoint, " + std::to_string(p.offset) +
                    " in this model (another parameter order)");
    stored.erase(it);
  }
  for (const auto& kv : stored)
    out.push_back("parameter " + kv.first + " " + shapeStr(kv.second->shape) + ": only in the checkpoint");
  return out;
}

std::string canonicalPath(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int keep, Communicator& world,
                                     std::chrono::milliseconds ioTimeout)
    : dir_(std::move(dir)), keep_(std::max(1, keep)), world_(world), timeout_(ioTimeout) {
  // NCCL's watchdog aborts any operation older than dist.timeout_s, whatever the caller waits:
  // checkpoint agreement goes over MPI there (host messages only). MPI and local worlds wait as
  // long as they are asked to.
  if (std::string(world.backend()) == "nccl") {
    CommOptions o;
    o.name = "checkpoint";
    o.timeout = ioTimeout;
    control_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, o);
    MT_CHECK(control_->size() == world.size(), "checkpoint control communicator over another set of ranks");
  }
}

CheckpointManager::~CheckpointManager() = default;

void CheckpointManager::setIdentity(RunIdentity identity) {
  identity_ = std::move(identity);
  if (!identity_.dataPath.empty()) identity_.dataPath = canonicalPath(identity_.dataPath);
  if (!identity_.runDir.empty()) identity_.runDir = canonicalPath(identity_.runDir);
}

// ---- save ----

std::string CheckpointManager::makeTmpDir(const std::string& finalDir) {
  // A temporary name common to all ranks: rank 0 draws it and makes the directory; its failure
  // (read-only, not a directory, quota) is agreed on by every rank at once.
  std::string tmpDir;
  agreeOrThrow(control(), timeout_, "checkpoint save to " + finalDir, [&] {
    if (control().rank() != 0) return;
    tmpDir = finalDir + ".tmp-" + std::to_string(std::random_device{}() & 0x7fffffff);
    std::error_code ec;
    fs::create_directories(tmpDir, ec);
    if (ec) throw IoError("cannot create " + tmpDir + ": " + ec.message());
  });
  return broadcastString(control(), timeout_, tmpDir, 0);
}

RankFileContent CheckpointManager::contentOf(Parallelism& par, int64_t modelNumel) const {
  struct Piece {
    int64_t global, length;  // range of the flat parameter vector
    size_t segment;          // this rank's segment holding it
    int64_t within;          // offset inside that segment
  };
  const int r = world_.rank(), W = world_.size();
  const CheckpointRole role = par.checkpointRole();
  Optimizer& opt = par.optimizer();
  // This rank's pieces: its segments, cut to its 1/W slice when every rank holds everything.
  const int64_t lo = role.replicated ? modelNumel * r / W : 0;
  const int64_t hi = role.replicated ? modelNumel * (r + 1) / W : modelNumel;
  std::vector<Piece> pieces;
  const auto& segs = opt.segments();
  for (size_t i = 0; i < segs.size() && role.writes; ++i) {
    MT_CHECK(segs[i].globalOffset >= 0, "optimizer segment without a global offset");
    const int64_t a = std::max(lo, segs[i].globalOffset),
                  b = std::min(hi, segs[i].globalOffset + segs[i].value.numel());
    if (a < b) pieces.push_back({a, b - a, i, a - segs[i].globalOffset});
  }
  int64_t total = 0;
  for (const auto& p : pieces)
    total += p.length;
  RankFileContent c;
  const auto n = static_cast<int64_t>(pieces.size());
  c.offsets = Tensor::empty({n}, DType::kI64);
  c.lengths = Tensor::empty({n}, DType::kI64);
  c.value = Tensor::empty({total}, DType::kF32);
  // The state segment by segment: a split optimizer's parts live on different devices.
  for (const auto& name : opt.stateNames())
    c.state.emplace_back(name, Tensor::empty({total}, DType::kF32));
  int64_t cursor = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    c.offsets.data<int64_t>()[k] = p.global;
    c.lengths.data<int64_t>()[k] = p.length;
    c.value.flatSlice(cursor, p.length).copyFrom(segs[p.segment].value.flatSlice(p.within, p.length));
    for (size_t s = 0; s < c.state.size(); ++s)
      c.state[s]
          .second.flatSlice(cursor, p.length)
          .copyFrom(opt.stateSlice(s, p.segment).flatSlice(p.within, p.length));
    cursor += p.length;
  }
  if (BucketReducer* reducer = par.reducer()) c.compression = reducer->checkpointState();
  return c;
}

CheckpointMeta CheckpointManager::metaOf(const TrainState& st, Parallelism& par, const ParamTable& table,
                                         const std::pair<uint32_t, int64_t>& mine, bool compressorState) {
  const int W = control().size();
  Tensor all = Tensor::empty({2 * W}, DType::kI64), own = Tensor::empty({2}, DType::kI64);
  own.data<int64_t>()[0] = mine.first;
  own.data<int64_t>()[1] = mine.second;
  if (W > 1)
    control().allGather(own, all)->wait(timeout_);
  else
    all.copyFrom(own);
  CheckpointMeta m;
  m.state = st;
  m.optimizerSteps = par.optimizer().stepCount();
  m.identity = identity_;
  m.worldSize = W;
  m.numel = table.numel();
  m.time = wallMicros() / 1e6;
  m.stateNames = par.optimizer().stateNames();
  for (size_t i = 0; i < table.size(); ++i)
    m.params.push_back({table[i].name, table[i].shape, table[i].offset});
  if (compressorState) m.compression = par.reducer()->name();
  if (!st.fp8.empty()) {  // every rank's FP8 scaling state (the same length everywhere: one model)
    const int64_t n = static_cast<int64_t>(st.fp8.size());
    Tensor mineFp8 = Tensor::fromBlob(const_cast<int64_t*>(st.fp8.data()), {n}, DType::kI64);
    Tensor allFp8 = Tensor::empty({W * n}, DType::kI64);
    if (W > 1)
      control().allGather(mineFp8, allFp8)->wait(timeout_);
    else
      allFp8.copyFrom(mineFp8);
    const int64_t* p = allFp8.data<int64_t>();
    for (int q = 0; q < W; ++q)
      m.fp8Ranks.emplace_back(p + q * n, p + (q + 1) * n);
  }
  for (int q = 0; q < W; ++q)
    m.files.push_back({"rank" + std::to_string(q) + ".h5", static_cast<uint32_t>(all.data<int64_t>()[2 * q]),
                       all.data<int64_t>()[2 * q + 1]});
  return m;
}

// Rank 0: meta.json, then the checkpoint appears in one rename.
void CheckpointManager::publish(const std::string& tmpDir, const std::string& finalDir,
                                const CheckpointMeta& meta) {
  {
    std::ofstream out(tmpDir + "/meta.json");
    out << meta.toJson();
    out.flush();
    if (!out) throw IoError("writing " + tmpDir + "/meta.json failed (disk full?)");
  }
  fsyncPath(tmpDir + "/meta.json", false);
  fsyncPath(tmpDir, true);
  std::error_code ec;
  if (fs::exists(finalDir)) fs::remove_all(finalDir, ec);  // a checkpoint of this step from a crashed run
  fs::rename(tmpDir, finalDir, ec);
  if (ec) throw IoError("renaming " + tmpDir + " to " + finalDir + ": " + ec.message());
  fsyncPath(dir_, true);
}

void CheckpointManager::prune() {
  std::vector<std::string> all;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.find(".tmp-") == std::string::npos) all.push_back(n);
  }
  std::sort(all.begin(), all.end());
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i)
    fs::remove_all(dir_ + "/" + all[i], ec);
}

std::string CheckpointManager::save(const TrainState& st, Parallelism& par, const ParamTable& table) {
  const std::string finalDir = dir_ + "/" + stepName(st.step);
  // A stop that lands on a checkpoint.interval step asks for the step just written.
  if (st.step == lastSavedStep_) return finalDir;
  Stopwatch sw;
  const int r = control().rank();
  const std::string tmpDir = makeTmpDir(finalDir);
  // Never leave half a checkpoint; the older ones are untouched.
  auto removeTmp = [&] {
    std::error_code ec;
    if (r == 0) fs::remove_all(tmpDir, ec);
  };
  std::pair<uint32_t, int64_t> written;
  bool compressorState = false;
  agreeOrThrow(
      control(), timeout_, "checkpoint save to " + finalDir,
      [&] {
        if (r != 0 && !fs::exists(tmpDir))
          throw IoError("checkpoint directory " + tmpDir +
                        " is not visible on this node (checkpoint.dir must be shared)");
        const RankFileContent content = contentOf(par, table.numel());
        compressorState = !content.compression.empty();
        written = writeRankFile(tmpDir + "/rank" + std::to_string(r) + ".h5", content);
      },
      removeTmp);
  const CheckpointMeta meta = metaOf(st, par, table, written, compressorState);
  agreeOrThrow(
      control(), timeout_, "checkpoint save to " + finalDir,
      [&] {
        if (r != 0) return;
        publish(tmpDir, finalDir, meta);
        prune();
      },
      removeTmp);
  lastSavedStep_ = st.step;
  if (r == 0) MT_LOG_INFO << "checkpoint " << finalDir << " written in " << formatDuration(sw.elapsed());
  return finalDir;
}

// ---- verification ----

std::optional<AgreedFailure> CheckpointManager::verifyShare(const std::string& path, CheckpointMeta* meta) {
  Stopwatch sw;
  auto failure = agreeOnFailure(control(), timeout_, [&] {
    *meta = readCheckpointMeta(path);
    for (size_t q = static_cast<size_t>(control().rank()); q < meta->files.size();
         q += static_cast<size_t>(control().size()))
      verifyRankFile(path, *meta, q);
  });
  if (!failure && control().rank() == 0)
    MT_LOG_DEBUG << "checkpoint " << path << ": " << meta->files.size() << " file(s) verified by "
                 << control().size() << " rank(s) in " << formatDuration(sw.elapsed());
  return failure;
}

std::vector<std::string> CheckpointManager::candidates() {
  // Rank 0 lists them (and removes what crashed saves left), newest first; every rank gets the list.
  std::string listing;
  agreeOrThrow(control(), timeout_, "", [&] {
    if (control().rank() != 0 || !fs::exists(dir_)) return;
    try {
      std::vector<std::string> all;
      for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("step_", 0) != 0) continue;
        if (n.find(".tmp-") != std::string::npos) {
          std::error_code ec;
          fs::remove_all(e.path(), ec);  // left by a crashed save
          MT_LOG_WARN << "removed incomplete checkpoint " << e.path().string();
          continue;
        }
        all.push_back(n);
      }
      std::sort(all.rbegin(), all.rend());
      for (const auto& n : all)
        listing += n + "\n";
    } catch (const fs::filesystem_error& e) {
      throw CheckpointError("reading the checkpoints in " + dir_ + ": " + e.what());
    }
  });
  std::vector<std::string> names;
  std::istringstream in(broadcastString(control(), timeout_, listing, 0));
  for (std::string n; std::getline(in, n);)
    names.push_back(n);
  return names;
}

std::string CheckpointManager::findLatestValid() {
  std::vector<std::string> rejected;
  for (const auto& n : candidates()) {
    const std::string p = dir_ + "/" + n;
    CheckpointMeta meta;
    if (const auto failure = verifyShare(p, &meta)) {
      rejected.push_back(failure->message);
      if (control().rank() == 0) MT_LOG_WARN << failure->message << "; falling back to an older checkpoint";
      continue;
    }
    verified_ = p;
    verifiedMeta_ = meta;
    return p;
  }
  if (rejected.empty()) return "";
  // Starting from step 0 would overwrite the run's metrics and, at the next save, its
  // checkpoints: refuse and say what was rejected.
  std::string error = "every checkpoint in " + dir_ + " is unusable:";
  for (const auto& why : rejected)
    error += "\n  - " + why;
  throw CheckpointError(
      error +
      "\nrefusing to start over them: move them away, or set checkpoint.resume = never to start fresh");
}

void CheckpointManager::prepare() {
  agreeOrThrow(control(), timeout_, "", [&] {
    if (control().rank() != 0) return;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw ConfigError("checkpoint.dir: cannot create " + dir_ + ": " + ec.message());
    if (!fs::is_directory(dir_, ec)) throw ConfigError("checkpoint.dir: " + dir_ + " is not a directory");
  });
}

// ---- load ----

void CheckpointManager::checkCompatible(const std::string& path, const CheckpointMeta& meta,
                                        const ParamTable& table, Optimizer& opt) const {
  std::vector<std::string> diffs;
  if (!meta.identity.architecture.empty() && !identity_.architecture.empty())
    diffs = compareArchitectures(meta.identity.architecture, identity_.architecture).changes;
  for (auto& d : parameterDifferences(meta, table))
    diffs.push_back(std::move(d));
  if (diffs.empty() && meta.numel != table.numel())
    diffs.push_back("parameters: " + std::to_string(meta.numel) + " in the checkpoint, " +
                    std::to_string(table.numel()) + " in this model");
  if (!diffs.empty())
    throw CheckpointError("checkpoint " + path + " holds another model than this run's:" + bulleted(diffs) +
                          "\nresume it with the model settings it was trained with, or start afresh with "
                          "--checkpoint.resume=never or another --run.name");
  const std::vector<std::string> names = opt.stateNames();
  if (names != meta.stateNames) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& n : v)
        s += (s.empty() ? "" : ", ") + n;
      return s.empty() ? std::string("none") : s;
    };
    throw CheckpointError("checkpoint " + path + " was written with another optimizer (state " +
                          join(meta.stateNames) + "; this run's: " + join(names) + ")");
  }
}

void CheckpointManager::warnAboutDifferences(const std::string& path, const CheckpointMeta& meta) const {
  const RunIdentity& was = meta.identity;
  if (!was.architecture.empty() && !identity_.architecture.empty())
    for (const auto& note : compareArchitectures(was.architecture, identity_.architecture).notes)
      MT_LOG_WARN << "checkpoint " << path << ": " << note;
  const bool otherData =
      !was.dataPath.empty() && (was.dataPath != identity_.dataPath || was.trainSplit != identity_.trainSplit);
  const bool otherBatch = was.globalBatch > 0 && was.globalBatch != identity_.globalBatch;
  if (otherData)
    MT_LOG_WARN << "checkpoint " << path << " was trained on " << was.dataPath << " (split " << was.trainSplit
                << "), this run reads " << identity_.dataPath << " (split " << identity_.trainSplit
                << "): training continues on other data";
  if (!was.runDir.empty() && !identity_.runDir.empty() && was.runDir != identity_.runDir)
    MT_LOG_WARN << "checkpoint " << path << " was written by the run in " << was.runDir << "; this run ("
                << identity_.runDir << ") continues it, and its saves rotate the shared checkpoint.dir "
                << dir_ << " (checkpoint.keep = " << keep_ << "): that run's checkpoints there may be removed";
  if (otherBatch)
    MT_LOG_WARN << "checkpoint " << path << " was trained with train.batch_size " << was.globalBatch
                << ", this run uses " << identity_.globalBatch << ": the data continues at batch "
                << meta.state.loaderSeq << " of the new size (sample "
                << meta.state.loaderSeq * identity_.globalBatch << ", not "
                << meta.state.loaderSeq * was.globalBatch << ")";
}

void CheckpointManager::readState(const std::string& path, const CheckpointMeta& meta, Optimizer& opt) {
  struct Source {
    H5File file;
    PieceIndex index;
    std::unique_ptr<RowReader> value;
    std::vector<std::unique_ptr<RowReader>> state;
  };
  std::vector<Source> sources;
  for (const auto& f : meta.files) {
    Source s;
    s.file = H5File::open(path + "/" + f.name);
    s.index = readPieceIndex(s.file, meta, "checkpoint " + path + ": " + f.name);
    sources.push_back(std::move(s));
  }
  for (auto& s : sources) {  // the readers point at the files, which no longer move
    s.value = std::make_unique<RowReader>(s.file, s.file.describe("/value"));
    for (const auto& n : meta.stateNames)
      s.state.push_back(std::make_unique<RowReader>(s.file, s.file.describe("/state/" + n)));
  }
  const auto& segs = opt.segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t g0 = segs[i].globalOffset, n = segs[i].value.numel();
    Tensor v = Tensor::empty({n}, DType::kF32);
    // The segment's state read on the host, then copied to wherever its optimizer keeps it.
    std::vector<Tensor> stateHost;
    for (size_t q = 0; q < meta.stateNames.size(); ++q) stateHost.push_back(Tensor::empty({n}, DType::kF32));
    int64_t filled = 0;
    for (auto& s : sources)
      for (size_t k = 0; k < s.index.offsets.size(); ++k) {
        const int64_t a = std::max(g0, s.index.offsets[k]),
                      b = std::min(g0 + n, s.index.offsets[k] + s.index.lengths[k]);
        if (a >= b) continue;
        const int64_t row = s.index.starts[k] + (a - s.index.offsets[k]);
        s.value->readRows(row, b - a, v.data<float>() + (a - g0));
        for (size_t q = 0; q < s.state.size(); ++q)
          s.state[q]->readRows(row, b - a, stateHost[q].data<float>() + (a - g0));
        filled += b - a;
      }
    if (filled != n)
      throw CheckpointError("checkpoint " + path + ": its files hold " + std::to_string(filled) + " of the " +
                            std::to_string(n) + " parameters from " + std::to_string(g0) +
                            " (pieces missing or overlapping)");
    Tensor dst = segs[i].value;  // a view of the parameter (or shard)
    dst.copyFrom(v);
    for (size_t q = 0; q < stateHost.size(); ++q) opt.stateSlice(q, i).copyFrom(stateHost[q]);
  }
}

void CheckpointManager::restoreCompression(const std::string& path, const CheckpointMeta& meta,
                                           BucketReducer* reducer) {
  if (meta.compression.empty()) return;
  const bool lead = control().rank() == 0;
  if (!reducer || reducer->name() != meta.compression) {
    if (lead)
      MT_LOG_WARN << "checkpoint " << path << " holds " << meta.compression
                  << " compression state, which this run ("
                  << (reducer ? reducer->name() : std::string("no data-parallel reducer"))
                  << ") does not use";
    return;
  }
  // Error feedback is this rank's own residual: it carries over to the same rank of the same world
  // size only. Q is the same on every rank (it is all-reduced): rank 0's fits any world size.
  const bool sameWorld = meta.worldSize == control().size();
  const CheckpointFile& f = meta.files.at(sameWorld ? static_cast<size_t>(control().rank()) : 0);
  const std::string where = "checkpoint " + path + ": " + f.name;
  const H5File file = H5File::open(path + "/" + f.name);
  size_t restored = 0, unused = 0;
  for (const auto& n : compressionStateNames(file, where)) {
    if (!sameWorld && n.rfind("error/", 0) == 0) continue;
    if (reducer->restoreCheckpointState(n, file.readTensor("/compression/" + n)))
      ++restored;
    else
      ++unused;
  }
  if (lead && !sameWorld)
    MT_LOG_WARN << "checkpoint " << path << " was written by " << meta.worldSize << " ranks, this run has "
                << control().size() << ": " << meta.compression << " error feedback restarts from zero";
  if (lead && unused > 0)
    MT_LOG_WARN << "checkpoint " << path << ": " << unused << " of its " << meta.compression
                << " state tensors do not fit this run's compression settings and start afresh";
  if (lead) MT_LOG_DEBUG << "restored " << restored << " compressor state tensor(s) from " << f.name;
}

TrainState CheckpointManager::load(const std::string& path, Parallelism& par, const ParamTable& table) {
  CheckpointMeta meta = verifiedMeta_;
  if (path != verified_) {  // given by the user: verified here, once
    if (const auto failure = verifyShare(path, &meta)) throw Error(failure->message, failure->code);
  }
  verified_.clear();
  // The same meta and model on every rank: refused alike, before anything is read.
  checkCompatible(path, meta, table, par.optimizer());
  if (control().rank() == 0) warnAboutDifferences(path, meta);
  agreeOrThrow(control(), timeout_, "", [&] {
    readingCheckpoint("checkpoint " + path, [&] {
      readState(path, meta, par.optimizer());
      restoreCompression(path, meta, par.reducer());
    });
  });
  par.optimizer().setStepCount(meta.optimizerSteps);
  TrainState st = meta.state;
  if (!meta.fp8Ranks.empty()) {
    const bool sameWorld = meta.worldSize == control().size();
    st.fp8 = meta.fp8Ranks[sameWorld ? static_cast<size_t>(control().rank()) : 0];
    if (!sameWorld && control().rank() == 0)
      MT_LOG_WARN << "checkpoint " << path << " was written by " << meta.worldSize << " ranks, this run has "
                  << control().size() << ": every rank continues from rank 0's FP8 scaling state";
  }
  return st;
}

}  // namespace mt
