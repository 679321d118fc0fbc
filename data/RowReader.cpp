#include "data/RowReader.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mt {

const std::vector<char>* ChunkCache::find(Key chunk) {
  auto it = map_.find(chunk);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->second;
}

const std::vector<char>& ChunkCache::insert(Key chunk, std::vector<char> data) {
  bytes_ += data.size();
  lru_.emplace_front(chunk, std::move(data));
  map_[chunk] = lru_.begin();
  while (bytes_ > capacity_ && lru_.size() > 1) {
    bytes_ -= lru_.back().second.size();
    map_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return lru_.front().second;
}

RowReader::RowReader(const H5File& file, H5DatasetInfo info) : file_(&file), info_(std::move(info)) {
  if (!info_.unavailableFilters.empty())
    throw DataError("data file " + info_.file + ": dataset " + info_.name + " is compressed with HDF5 filter " +
                    info_.unavailableFilters[0] +
                    ", which this HDF5 cannot decode (rewrite it with gzip, or install the filter plugin)");
  rowBytes_ = static_cast<size_t>(info_.rowElements()) * info_.elementSize;
  direct_ = info_.directReadable();
  if (info_.storage == H5Storage::kChunked) {
    chunkBytes_ = static_cast<size_t>(shapeNumel(info_.chunkShape)) * info_.elementSize;
    const int64_t c0 = info_.chunkShape[0];
    const int64_t chunkRows = (rows() + c0 - 1) / c0;
    size_t expected = 1;
    for (size_t d = 0; d < info_.shape.size(); ++d) {
      gridDims_.push_back((info_.shape[d] + info_.chunkShape[d] - 1) / info_.chunkShape[d]);
      expected *= static_cast<size_t>(gridDims_.back());
    }
    size_t allocated = static_cast<size_t>(info_.allocatedChunks);
    if (info_.chunksListed) {
      allocated = 0;
      for (const auto& c : info_.chunks)
        allocated += c.address != HADDR_UNDEF;
    }
    sparse_ = allocated < expected;
    expectedChunks_ = expected;
    allocatedChunks_ = allocated;
    if (!info_.chunksListed) {
      if (direct_) dataset_ = file.openDataset(info_.name);
      return;
    }
    rowChunkBegin_.assign(static_cast<size_t>(chunkRows + 1), info_.chunks.size());
    for (size_t i = info_.chunks.size(); i-- > 0;)
      rowChunkBegin_[static_cast<size_t>(info_.chunks[i].origin[0] / c0)] = i;
    for (size_t k = rowChunkBegin_.size() - 1; k-- > 0;)
      rowChunkBegin_[k] = std::min(rowChunkBegin_[k], rowChunkBegin_[k + 1]);
  }
}

std::string RowReader::storageGap() const {
  if (shapeNumel(info_.shape) == 0) return "";
  if (info_.storage == H5Storage::kContiguous && info_.contiguousOffset == HADDR_UNDEF)
    return "no storage allocated (the dataset was created but never written)";
  if (info_.storage == H5Storage::kChunked && allocatedChunks_ < expectedChunks_)
    return std::to_string(allocatedChunks_) + " of " + std::to_string(expectedChunks_) + " chunks stored";
  return "";
}

void RowReader::preadAll(uint64_t offset, size_t bytes, char* dst) const {
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(file_->fd(), dst + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw DataError("data file " + info_.file + ": reading " + info_.name + " at byte " +
                      std::to_string(offset + done) + ": " + (n == 0 ? "unexpected end of file" : std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

void RowReader::readRows(int64_t start, int64_t count, void* dst, ChunkCache* cache) const {
  if (count <= 0) return;
  if (start < 0 || start + count > rows())
    throw DataError("data file " + info_.file + ": rows [" + std::to_string(start) + ", " +
                    std::to_string(start + count) + ") outside " + info_.name + " with " + std::to_string(rows()) +
                    " rows");
  char* out = static_cast<char*>(dst);
  if (!direct_) {
    std::lock_guard<std::mutex> lock(fallbackMutex_);
    file_->readRows(info_, start, count, out);
  } else if (info_.storage == H5Storage::kContiguous) {
    readContiguous(start, count, out);
  } else {
    readChunked(start, count, out, cache);
  }
}

void RowReader::readContiguous(int64_t start, int64_t count, char* dst) const {
  preadAll(info_.contiguousOffset + static_cast<uint64_t>(start) * rowBytes_, static_cast<size_t>(count) * rowBytes_,
           dst);
}

// HDF5's H5_checksum_fletcher32: 16-bit big-endian words, sums folded every 360 words, an odd
// last byte as the high half of a word.
uint32_t fletcher32(const char* bytes, size_t len) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes);
  size_t words = len / 2;
  uint32_t sum1 = 0, sum2 = 0;
  while (words) {
    size_t t = words > 360 ? 360 : words;
    words -= t;
    do {
      sum1 += (static_cast<uint32_t>(data[0]) << 8) | static_cast<uint32_t>(data[1]);
      data += 2;
      sum2 += sum1;
    } while (--t);
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  if (len % 2) {
    sum1 += static_cast<uint32_t>(*data) << 8;
    sum2 += sum1;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

std::vector<char> RowReader::decodeChunk(size_t index) const {
  const H5Chunk& c = info_.chunks[index];
  std::vector<char> raw(c.size);
  preadAll(c.address, c.size, raw.data());
  return decode(std::move(raw), c.filterMask, c.origin[0]);
}

std::vector<char> RowReader::fetchChunk(const std::vector<int64_t>& origin) const {
  std::vector<char> raw;
  uint32_t mask = 0;
  {
    std::lock_guard<std::mutex> lock(fallbackMutex_);
    if (!file_->readRawChunk(dataset_.get(), info_, origin, &raw, &mask)) return {};
  }
  return decode(std::move(raw), mask, origin[0]);
}

std::vector<char> RowReader::decode(std::vector<char> raw, uint32_t filterMask, int64_t row) const {
  const std::string at = "chunk at row " + std::to_string(row) + " of " + info_.name;
  // Undo the pipeline in reverse write order; bit i of the mask means filter i was skipped.
  for (size_t f = info_.filters.size(); f-- > 0;) {
    if (filterMask & (1u << f)) continue;
    switch (info_.filters[f]) {
      case H5Filter::kFletcher32: {
        // HDF5's filter appends the Fletcher-32 of the filtered bytes (little-endian); verify it
        // as the library does (h5py refuses such a chunk), accepting the byte-swapped form that
        // HDF5 before 1.6.4 wrote on big-endian machines.
        if (raw.size() < 4)
          throw DataError("data file " + info_.file + ": " + at +
                          " is too short for its Fletcher-32 checksum");
        const size_t n = raw.size() - 4;
        const auto* tail = reinterpret_cast<const unsigned char*>(raw.data() + n);
        const uint32_t stored = static_cast<uint32_t>(tail[0]) | static_cast<uint32_t>(tail[1]) << 8 |
                                static_cast<uint32_t>(tail[2]) << 16 | static_cast<uint32_t>(tail[3]) << 24;
        const uint32_t sum = fletcher32(raw.data(), n);
        const uint32_t swapped = ((sum & 0x00ff00ffu) << 8) | ((sum & 0xff00ff00u) >> 8);
        if (stored != sum && stored != swapped)
          throw DataError("data file " + info_.file + ": " + at +
                          " fails its Fletcher-32 checksum (corrupt file)");
        raw.resize(n);
        break;
      }
      case H5Filter::kDeflate: {
        std::vector<char> out(chunkBytes_);
        uLongf outLen = static_cast<uLongf>(out.size());
        int rc = ::uncompress(reinterpret_cast<Bytef*>(out.data()), &outLen,
                              reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()));
        if (rc != Z_OK || outLen != out.size())
          throw DataError("data file " + info_.file + ": cannot inflate " + at + " (zlib error " +
                          std::to_string(rc) + ")");
        raw.swap(out);
        break;
      }
      case H5Filter::kShuffle: {
        const size_t es = info_.elementSize, n = raw.size() / es;
        if (es > 1) {
          std::vector<char> out(raw.size());
          for (size_t b = 0; b < es; ++b)
            for (size_t i = 0; i < n; ++i) out[i * es + b] = raw[b * n + i];
          std::copy(raw.begin() + static_cast<std::ptrdiff_t>(n * es), raw.end(),
                    out.begin() + static_cast<std::ptrdiff_t>(n * es));
          raw.swap(out);
        }
        break;
      }
      case H5Filter::kOther: break;  // excluded by directReadable()
    }
  }
  if (raw.size() != chunkBytes_)
    throw DataError("data file " + info_.file + ": " + at + " decodes to " + std::to_string(raw.size()) +
                    " bytes, expected " + std::to_string(chunkBytes_));
  return raw;
}

template <class Load>
const std::vector<char>& RowReader::cached(size_t key, ChunkCache* cache, std::vector<char>* local,
                                           Load load) const {
  if (!cache) return *local = load();
  const ChunkCache::Key k{this, key};
  const std::vector<char>* hit = cache->find(k);
  return hit ? *hit : cache->insert(k, load());
}

void RowReader::readChunked(int64_t start, int64_t count, char* dst, ChunkCache* cache) const {
  if (sparse_) std::memset(dst, 0, static_cast<size_t>(count) * rowBytes_);
  if (!info_.chunksListed) return readUnlistedChunks(start, count, dst, cache);
  const int64_t c0 = info_.chunkShape[0];
  const int64_t end = start + count;
  std::vector<char> local;
  for (int64_t k = start / c0; k * c0 < end; ++k) {
    for (size_t ci = rowChunkBegin_[static_cast<size_t>(k)]; ci < rowChunkBegin_[static_cast<size_t>(k + 1)];
         ++ci) {
      const H5Chunk& c = info_.chunks[ci];
      if (c.address == HADDR_UNDEF) continue;
      const std::vector<char>& data = cached(ci, cache, &local, [&] { return decodeChunk(ci); });
      copyChunk(c.origin, data.data(), start, end, dst);
    }
  }
}

// The chunks of chunk-rows start/c0 .. (end-1)/c0, each found by its coordinates; the cache key
// is the chunk's row-major place in the grid.
void RowReader::readUnlistedChunks(int64_t start, int64_t count, char* dst, ChunkCache* cache) const {
  const size_t rank = info_.shape.size();
  const int64_t c0 = info_.chunkShape[0];
  const int64_t end = start + count;
  int64_t perRow = 1;  // chunks in one chunk-row
  for (size_t d = 1; d < rank; ++d)
    perRow *= gridDims_[d];
  std::vector<int64_t> origin(rank, 0);
  std::vector<char> local;
  for (int64_t k = start / c0; k * c0 < end; ++k) {
    for (int64_t g = 0; g < perRow; ++g) {
      origin[0] = k * c0;
      for (int64_t d = static_cast<int64_t>(rank) - 1, rest = g; d >= 1; --d) {
        origin[static_cast<size_t>(d)] =
            (rest % gridDims_[static_cast<size_t>(d)]) * info_.chunkShape[static_cast<size_t>(d)];
        rest /= gridDims_[static_cast<size_t>(d)];
      }
      const size_t key = static_cast<size_t>(k * perRow + g);
      const std::vector<char>& data = cached(key, cache, &local, [&] { return fetchChunk(origin); });
      if (!data.empty()) copyChunk(origin, data.data(), start, end, dst);  // empty: never written
    }
  }
}

void RowReader::copyChunk(const std::vector<int64_t>& origin, const char* chunk, int64_t start, int64_t end,
                          char* dst) const {
  const size_t rank = info_.shape.size();
  const size_t es = info_.elementSize;
  // Element strides of the destination (rows start..end, full trailing dims) and of a chunk.
  std::vector<int64_t> dstStride(rank, 1), chunkStride(rank, 1);
  for (size_t d = rank - 1; d-- > 0;) {
    dstStride[d] = dstStride[d + 1] * info_.shape[d + 1];
    chunkStride[d] = chunkStride[d + 1] * info_.chunkShape[d + 1];
  }
  // The box to copy: rows clipped to [start, end), trailing dims clipped to the dataset.
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = origin[d];
    hi[d] = std::min(origin[d] + info_.chunkShape[d], info_.shape[d]);
  }
  lo[0] = std::max(lo[0], start);
  hi[0] = std::min(hi[0], end);
  if (lo[0] >= hi[0]) return;
  // Trailing dimensions the chunk spans whole lie alike in both buffers: one memcpy covers them
  // (a 28x28x1 image chunk is one copy, not 784 of one byte).
  size_t last = rank - 1;
  int64_t along = 1;  // elements each index of dimension `last` brings
  while (last > 0 && info_.chunkShape[last] == info_.shape[last]) {
    along *= info_.shape[last];
    --last;
  }
  const size_t spanBytes = static_cast<size_t>((hi[last] - lo[last]) * along) * es;
  std::vector<int64_t> idx(lo.begin(), lo.end());
  while (true) {
    int64_t dOff = 0, cOff = 0;
    for (size_t d = 0; d < rank; ++d) {
      dOff += (d == 0 ? idx[d] - start : idx[d]) * dstStride[d];
      cOff += (idx[d] - origin[d]) * chunkStride[d];
    }
    std::memcpy(dst + static_cast<size_t>(dOff) * es, chunk + static_cast<size_t>(cOff) * es, spanBytes);
    // Next index over the dims before `last`.
    size_t d = last;
    while (d-- > 0) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d == static_cast<size_t>(-1)) break;
  }
}

}  // namespace mt
