#include "launch/CheckpointMeta.h"

#include <zlib.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/Compression.h"
#include "core/Error.h"
#include "core/Files.h"
#include "sharding/ShardedEngine.h"

namespace mt {

namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr int64_t kMaxCount = int64_t{1} << 50;  // steps, batches, parameters: far beyond any run
constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr uintmax_t kMaxMetaBytes = uintmax_t{64} << 20;

uint32_t checksumOf(const Json& body) {
  const std::string text = body.dump();  // keys sorted: the same bytes for the same content
  return crc32Of(text.data(), text.size());
}

// A value as the message shows it: short, and printable whatever the file held.
std::string shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// Typed, range-checked access to meta.json's fields; every failure names the file and the key.
class Fields {
 public:
  explicit Fields(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw CheckpointError(where_ + ": '" + key + "' " + what);
  }
  const Json& at(const Json& j, const std::string& name, const std::string& key) const {
    auto it = j.find(name);
    if (it == j.end()) fail(key, "is missing");
    return *it;
  }
  int64_t integer(const Json& v, const std::string& key, int64_t lo, int64_t hi) const {
    // 12.0 and 1e300 are floats to the parser: refused like strings (llround of 1e300 is INT64_MIN).
    bool ok = false;
    if (v.is_number_unsigned())
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(hi) && v.get<int64_t>() >= lo;
    else if (v.is_number_integer())
      ok = v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (!ok)
      fail(key,
           "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " + shown(v));
    return v.get<int64_t>();
  }
  int64_t integer(const Json& j, const std::string& name, const std::string& key, int64_t lo,
                  int64_t hi) const {
    return integer(at(j, name, key), key, lo, hi);
  }
  double number(const Json& j, const std::string& name, const std::string& key, double lo, double hi) const {
    const Json& v = at(j, name, key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
      fail(key, "must be a number in [" + shown(Json(lo)) + ", " + shown(Json(hi)) + "], not " + shown(v));
    return v.get<double>();
  }
  std::string string(const Json& v, const std::string& key, size_t maxLength) const {
    if (!v.is_string() || v.get_ref<const std::string&>().size() > maxLength)
      fail(key, "must be a string of at most " + std::to_string(maxLength) + " characters, not " + shown(v));
    return v.get<std::string>();
  }
  std::string string(const Json& j, const std::string& name, const std::string& key, size_t maxLength) const {
    return string(at(j, name, key), key, maxLength);
  }
  const Json& array(const Json& j, const std::string& name, const std::string& key, size_t maxSize) const {
    const Json& v = at(j, name, key);
    if (!v.is_array() || v.size() > maxSize)
      fail(key, "must be an array of at most " + std::to_string(maxSize) + " entries, not " + shown(v));
    return v;
  }
  const Json& object(const Json& v, const std::string& key) const {
    if (!v.is_object()) fail(key, "must be an object, not " + shown(v));
    return v;
  }

 private:
  std::string where_;
};

// Names that become HDF5 paths (/state/<name>, /params/<name>): no separators, nothing unprintable.
bool plainName(const std::string& s, bool dotsAllowed) {
  if (s.empty() || s == "." || s == "..") return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '-' || (dotsAllowed && c == '.'))) return false;
  return true;
}

