#include "launch/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "core/Log.h"
#include "core/Timer.h"
#include "data/H5File.h"
#include "data/RowReader.h"
#include "launch/Metrics.h"

namespace mt {

namespace fs = std::filesystem;

uint32_t crc32Of(const void* data, size_t bytes, uint32_t crc) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, n));
    p += n;
    bytes -= n;
  }
  return crc;
}

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";

struct Piece {
  int64_t global, length;  // range of the flat parameter vector
  size_t segment;          // this rank's segment holding it
  int64_t within;          // offset inside that segment
};

std::string stepName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%09lld", static_cast<long long>(step));
  return buf;
}

void fsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IoError("fsync of " + path + " failed: " + std::strerror(errno));
}

Tensor hostCopy(const Tensor& t) { return t.device().isCpu() ? t : t.to(Device::cpu()); }

uint32_t metaChecksum(const nlohmann::json& body) {
  const std::string text = body.dump();  // keys sorted: the same bytes for the same content
  return crc32Of(text.data(), text.size());
}

nlohmann::json readMeta(const std::string& path) {
  std::ifstream in(path + "/meta.json");
  if (!in) throw CheckpointError("checkpoint " + path + ": meta.json is missing (incomplete checkpoint)");
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || j.value("format", "") != kFormat)
      throw CheckpointError("checkpoint " + path + ": not a meshtrain checkpoint");
    // meta.json carries a checksum of itself (without that field): an edited step or file list is
    // refused like a corrupt payload. Checkpoints written before it existed have none.
    if (j.contains("meta_crc32")) {
      nlohmann::json body = j;
      body.erase("meta_crc32");
      if (static_cast<uint32_t>(j["meta_crc32"].get<int64_t>()) != metaChecksum(body))
        throw CheckpointError("checkpoint " + path + ": meta.json does not match its checksum (edited or corrupt)");
    }
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint " + path + ": meta.json is corrupt (" + e.what() + ")");
  }
}

// Everything a rank's file holds, read back (verification and loading).
struct RankFile {
  std::vector<int64_t> offsets, lengths;
};

// Agreement after a collective step: when any rank failed, all throw the first failing rank's
// message. `cleanup` runs on rank 0 before anyone leaves (a failing rank ends the job quickly).
void agree(Communicator& world, const std::string& localError, const std::string& what,
           const std::function<void()>& cleanup = nullptr) {
  const double failed = world.allReduceScalar(localError.empty() ? 1e9 : world.rank(), ReduceOp::kMin);
  if (failed >= 1e9) return;
  if (cleanup && world.rank() == 0) cleanup();
  const int who = static_cast<int>(failed);
  Tensor msg = Tensor::zeros({1024}, DType::kU8);
  if (world.rank() == who) std::memcpy(msg.rawData(), localError.data(), std::min<size_t>(localError.size(), 1023));
  world.broadcast(msg, who)->wait(world.timeout());
  throw IoError(what + " failed on rank " + std::to_string(who) + ": " + reinterpret_cast<const char*>(msg.rawData()));
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int keep, Communicator& world)
    : dir_(std::move(dir)), keep_(std::max(1, keep)), world_(world) {}

