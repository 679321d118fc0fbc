#pragma once
// Reads rows (indices of dimension 0) of one dataset without going through HDF5, so loader threads
// run in parallel instead of queueing on the library's global lock: contiguous data by pread at
// the dataset's file offset, chunked data by pread of the raw chunk and our own inflate (zlib) and
// unshuffle. A dataset of too many chunks to list (H5File.h) has each chunk's raw bytes fetched
// through HDF5's index (H5Dread_chunk, under the lock) and decoded here, outside it. Datasets with
// other filters fall back to H5Dread under the lock.

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "data/H5File.h"

namespace mt {

// Decoded chunks kept by one reader thread (not shared, so no locking), for any number of
// datasets: entries are keyed by (reader, chunk).
class ChunkCache {
 public:
  struct Key {
    const void* reader;
    size_t chunk;
    bool operator==(const Key& o) const { return reader == o.reader && chunk == o.chunk; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<const void*>()(k.reader) ^ (k.chunk * 0x9E3779B97F4A7C15ull); }
  };
  explicit ChunkCache(size_t capacityBytes = 64u << 20) : capacity_(capacityBytes) {}
  const std::vector<char>* find(Key key);
  const std::vector<char>& insert(Key key, std::vector<char> data);
  size_t bytes() const { return bytes_; }

 private:
  size_t capacity_;
  size_t bytes_ = 0;
  std::list<std::pair<Key, std::vector<char>>> lru_;  // front = most recent
  std::unordered_map<Key, decltype(lru_)::iterator, KeyHash> map_;
};

// HDF5's Fletcher-32 checksum (the fletcher32 filter's), over len bytes.
uint32_t fletcher32(const char* data, size_t len);

class RowReader {
 public:
  // `file` must outlive the reader.
  RowReader(const H5File& file, H5DatasetInfo info);
  const H5DatasetInfo& info() const { return info_; }
  int64_t rows() const { return info_.shape.empty() ? 0 : info_.shape[0]; }
  size_t rowBytes() const { return rowBytes_; }
  bool direct() const { return direct_; }
  // Rows [start, start+count) into dst (count * rowBytes() bytes). Thread-safe when each thread
  // passes its own cache (or none).
  void readRows(int64_t start, int64_t count, void* dst, ChunkCache* cache = nullptr) const;
  // "" when every element has storage in the file; otherwise what is missing ("12 of 3907 chunks
  // stored"). HDF5 reads missing storage as fill values: for training data that is a truncated or
  // never-written dataset, not data.
  std::string storageGap() const;

 private:
  void readContiguous(int64_t start, int64_t count, char* dst) const;
  void readChunked(int64_t start, int64_t count, char* dst, ChunkCache* cache) const;
  void readUnlistedChunks(int64_t start, int64_t count, char* dst, ChunkCache* cache) const;
  // The part of a decoded chunk at `origin` within rows [start, end) into dst (rows from start).
  void copyChunk(const std::vector<int64_t>& origin, const char* chunk, int64_t start, int64_t end,
                 char* dst) const;
  // Through the cache when one is given; `load` decodes the chunk on a miss.
  template <class Load>
  const std::vector<char>& cached(size_t key, ChunkCache* cache, std::vector<char>* local, Load load) const;
  std::vector<char> decodeChunk(size_t index) const;
  std::vector<char> fetchChunk(const std::vector<int64_t>& origin) const;  // unlisted; empty: no storage
  std::vector<char> decode(std::vector<char> raw, uint32_t filterMask, int64_t row) const;
  void preadAll(uint64_t offset, size_t bytes, char* dst) const;

  const H5File* file_;
  H5DatasetInfo info_;
  size_t rowBytes_ = 0;
  bool direct_ = false;
  bool sparse_ = false;                // some chunks never written (read as zeros)
  size_t expectedChunks_ = 0, allocatedChunks_ = 0;
  size_t chunkBytes_ = 0;              // decoded chunk size
  std::vector<size_t> rowChunkBegin_;  // listed: chunks [begin[k], begin[k+1]) start in chunk-row k
  std::vector<int64_t> gridDims_;      // chunks along each dimension
  H5Handle dataset_;                   // unlisted: open for readRawChunk
  mutable std::mutex fallbackMutex_;   // the library path is serialised anyway; keep it explicit
};

}  // namespace mt