void parseParams(const Fields& f, const Json& j, CheckpointMeta& m) {
  const Json& params = f.array(j, "params", "params", size_t{1} << 24);
  if (params.empty()) f.fail("params", "is empty: the checkpoint names no parameters");
  std::set<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = "params[" + std::to_string(i) + "]";
    const Json& p = f.object(params[i], key);
    CheckpointParam cp;
    cp.name = f.string(p, "name", key + ".name", 512);
    if (!plainName(cp.name, true)) f.fail(key + ".name", "is not a parameter name: " + shown(p["name"]));
    if (!names.insert(cp.name).second) f.fail(key + ".name", "repeats " + cp.name);
    const Json& shape = f.array(p, "shape", key + ".shape", 8);
    int64_t numel = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t n = f.integer(shape[d], key + ".shape", 0, m.numel);
      numel = n == 0 ? 0 : (numel > m.numel / n ? m.numel + 1 : numel * n);
      cp.shape.push_back(n);
    }
    cp.offset = f.integer(p, "offset", key + ".offset", 0, m.numel);
    if (numel > m.numel - cp.offset)
      f.fail(key, cp.name + " (" + std::to_string(numel) + " elements at offset " +
                      std::to_string(cp.offset) + ") lies beyond the checkpoint's " +
                      std::to_string(m.numel) + " parameters");
    ranges.emplace_back(cp.offset, numel);
    m.params.push_back(std::move(cp));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].first + ranges[i - 1].second)
      f.fail("params", "two parameters overlap at offset " + std::to_string(ranges[i].first));
}

void parseFiles(const Fields& f, const Json& j, CheckpointMeta& m) {
  const Json& files = f.array(j, "files", "files", static_cast<size_t>(kMaxWorld));
  if (files.size() != static_cast<size_t>(m.worldSize))
    f.fail("files",
           "lists " + std::to_string(files.size()) + " files for world_size " + std::to_string(m.worldSize));
  for (size_t q = 0; q < files.size(); ++q) {
    const std::string key = "files[" + std::to_string(q) + "]";
    const Json& e = f.object(files[q], key);
    CheckpointFile cf;
    cf.name = f.string(e, "name", key + ".name", 64);
    // Only the names save() writes: a file name from meta.json never leaves the checkpoint.
    if (cf.name != "rank" + std::to_string(q) + ".h5")
      f.fail(key + ".name", "must be rank" + std::to_string(q) + ".h5, not " + shown(e["name"]));
    cf.crc32 = static_cast<uint32_t>(f.integer(e, "crc32", key + ".crc32", 0, 0xffffffffll));
    cf.payloadBytes = f.integer(e, "payload_bytes", key + ".payload_bytes", 0, int64_t{1} << 62);
    m.files.push_back(cf);
  }
}

void parseIdentity(const Fields& f, const Json& j, CheckpointMeta& m) {
  auto arch = j.find("architecture");
  if (arch != j.end()) m.identity.architecture = f.object(*arch, "architecture").dump();
  if (m.version < 2) return;
  auto data = j.find("data");
  if (data != j.end()) {
    f.object(*data, "data");
    m.identity.dataPath = f.string(*data, "path", "data.path", 4096);
    m.identity.trainSplit = f.string(*data, "train_split", "data.train_split", 256);
    m.identity.globalBatch = f.integer(*data, "batch_size", "data.batch_size", 1, kMaxCount);
  }
  if (j.contains("run_dir")) m.identity.runDir = f.string(j, "run_dir", "run_dir", 4096);
  auto comp = j.find("compression");
  if (comp != j.end()) {
    m.compression = f.string(*comp, "compression", 32);
    CompressionMethod method;
    if (!parseEnum(compressionMethods(), m.compression, &method) || method == CompressionMethod::kNone)
      f.fail("compression", "names no compression method: " + shown(*comp));
  }
}