std::string CheckpointManager::save(const TrainState& st, Optimizer& opt, const ParamTable& table, bool replicated,
                                    bool writes) {
  const int64_t modelNumel = table.numel();
  Stopwatch sw;
  const int r = world_.rank(), W = world_.size();
  const std::string finalDir = dir_ + "/" + stepName(st.step);
  // A temporary name common to all ranks: rank 0 draws it.
  Tensor nonce = Tensor::zeros({1}, DType::kI64);
  if (r == 0) nonce.data<int64_t>()[0] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  world_.broadcast(nonce, 0)->wait(world_.timeout());
  const std::string tmpDir = finalDir + ".tmp-" + std::to_string(nonce.data<int64_t>()[0]);

  std::string error;
  uint32_t crc = 0;
  int64_t payload = 0;
  const std::string file = "rank" + std::to_string(r) + ".h5";
  // Rank 0 makes the directory; its failure (read-only, not a directory, quota) is agreed on by
  // every rank at once instead of leaving the others in a barrier rank 0 never reaches.
  if (r == 0) {
    std::error_code ec;
    fs::create_directories(tmpDir, ec);
    if (ec) error = "cannot create " + tmpDir + ": " + ec.message();
  }
  agree(world_, error, "checkpoint save to " + finalDir);
  try {
    if (r != 0 && !fs::exists(tmpDir)) throw IoError("checkpoint directory " + tmpDir + " is not visible on this node (checkpoint.dir must be shared)");
    // This rank's pieces: its segments, cut to its 1/W slice when every rank holds everything.
    const int64_t lo = replicated ? modelNumel * r / W : 0, hi = replicated ? modelNumel * (r + 1) / W : modelNumel;
    std::vector<Piece> pieces;
    const auto& segs = opt.segments();
    for (size_t i = 0; i < segs.size() && writes; ++i) {
      MT_CHECK(segs[i].globalOffset >= 0, "optimizer segment without a global offset");
      const int64_t a = std::max(lo, segs[i].globalOffset), b = std::min(hi, segs[i].globalOffset + segs[i].value.numel());
      if (a < b) pieces.push_back({a, b - a, i, a - segs[i].globalOffset});
    }
    int64_t total = 0;
    for (const auto& p : pieces) total += p.length;
    auto states = opt.state();
    Tensor offsets = Tensor::empty({static_cast<int64_t>(pieces.size())}, DType::kI64);
    Tensor lengths = Tensor::empty({static_cast<int64_t>(pieces.size())}, DType::kI64);
    Tensor value = Tensor::empty({total}, DType::kF32);
    std::vector<Tensor> stateOut;
    std::vector<Tensor> stateHost;
    for (auto& kv : states) {
      stateOut.push_back(Tensor::empty({total}, DType::kF32));
      stateHost.push_back(hostCopy(kv.second));
    }
    int64_t cursor = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      offsets.data<int64_t>()[k] = p.global;
      lengths.data<int64_t>()[k] = p.length;
      Tensor src = segs[p.segment].value.flatSlice(p.within, p.length);
      value.flatSlice(cursor, p.length).copyFrom(src);
      for (size_t s = 0; s < states.size(); ++s)
        stateOut[s].flatSlice(cursor, p.length).copyFrom(stateHost[s].flatSlice(opt.stateOffset(p.segment) + p.within, p.length));
      cursor += p.length;
    }
    crc = crc32Of(value.rawData(), value.nbytes());
    for (auto& t : stateOut) crc = crc32Of(t.rawData(), t.nbytes(), crc);
    payload = static_cast<int64_t>(value.nbytes()) * static_cast<int64_t>(1 + stateOut.size());
    H5Writer w(tmpDir + "/" + file);
    w.write("/pieces/offsets", offsets);
    w.write("/pieces/lengths", lengths);
    w.write("/value", value);
    for (size_t s = 0; s < states.size(); ++s) w.write("/state/" + states[s].first, stateOut[s]);
    w.close();
    fsyncPath(tmpDir + "/" + file, false);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Never leave half a checkpoint; the older ones are untouched.
  auto removeTmp = [&] {
    std::error_code ec;
    fs::remove_all(tmpDir, ec);
  };
  agree(world_, error, "checkpoint save to " + finalDir, removeTmp);

  // Rank 0 records every file's checksum, then makes the checkpoint appear in one rename.
  Tensor info = Tensor::empty({2 * W}, DType::kI64), mine = Tensor::empty({2}, DType::kI64);
  mine.data<int64_t>()[0] = crc;
  mine.data<int64_t>()[1] = payload;
  world_.allGather(mine, info)->wait(world_.timeout());
  error.clear();
  if (r == 0) {
    try {
      nlohmann::json j;
      j["format"] = kFormat;
      j["version"] = 1;
      j["step"] = st.step;
      j["optimizer_steps"] = opt.stepCount();
      j["loader_seq"] = st.loaderSeq;
      j["loss_scale"] = st.lossScale;
      j["scaler_clean"] = st.scalerClean;
      j["seed"] = st.seed;
      j["strategy"] = st.strategy;
      j["world_size"] = W;
      j["numel"] = modelNumel;
      j["time"] = wallMicros() / 1e6;
      nlohmann::json names = nlohmann::json::array();
      for (auto& kv : opt.state()) names.push_back(kv.first);
      j["state_names"] = names;
      nlohmann::json params = nlohmann::json::array();
      for (size_t i = 0; i < table.size(); ++i)
        params.push_back({{"name", table[i].name}, {"shape", table[i].shape}, {"offset", table[i].offset}});
      j["params"] = params;
      if (!architecture_.empty()) j["architecture"] = nlohmann::json::parse(architecture_);
      j["files"] = nlohmann::json::array();
      for (int q = 0; q < W; ++q)
        j["files"].push_back({{"name", "rank" + std::to_string(q) + ".h5"},
                              {"crc32", info.data<int64_t>()[2 * q]},
                              {"payload_bytes", info.data<int64_t>()[2 * q + 1]}});
      j["meta_crc32"] = metaChecksum(j);
      {
        std::ofstream out(tmpDir + "/meta.json");
        out << j.dump(2) << "\n";
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
      // Keep the newest `keep`.
      std::vector<std::string> all;
      for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("step_", 0) == 0 && n.find(".tmp-") == std::string::npos) all.push_back(n);
      }
      std::sort(all.begin(), all.end());
      for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) fs::remove_all(dir_ + "/" + all[i], ec);
    } catch (const std::exception& e) {
      error = e.what();
      removeTmp();
    }
  }
  agree(world_, error, "checkpoint save to " + finalDir);
  if (r == 0) MT_LOG_INFO << "checkpoint " << finalDir << " written in " << formatDuration(sw.elapsed());
  return finalDir;
}

