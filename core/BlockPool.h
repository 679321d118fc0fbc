#pragma once
// The bookkeeping of a caching allocator's large blocks, with no device calls (so it is tested on
// the CPU): segments (what one cudaMalloc returned) cut into blocks that are handed out, split and
// merged again, as PyTorch's caching allocator does for its large pool.
//
// take(stream, size) gives the smallest free block of that stream holding `size` bytes (best fit,
// the lowest address among equals), splitting off the remainder as a free block of its own when
// it is at least kMinSplit bytes (else the whole block is handed out: the caller learns its size).
// give(ptr) frees a block and merges it with free neighbours of its segment, so memory freed by
// one pattern of sizes (activations) serves another (per-step gradient buffers) without a new
// cudaMalloc. A block never leaves its segment's stream: stream order keeps a freed block safe to
// reuse on that stream at once (uses on other streams are the owner's to wait for before give()).
// releasable() lists the segments that are one free block, which the owner may cudaFree.

#include <cstddef>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace mt {

class BlockPool {
 public:
  using Stream = const void*;
  // Remainders below this stay with the block they were cut from.
  static constexpr size_t kMinSplit = size_t{1} << 20;

  // A new segment of `size` bytes at `base`, used on `stream`: one free block.
  void addSegment(void* base, size_t size, Stream stream);
  // A free block of at least `size` bytes of `stream` (best fit), now in use; its size in *got.
  // Null when none fits.
  void* take(Stream stream, size_t size, size_t* got);
  // A block from take() is free again (merged with its free neighbours). Returns its size.
  size_t give(void* ptr);
  // The segments that are entirely free; removeSegment() each before freeing it.
  std::vector<std::pair<void*, size_t>> releasable() const;
  void removeSegment(void* base);
  // Every segment's base, in use or not (an owner going away frees them all).
  std::vector<void*> segments() const;

  size_t freeBytes() const { return freeBytes_; }
  size_t segmentBytes() const { return segmentBytes_; }
  size_t numBlocks() const { return blocks_.size(); }

 private:
  struct Block {
    size_t size = 0;
    void* segment = nullptr;  // base of the segment it belongs to
    Stream stream = nullptr;
    bool free = true;
  };
  using FreeKey = std::tuple<Stream, size_t, char*>;
  void insertFree(char* p, const Block& b);
  void eraseFree(char* p, const Block& b);

  std::map<char*, Block> blocks_;  // every block, by address
  std::set<FreeKey> free_;         // free blocks by (stream, size, address)
  std::map<void*, size_t> segments_;
  size_t freeBytes_ = 0, segmentBytes_ = 0;
};

}  // namespace mt