// "fp8": {"names": [...], "ranks": [[casts, bits...] per rank]}: names unique, every rank's list
// the same length, a whole number of states of at least [scale, scaleInv, amax, h_0] each.
void parseFp8(const Fields& f, const Json& j, CheckpointMeta& m) {
  auto it = j.find("fp8");
  if (it == j.end()) return;
  const Json& o = f.object(*it, "fp8");
  const Json& names = f.array(o, "names", "fp8.names", 1 << 20);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string key = "fp8.names[" + std::to_string(i) + "]";
    m.state.fp8Names.push_back(f.string(names[i], key, 256));
    if (!plainName(m.state.fp8Names.back(), true)) f.fail(key, "is not a state name: " + shown(names[i]));
  }
  std::vector<std::string> sorted = m.state.fp8Names;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) f.fail("fp8.names", "repeat a name");
  const Json& ranks = f.array(o, "ranks", "fp8.ranks", static_cast<size_t>(m.worldSize));
  if (static_cast<int>(ranks.size()) != m.worldSize)
    f.fail("fp8.ranks", "must hold world_size (" + std::to_string(m.worldSize) + ") lists");
  const size_t n = names.size();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string key = "fp8.ranks[" + std::to_string(r) + "]";
    const Json& v = ranks[r];
    // Per state: the cast count, then [scale, scaleInv, amax] and 1..1024 history values.
    if (!v.is_array() || n == 0 || v.size() % n != 0 || v.size() / n < 5 || v.size() / n > 1028 ||
        (r > 0 && v.size() != m.fp8Ranks[0].size()))
      f.fail(key,
             "must be a list of a whole number of states (5 to 1028 values each) per name, as long as "
             "fp8.ranks[0]");
    std::vector<int64_t> vals(v.size());
    const size_t per = v.size() / n;
    for (size_t k = 0; k < v.size(); ++k)
      vals[k] = f.integer(v[k], key, 0, k % per == 0 ? kMaxCount : 0xffffffffll);
    m.fp8Ranks.push_back(std::move(vals));
  }
}

CheckpointMeta parseChecked(const Fields& f, const Json& j) {
  CheckpointMeta m;
  m.version = static_cast<int>(f.integer(j, "version", "version", 1, 1 << 30));
  if (m.version < kOldestCheckpointVersion || m.version > kCheckpointVersion)
    f.fail("version", "is " + std::to_string(m.version) + "; this trainer reads checkpoint versions " +
                          std::to_string(kOldestCheckpointVersion) + " to " +
                          std::to_string(kCheckpointVersion) + " (written by another meshtrain?)");
  TrainState& st = m.state;
  st.step = f.integer(j, "step", "step", 0, kMaxCount);
  m.optimizerSteps = f.integer(j, "optimizer_steps", "optimizer_steps", 0, kMaxCount);
  st.loaderSeq = f.integer(j, "loader_seq", "loader_seq", 0, kMaxCount);
  st.lossScale = static_cast<float>(f.number(j, "loss_scale", "loss_scale", 0.0, FLT_MAX));
  st.scalerClean = f.integer(j, "scaler_clean", "scaler_clean", 0, kMaxCount);
  if (j.contains("scaler_skipped"))
    st.scalerSkipped = f.integer(j, "scaler_skipped", "scaler_skipped", 0, kMaxCount);
  const Json& seed = f.at(j, "seed", "seed");
  if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0))
    f.fail("seed", "must be a non-negative integer, not " + shown(seed));
  st.seed = seed.get<uint64_t>();
  st.strategy = f.string(j, "strategy", "strategy", 32);
  ShardStrategy strategy;
  if (!parseShardStrategy(st.strategy, &strategy))
    f.fail("strategy", "names no sharding strategy: " + shown(j["strategy"]));
  m.worldSize = static_cast<int>(f.integer(j, "world_size", "world_size", 1, kMaxWorld));
  m.numel = f.integer(j, "numel", "numel", 1, kMaxCount);
  if (j.contains("time")) m.time = f.number(j, "time", "time", 0.0, 1e12);
  const Json& names = f.array(j, "state_names", "state_names", 16);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string key = "state_names[" + std::to_string(i) + "]";
    m.stateNames.push_back(f.string(names[i], key, 64));
    if (!plainName(m.stateNames.back(), false)) f.fail(key, "is not a state name: " + shown(names[i]));
    if (std::count(m.stateNames.begin(), m.stateNames.end(), m.stateNames.back()) > 1) f.fail(key, "repeats");
  }
  parseParams(f, j, m);
  parseFiles(f, j, m);
  parseIdentity(f, j, m);
  // Quantization-aware training's observers (models/quant/QuantizedModel checks the contents).
  const auto qat = j.find("qat");
  if (qat != j.end()) st.qat = f.object(*qat, "qat").dump();
  parseFp8(f, j, m);
  return m;
}

}  // namespace

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