void CheckpointManager::verify(const std::string& path, int64_t modelNumel) {
  try {
    verifyMeta(path, modelNumel);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type or missing ("crc32": "x"): corrupt, like a bad payload.
    throw CheckpointError("checkpoint " + path + ": meta.json is malformed (" + e.what() + ")");
  }
}

void CheckpointManager::verifyMeta(const std::string& path, int64_t modelNumel) {
  nlohmann::json meta = readMeta(path);
  if (meta.value("numel", int64_t{-1}) != modelNumel)
    throw CheckpointError("checkpoint " + path + " holds " + std::to_string(meta.value("numel", int64_t{-1})) +
                          " parameters, the model has " + std::to_string(modelNumel) + " (another model?)");
  const auto names = meta["state_names"].get<std::vector<std::string>>();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& f : meta["files"]) {
    const std::string file = path + "/" + f["name"].get<std::string>();
    uint32_t crc = 0;
    try {
      H5File h = H5File::open(file);
      Tensor offs = h.readTensor("/pieces/offsets"), lens = h.readTensor("/pieces/lengths");
      for (int64_t i = 0; i < offs.numel(); ++i) ranges.emplace_back(offs.data<int64_t>()[i], lens.data<int64_t>()[i]);
      Tensor v = h.readTensor("/value");
      crc = crc32Of(v.rawData(), v.nbytes());
      for (const auto& n : names) {
        Tensor s = h.readTensor("/state/" + n);
        crc = crc32Of(s.rawData(), s.nbytes(), crc);
      }
    } catch (const Error& e) {
      throw CheckpointError("checkpoint " + path + ": " + f["name"].get<std::string>() + " is unreadable: " + e.what());
    }
    if (crc != static_cast<uint32_t>(f["crc32"].get<int64_t>()))
      throw CheckpointError("checkpoint " + path + ": " + f["name"].get<std::string>() +
                            " does not match its checksum (corrupt or truncated)");
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& rg : ranges) {
    if (rg.first != covered)
      throw CheckpointError("checkpoint " + path + ": parameters [" + std::to_string(covered) + ", " +
                            std::to_string(rg.first) + ") are in no file");
    covered += rg.second;
  }
  if (covered != modelNumel) throw CheckpointError("checkpoint " + path + ": its files cover " + std::to_string(covered) + " of " + std::to_string(modelNumel) + " parameters");
}

