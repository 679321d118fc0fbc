#include "launch/CheckpointFile.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "data/RowReader.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

constexpr size_t kReadBytes = size_t{16} << 20;  // checksums stream a dataset this much at a time
constexpr const char* kCompressionAttr = "compression_state";

uint32_t crcOfTensor(const Tensor& t, uint32_t crc) {
  return crc32Of(t.rawData(), t.nbytes(), crc);
}

// A dataset's checksum, read kReadBytes at a time; `out` (its whole size), when given, receives it.
uint32_t crcOfDataset(const H5File& file, const std::string& name, uint32_t crc, void* out = nullptr) {
  RowReader reader(file, file.describe(name));
  const int64_t rows = reader.rows();
  const size_t rowBytes = std::max<size_t>(1, reader.rowBytes());
  const int64_t step = static_cast<int64_t>(std::max<size_t>(1, kReadBytes / rowBytes));
  std::vector<char> buffer(out ? 0 : static_cast<size_t>(std::min(rows, step)) * rowBytes);
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    char* dst = out ? static_cast<char*>(out) + static_cast<size_t>(start) * rowBytes : buffer.data();
    reader.readRows(start, n, dst);
    crc = crc32Of(dst, static_cast<size_t>(n) * rowBytes, crc);
  }
  return crc;
}

// A dataset that must be `type`, one-dimensional with `rows` rows (rows < 0: any).
void requireDataset(const H5File& file, const std::string& name, const std::string& type, int64_t rows,
                    const std::string& where) {
  if (!file.hasDataset(name)) throw CheckpointError(where + " has no dataset " + name);
  const H5DatasetInfo info = file.describe(name);
  if (info.type != type || info.shape.size() != 1 || (rows >= 0 && info.shape[0] != rows))
    throw CheckpointError(where + ": " + name + " is " + info.type + " of shape " + shapeStr(info.shape) +
                          ", not " + type +
                          (rows >= 0 ? " [" + std::to_string(rows) + "]" : std::string(" (1-D)")));
}

}  // namespace

void fsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IoError("fsync of " + path + " failed: " + std::strerror(errno));
}

std::pair<uint32_t, int64_t> writeRankFile(const std::string& path, const RankFileContent& c) {
  // The checksum in the order the header states (what verifyRankFile streams back).
  uint32_t crc = crcOfTensor(c.lengths, crcOfTensor(c.offsets, 0));
  crc = crcOfTensor(c.value, crc);
  int64_t payload = static_cast<int64_t>(c.value.nbytes());
  for (const auto& s : c.state) {
    crc = crcOfTensor(s.second, crc);
    payload += static_cast<int64_t>(s.second.nbytes());
  }
  nlohmann::json names = nlohmann::json::array();
  for (const auto& s : c.compression)
    names.push_back(s.first);
  const std::string list = c.compression.empty() ? std::string() : names.dump();
  crc = crc32Of(list.data(), list.size(), crc);
  for (const auto& s : c.compression) {
    crc = crcOfTensor(s.second, crc);
    payload += static_cast<int64_t>(s.second.nbytes());
  }
  H5Writer w(path);
  w.write("/pieces/offsets", c.offsets);
  w.write("/pieces/lengths", c.lengths);
  w.write("/value", c.value);
  for (const auto& s : c.state)
    w.write("/state/" + s.first, s.second);
  for (const auto& s : c.compression)
    w.write("/compression/" + s.first, s.second);
  if (!list.empty()) w.writeStringAttribute("/", kCompressionAttr, list);
  w.close();
  fsyncPath(path, false);
  return {crc, payload};
}

PieceIndex readPieceIndex(const H5File& file, const CheckpointMeta& meta, const std::string& where) {
  requireDataset(file, "/pieces/offsets", "i64", -1, where);
  const int64_t count = file.describe("/pieces/offsets").shape[0];
  // Every piece holds at least one parameter: more pieces than parameters is no index.
  if (count > meta.numel)
    throw CheckpointError(where + " lists " + std::to_string(count) + " pieces of a " +
                          std::to_string(meta.numel) + "-parameter model");
  requireDataset(file, "/pieces/lengths", "i64", count, where);
  const Tensor offs = file.readTensor("/pieces/offsets"), lens = file.readTensor("/pieces/lengths");
  PieceIndex idx;
  std::vector<std::pair<int64_t, int64_t>> sorted;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t o = offs.data<int64_t>()[k], n = lens.data<int64_t>()[k];
    if (o < 0 || n <= 0 || o > meta.numel - n)
      throw CheckpointError(where + ": piece " + std::to_string(k) + " [" + std::to_string(o) + ", +" +
                            std::to_string(n) + ") lies outside the checkpoint's " +
                            std::to_string(meta.numel) + " parameters");
    idx.offsets.push_back(o);
    idx.lengths.push_back(n);
    idx.starts.push_back(idx.total);
    idx.total += n;  // no overflow: each piece is within numel, and they may not overlap (below)
    sorted.emplace_back(o, n);
    if (idx.total > meta.numel)
      throw CheckpointError(where + ": its pieces hold more than the checkpoint's " +
                            std::to_string(meta.numel) + " parameters");
  }
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 1; k < sorted.size(); ++k)
    if (sorted[k].first < sorted[k - 1].first + sorted[k - 1].second)
      throw CheckpointError(where + ": two pieces overlap at parameter " + std::to_string(sorted[k].first));
  requireDataset(file, "/value", "f32", idx.total, where);
  for (const auto& n : meta.stateNames)
    requireDataset(file, "/state/" + n, "f32", idx.total, where);
  return idx;
}