std::string CheckpointMeta::toJson() const {
  Json j;
  j["format"] = kFormat;
  j["version"] = version;
  j["step"] = state.step;
  j["optimizer_steps"] = optimizerSteps;
  j["loader_seq"] = state.loaderSeq;
  j["loss_scale"] = state.lossScale;
  j["scaler_clean"] = state.scalerClean;
  j["scaler_skipped"] = state.scalerSkipped;
  j["seed"] = state.seed;
  j["strategy"] = state.strategy;
  if (!state.qat.empty()) j["qat"] = Json::parse(state.qat);
  j["world_size"] = worldSize;
  j["numel"] = numel;
  j["time"] = time;
  j["state_names"] = stateNames;
  Json ps = Json::array();
  for (const auto& p : params)
    ps.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
  j["params"] = ps;
  if (!identity.architecture.empty()) j["architecture"] = Json::parse(identity.architecture);
  if (!identity.dataPath.empty() || identity.globalBatch > 0)
    j["data"] = {{"path", identity.dataPath},
                 {"train_split", identity.trainSplit},
                 {"batch_size", identity.globalBatch}};
  if (!identity.runDir.empty()) j["run_dir"] = identity.runDir;
  if (!compression.empty()) j["compression"] = compression;
  if (!fp8Ranks.empty()) j["fp8"] = {{"names", state.fp8Names}, {"ranks", fp8Ranks}};
  Json fs = Json::array();
  for (const auto& f : files)
    fs.push_back({{"name", f.name}, {"crc32", f.crc32}, {"payload_bytes", f.payloadBytes}});
  j["files"] = fs;
  j["meta_crc32"] = checksumOf(j);
  return j.dump(2) + "\n";
}

CheckpointMeta parseCheckpointMeta(const std::string& text, const std::string& dir) {
  const std::string where = "checkpoint " + dir + ": meta.json";
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw CheckpointError(where + " is corrupt (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    throw CheckpointError("checkpoint " + dir + ": not a meshtrain checkpoint (meta.json has no format \"" +
                          std::string(kFormat) + "\")");
  // meta.json carries a checksum of itself (without that field): an edited step or file list is
  // refused like a corrupt payload, and so is a meta.json without one (every version writes it).
  const Fields f(where);
  const int64_t stored = f.integer(f.at(j, "meta_crc32", "meta_crc32"), "meta_crc32", 0, 0xffffffffll);
  Json body = j;
  body.erase("meta_crc32");
  if (static_cast<uint32_t>(stored) != checksumOf(body))
    throw CheckpointError(where + " does not match its checksum (edited or corrupt)");
  return parseChecked(f, j);
}

CheckpointMeta readCheckpointMeta(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = dir + "/meta.json";
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw CheckpointError("checkpoint " + dir +
                          ": meta.json is missing (not a checkpoint, or an incomplete one)");
  if (!fs::is_regular_file(path, ec))
    throw CheckpointError("checkpoint " + dir + ": meta.json is not a regular file");
  const uintmax_t bytes = fs::file_size(path, ec);
  if (ec || bytes > kMaxMetaBytes)
    throw CheckpointError("checkpoint " + dir + ": meta.json is " + std::to_string(bytes) +
                          " bytes, more than " + std::to_string(kMaxMetaBytes >> 20) +
                          " MiB (not a meta.json)");
  std::string text;
  if (!readWholeFile(path, &text)) throw CheckpointError("checkpoint " + dir + ": cannot read meta.json");
  return parseCheckpointMeta(text, dir);
}

}  // namespace mt