std::string CheckpointManager::findLatestValid() {
  // Rank 0 decides (it reads every file once); the choice, or the reason to refuse, is broadcast,
  // so an unexpected error on rank 0 can never leave the others waiting in the broadcast.
  std::string chosen, error;
  if (world_.rank() == 0 && fs::exists(dir_)) {
    try {
      std::vector<std::string> all, rejected;
      for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("step_", 0) == 0) {
          if (n.find(".tmp-") != std::string::npos) {
            std::error_code ec;
            fs::remove_all(e.path(), ec);  // left by a crashed save
            MT_LOG_WARN << "removed incomplete checkpoint " << e.path().string();
            continue;
          }
          all.push_back(n);
        }
      }
      std::sort(all.rbegin(), all.rend());
      for (const auto& n : all) {
        const std::string p = dir_ + "/" + n;
        try {
          nlohmann::json meta = readMeta(p);
          verify(p, meta.value("numel", int64_t{-1}));
          chosen = p;
          break;
        } catch (const std::exception& e) {
          rejected.push_back(e.what());
          MT_LOG_WARN << e.what() << "; falling back to an older checkpoint";
        }
      }
      if (chosen.empty() && !rejected.empty()) {
        // Starting from step 0 would overwrite the run's metrics and, at the next save, its
        // checkpoints: refuse and say what was rejected.
        error = "every checkpoint in " + dir_ + " is unusable:";
        for (const auto& why : rejected) error += "\n  - " + why;
        error += "\nrefusing to start over them: move them away, or set checkpoint.resume = never to start fresh";
      }
    } catch (const std::exception& e) {
      error = "reading the checkpoints in " + dir_ + ": " + e.what();
    }
  }
  std::string msg = error.empty() ? "P" + chosen : "E" + error;
  Tensor buf = Tensor::zeros({8192}, DType::kU8);
  if (world_.rank() == 0) std::memcpy(buf.rawData(), msg.data(), std::min<size_t>(msg.size(), 8191));
  world_.broadcast(buf, 0)->wait(world_.timeout());
  msg = reinterpret_cast<const char*>(buf.rawData());
  if (!msg.empty() && msg[0] == 'E') throw CheckpointError(msg.substr(1));
  return msg.empty() ? std::string() : msg.substr(1);
}

void CheckpointManager::exportConsolidated(const std::string& path, const std::string& out) {
  nlohmann::json meta = readMeta(path);
  const int64_t numel = meta.value("numel", int64_t{0});
  verify(path, numel);
  Tensor flat = Tensor::empty({numel}, DType::kF32);
  for (const auto& f : meta["files"]) {
    H5File h = H5File::open(path + "/" + f["name"].get<std::string>());
    Tensor offs = h.readTensor("/pieces/offsets"), lens = h.readTensor("/pieces/lengths"), v = h.readTensor("/value");
    int64_t cursor = 0;
    for (int64_t i = 0; i < offs.numel(); ++i) {
      const int64_t o = offs.data<int64_t>()[i], n = lens.data<int64_t>()[i];
      flat.flatSlice(o, n).copyFrom(v.flatSlice(cursor, n));
      cursor += n;
    }
  }
  H5Writer w(out);
  w.writeStringAttribute("/", "format", "meshtrain-parameters");
  w.writeStringAttribute("/", "source", path);
  w.writeIntAttribute("/", "step", meta.value("step", int64_t{0}));
  // What a reader needs to rebuild the model from this file alone (docs/data-format.md).
  if (meta.contains("architecture")) w.writeStringAttribute("/", "architecture", meta["architecture"].dump());
  for (const auto& p : meta["params"]) {
    Shape shape = p["shape"].get<Shape>();
    Tensor t = flat.flatSlice(p["offset"].get<int64_t>(), shapeNumel(shape)).view(shape).clone();
    w.write("/params/" + p["name"].get<std::string>(), t);
  }
  w.close();
}

void CheckpointManager::prepare() {
  std::string error;
  if (world_.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) error = "checkpoint.dir: cannot create " + dir_ + ": " + ec.message();
    else if (!fs::is_directory(dir_, ec)) error = "checkpoint.dir: " + dir_ + " is not a directory";
  }
  const double bad = world_.allReduceScalar(error.empty() ? 0.0 : 1.0, ReduceOp::kMax);
  if (bad > 0) {
    Tensor msg = Tensor::zeros({2048}, DType::kU8);
    if (world_.rank() == 0) std::memcpy(msg.rawData(), error.data(), std::min<size_t>(error.size(), 2047));
    world_.broadcast(msg, 0)->wait(world_.timeout());
    throw ConfigError(reinterpret_cast<const char*>(msg.rawData()));
  }
}