std::vector<std::string> compressionStateNames(const H5File& file, const std::string& where) {
  const std::string text = file.readStringAttribute("/", kCompressionAttr);
  std::vector<std::string> names;
  if (text.empty()) return names;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array())
    throw CheckpointError(where + ": attribute " + kCompressionAttr + " is not a JSON array of names");
  for (const auto& n : j) {
    const std::string name = n.is_string() ? n.get<std::string>() : std::string();
    const bool known = name.rfind("error/", 0) == 0 || name.rfind("q/", 0) == 0;
    if (!known || name.find("..") != std::string::npos || !file.hasDataset("/compression/" + name))
      throw CheckpointError(where + ": compressor state " +
                            n.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                            " is not a dataset of the file");
    const H5DatasetInfo info = file.describe("/compression/" + name);
    if (info.type != "f32")
      throw CheckpointError(where + ": compressor state " + name + " is " + info.type + ", not f32");
    names.push_back(name);
  }
  return names;
}

PieceIndex verifyRankFile(const std::string& dir, const CheckpointMeta& meta, size_t q,
                          std::vector<float>* value) {
  const CheckpointFile& entry = meta.files.at(q);
  const std::string where = "checkpoint " + dir + ": " + entry.name;
  return readingCheckpoint(where, [&] {
    const H5File file = H5File::open(dir + "/" + entry.name);
    PieceIndex idx = readPieceIndex(file, meta, where);
    uint32_t crc = 0;
    if (meta.version >= 2)
      crc = crcOfDataset(file, "/pieces/lengths", crcOfDataset(file, "/pieces/offsets", crc));
    if (value) value->resize(static_cast<size_t>(idx.total));
    crc = crcOfDataset(file, "/value", crc, value ? value->data() : nullptr);
    for (const auto& n : meta.stateNames)
      crc = crcOfDataset(file, "/state/" + n, crc);
    if (meta.version >= 2) {
      const std::vector<std::string> names = compressionStateNames(file, where);
      const std::string list = file.readStringAttribute("/", kCompressionAttr);
      crc = crc32Of(list.data(), list.size(), crc);
      for (const auto& n : names)
        crc = crcOfDataset(file, "/compression/" + n, crc);
    }
    if (crc != entry.crc32)
      throw CheckpointError(where + " does not match its checksum (corrupt or truncated)");
    return idx;
  });
}

namespace {

// Every parameter in exactly one file's pieces, checked from the indexes alone (before a buffer of
// the model's size is allocated: a forged numel allocates nothing).
void checkCoverage(const std::string& dir, const CheckpointMeta& meta) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& f : meta.files) {
    const std::string where = "checkpoint " + dir + ": " + f.name;
    const PieceIndex idx = readingCheckpoint(
        where, [&] { return readPieceIndex(H5File::open(dir + "/" + f.name), meta, where); });
    for (size_t k = 0; k < idx.offsets.size(); ++k)
      ranges.emplace_back(idx.offsets[k], idx.lengths[k]);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& r : ranges) {
    if (r.first != covered)
      throw CheckpointError("checkpoint " + dir + ": parameters [" + std::to_string(covered) + ", " +
                            std::to_string(r.first) + ") are in no file, or in two");
    covered += r.second;
  }
  if (covered != meta.numel)
    throw CheckpointError("checkpoint " + dir + ": its files cover " + std::to_string(covered) + " of " +
                          std::to_string(meta.numel) + " parameters");
}

}  // namespace

ConsolidatedCheckpoint consolidateCheckpoint(const std::string& dir) {
  ConsolidatedCheckpoint c;
  c.meta = readCheckpointMeta(dir);
  checkCoverage(dir, c.meta);
  c.flat.resize(static_cast<size_t>(c.meta.numel));
  std::vector<float> value;
  for (size_t q = 0; q < c.meta.files.size(); ++q) {
    const PieceIndex idx = verifyRankFile(dir, c.meta, q, &value);
    for (size_t k = 0; k < idx.offsets.size(); ++k)
      std::copy_n(value.begin() + idx.starts[k], idx.lengths[k], c.flat.begin() + idx.offsets[k]);
  }
  return c;
}

Tensor ConsolidatedCheckpoint::param(const CheckpointParam& p) {
  return Tensor::fromBlob(flat.data() + p.offset, p.shape, DType::kF32);
}

void exportConsolidated(const std::string& dir, const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    throw ConfigError("export: --out " + out + " exists and is not a regular file");
  ConsolidatedCheckpoint c = consolidateCheckpoint(dir);
  const CheckpointMeta& meta = c.meta;
  const std::vector<float>& flat = c.flat;
  const std::string tmp = out + ".tmp-" + std::to_string(::getpid());
  try {
    H5Writer w(tmp);
    w.writeStringAttribute("/", "format", "meshtrain-parameters");
    w.writeStringAttribute("/", "source", dir);
    w.writeIntAttribute("/", "step", meta.state.step);
    // What a reader needs to rebuild the model from this file alone (docs/data-format.md).
    if (!meta.identity.architecture.empty())
      w.writeStringAttribute("/", "architecture", meta.identity.architecture);
    for (const auto& p : meta.params) {
      Tensor t = Tensor::empty(p.shape, DType::kF32);
      std::copy_n(flat.begin() + p.offset, t.numel(), t.data<float>());
      w.write("/params/" + p.name, t);
    }
    w.close();
    fsyncPath(tmp, false);
    fs::rename(tmp, out, ec);
    if (ec) throw IoError("cannot rename " + tmp + " to " + out + ": " + ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace mt
