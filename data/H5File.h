#pragma once
// HDF5 access. Debian's HDF5 is thread-safe by one global lock (decompression included), so the
// library is used only to open a file and describe its datasets: shape, type, where contiguous data
// starts, and the address, size and filter mask of every chunk. Bulk reads then go around the
// library (RowReader: pread + our own inflate/unshuffle in the loader's threads). One H5File per
// file per process; HDF5_USE_FILE_LOCKING is left to HDF5 unless the config forces locking.
//
// Listing the chunks is quadratic in HDF5 1.10 (Debian 12 has 1.10.8, without H5Dchunk_iter):
// H5Dget_chunk_info(i) and H5Dget_chunk_info_by_coord both walk the chunk index from its first
// entry, so a dataset written one sample per chunk (60,000 chunks) took 48 s to describe. Datasets
// of more than kListedChunkLimit chunks are therefore not listed: RowReader fetches each chunk it
// reads by its coordinates (H5Dget_chunk_storage_size + H5Dread_chunk, one lookup in the B-tree
// or array index each, under the library's lock for the raw bytes only) and decodes it itself.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/EnumTable.h"
#include "core/DType.h"
#include "core/Tensor.h"

namespace mt {

// Move-only owner of an hid_t.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership without closing.
  hid_t release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() noexcept {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

enum class H5Storage { kContiguous, kChunked, kCompact };
enum class H5Filter { kDeflate, kShuffle, kFletcher32, kOther };

struct H5Chunk {
  std::vector<int64_t> origin;  // element coordinates of the chunk's first element
  uint64_t address = 0;         // byte offset in the file (HADDR_UNDEF: never written, fill value)
  uint64_t size = 0;            // stored bytes
  uint32_t filterMask = 0;      // bit i set: filter i was skipped for this chunk
};

struct H5DatasetInfo {
  std::string file;
  std::string name;
  Shape shape;
  // "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f16", "f32", "f64", or the HDF5 class
  // ("string", "compound", ...) for types that are not plain numbers.
  std::string type;
  size_t elementSize = 0;
  H5Storage storage = H5Storage::kContiguous;
  uint64_t contiguousOffset = 0;  // contiguous: file offset of element 0 (HADDR_UNDEF if unallocated)
  Shape chunkShape;
  std::vector<H5Filter> filters;  // pipeline in write order
  std::vector<std::string> unavailableFilters;  // "lzf (id 32000)": filters this HDF5 cannot decode
  std::vector<H5Chunk> chunks;   // chunked and chunksListed: every allocated chunk, row-major by origin
  bool chunksListed = true;      // chunked: false above the listing limit (chunks then empty)
  uint64_t allocatedChunks = 0;  // chunked: chunks with storage in the file (H5Dget_num_chunks)
  bool littleEndian = true;
  // Whether RowReader can read it without the library: contiguous unfiltered, or chunked with
  // deflate/shuffle/fletcher32 only, in native byte order.
  bool directReadable() const;
  int64_t rowElements() const;  // elements per index of dimension 0
};

// The most classes (num_classes) or token ids (vocab_size) a file may declare: labels and ids are
// int32 in the GPU kernels and token batches.
constexpr int64_t kMaxIdCount = 2147483647;

// The most chunks describe() lists (at most ~10 ms of H5Dget_chunk_info calls on a v1 B-tree,
// ~50 ms on a 1.10 extensible array); above it chunks are found one by one as they are read.
constexpr uint64_t kListedChunkLimit = 1024;

enum class FileLocking { kAuto, kOn, kOff };  // auto: whatever HDF5_USE_FILE_LOCKING says
const EnumTable<FileLocking>& fileLockings();

class H5File {
 public:
  // Throws DataError naming the file: missing, unreadable, not HDF5, or truncated.
  static H5File open(const std::string& path, FileLocking locking = FileLocking::kAuto);
  H5File() = default;
  ~H5File();
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&& o) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  uint64_t fileSize() const { return fileSize_; }
  bool hasDataset(const std::string& name) const;
  // Throws DataError "<file>: dataset <name> not found" when missing. Chunks are listed when there
  // are at most listLimit of them (tests pass 0 to take the unlisted path on small files).
  H5DatasetInfo describe(const std::string& name, uint64_t listLimit = kListedChunkLimit) const;
  // The dataset open, for readRawChunk. Throws DataError naming it.
  H5Handle openDataset(const std::string& name) const;
  // The stored (still filtered) bytes of the chunk at `origin` of an open dataset and its filter
  // mask, found through HDF5's chunk index. False when the chunk has no storage (fill value).
  // Throws DataError naming the file, dataset and row. Takes HDF5's global lock.
  bool readRawChunk(hid_t dataset, const H5DatasetInfo& info, const std::vector<int64_t>& origin,
                    std::vector<char>* raw, uint32_t* filterMask) const;
  // Rows [start, start+count) of dimension 0 through the library (used where RowReader cannot).
  void readRows(const H5DatasetInfo& info, int64_t start, int64_t count, void* dst) const;
  // A whole dataset as a CPU tensor (f32, f64, i32, i64, u8; u16 with a "dtype" attribute of bf16
  // or f16 as written by H5Writer). Throws DataError naming the dataset for other types.
  Tensor readTensor(const std::string& name) const;
  std::string readStringAttribute(const std::string& object, const std::string& attr) const;  // "" if absent
  // `fallback` when the attribute is absent; one that is not a single integer (a float, a string,
  // an array) or does not fit int64 is a DataError naming the file, object and attribute.
  int64_t readIntAttribute(const std::string& object, const std::string& attr, int64_t fallback) const;
  // A count attribute (num_classes, vocab_size) of `object`, else of the root group; -1 when
  // neither has one. A value outside [1, hi] is a DataError naming the file, where the attribute
  // is, and its value: a zero, negative or huge count is a broken file, not "none given".
  int64_t readCountAttribute(const std::string& object, const std::string& attr, int64_t hi) const;

 private:
  void listChunks(hid_t dataset, hid_t space, uint64_t nchunks, H5DatasetInfo* info) const;
  std::string path_;
  H5Handle file_;
  int fd_ = -1;
  uint64_t fileSize_ = 0;
};

// Writing (checkpoints, converters in C++, tests).
class H5Writer {
 public:
  // Creates (truncates) the file. Throws IoError naming the path.
  explicit H5Writer(const std::string& path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  // Contiguous CPU tensor; intermediate groups are created. chunkRows > 0 writes it chunked
  // along dimension 0 (deflateLevel > 0 adds shuffle + deflate).
  void write(const std::string& name, const Tensor& t, int64_t chunkRows = 0, int deflateLevel = 0);
  void writeStringAttribute(const std::string& object, const std::string& attr, const std::string& value);
  void writeIntAttribute(const std::string& object, const std::string& attr, int64_t value);
  // Flushes and closes; errors (disk full) surface here as IoError instead of in the destructor.
  void close();

 private:
  void ensureGroups(const std::string& name);
  std::string path_;
  H5Handle file_;
};

hid_t h5NativeType(DType t);

}  // namespace mt