TrainState CheckpointManager::load(const std::string& path, Optimizer& opt, int64_t modelNumel) {
  std::string error;
  if (world_.rank() == 0) {
    try {
      verify(path, modelNumel);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  {
    // Checkpoint problems are bad input: exit 2 on every rank with rank 0's message.
    const double bad = world_.allReduceScalar(error.empty() ? 0.0 : 1.0, ReduceOp::kMax);
    if (bad > 0) {
      Tensor msg = Tensor::zeros({2048}, DType::kU8);
      if (world_.rank() == 0) std::memcpy(msg.rawData(), error.data(), std::min<size_t>(error.size(), 2047));
      world_.broadcast(msg, 0)->wait(world_.timeout());
      throw CheckpointError(reinterpret_cast<const char*>(msg.rawData()));
    }
  }
  nlohmann::json meta = readMeta(path);
  const auto names = meta["state_names"].get<std::vector<std::string>>();
  auto states = opt.state();
  if (names.size() != states.size())
    throw CheckpointError("checkpoint " + path + " was written with another optimizer (" + std::to_string(names.size()) +
                          " state buffers, this one has " + std::to_string(states.size()) + ")");
  struct Source {
    std::unique_ptr<H5File> file;
    std::vector<int64_t> offsets, lengths, starts;
    std::unique_ptr<RowReader> value;
    std::vector<std::unique_ptr<RowReader>> state;
  };
  std::vector<Source> sources;
  for (const auto& f : meta["files"]) {
    Source s;
    s.file = std::make_unique<H5File>(H5File::open(path + "/" + f["name"].get<std::string>()));
    Tensor o = s.file->readTensor("/pieces/offsets"), l = s.file->readTensor("/pieces/lengths");
    int64_t start = 0;
    for (int64_t i = 0; i < o.numel(); ++i) {
      s.offsets.push_back(o.data<int64_t>()[i]);
      s.lengths.push_back(l.data<int64_t>()[i]);
      s.starts.push_back(start);
      start += l.data<int64_t>()[i];
    }
    s.value = std::make_unique<RowReader>(*s.file, s.file->describe("/value"));
    for (const auto& n : names) s.state.push_back(std::make_unique<RowReader>(*s.file, s.file->describe("/state/" + n)));
    sources.push_back(std::move(s));
  }
  std::vector<Tensor> stateHost;
  for (auto& kv : states) stateHost.push_back(hostCopy(kv.second));
  const auto& segs = opt.segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t g0 = segs[i].globalOffset, n = segs[i].value.numel();
    Tensor v = Tensor::empty({n}, DType::kF32);
    int64_t filled = 0;
    for (auto& s : sources)
      for (size_t k = 0; k < s.offsets.size(); ++k) {
        const int64_t a = std::max(g0, s.offsets[k]), b = std::min(g0 + n, s.offsets[k] + s.lengths[k]);
        if (a >= b) continue;
        const int64_t rowInFile = s.starts[k] + (a - s.offsets[k]);
        s.value->readRows(rowInFile, b - a, v.data<float>() + (a - g0));
        for (size_t q = 0; q < s.state.size(); ++q)
          s.state[q]->readRows(rowInFile, b - a, stateHost[q].data<float>() + opt.stateOffset(i) + (a - g0));
        filled += b - a;
      }
    if (filled != n) throw CheckpointError("checkpoint " + path + " lacks parameters of segment " + std::to_string(i));
    Tensor dst = segs[i].value;
    dst.copyFrom(v);
  }
  for (size_t q = 0; q < states.size(); ++q)
    if (!stateHost[q].sharesStorageWith(states[q].second)) states[q].second.copyFrom(stateHost[q]);
  TrainState st;
  st.step = meta.value("step", int64_t{0});
  st.loaderSeq = meta.value("loader_seq", int64_t{0});
  st.lossScale = meta.value("loss_scale", 0.f);
  st.scalerClean = meta.value("scaler_clean", int64_t{0});
  st.seed = meta.value("seed", uint64_t{0});
  st.strategy = meta.value("strategy", std::string("no_shard"));
  opt.setStepCount(meta.value("optimizer_steps", st.step));
  world_.barrierSync();
  return st;
}

}  // namespace mt
