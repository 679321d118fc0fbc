#include "core/BlockPool.h"

#include <iterator>

#include "core/Check.h"

namespace mt {

void BlockPool::insertFree(char* p, const Block& b) {
  free_.insert({b.stream, b.size, p});
  freeBytes_ += b.size;
}

void BlockPool::eraseFree(char* p, const Block& b) {
  free_.erase({b.stream, b.size, p});
  freeBytes_ -= b.size;
}

void BlockPool::addSegment(void* base, size_t size, Stream stream) {
  MT_CHECK(base && size > 0 && segments_.count(base) == 0, "block pool: bad segment of ", size, " bytes");
  char* p = static_cast<char*>(base);
  Block b{size, base, stream, true};
  blocks_[p] = b;
  insertFree(p, b);
  segments_[base] = size;
  segmentBytes_ += size;
}

void* BlockPool::take(Stream stream, size_t size, size_t* got) {
  auto it = free_.lower_bound({stream, size, nullptr});
  if (it == free_.end() || std::get<0>(*it) != stream) return nullptr;
  char* p = std::get<2>(*it);
  Block& b = blocks_.at(p);
  eraseFree(p, b);
  b.free = false;
  if (b.size - size >= kMinSplit) {  // the rest becomes a free block right after this one
    Block rest{b.size - size, b.segment, b.stream, true};
    b.size = size;
    blocks_[p + size] = rest;
    insertFree(p + size, rest);
  }
  *got = b.size;
  return p;
}

size_t BlockPool::give(void* ptr) {
  auto it = blocks_.find(static_cast<char*>(ptr));
  MT_CHECK(it != blocks_.end() && !it->second.free, "block pool: give() of a block it did not hand out");
  const size_t given = it->second.size;
  it->second.free = true;
  // Merge with the next block, then the previous one, where they are free parts of this segment.
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free && next->second.segment == it->second.segment) {
    eraseFree(next->first, next->second);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == it->second.segment) {
      eraseFree(prev->first, prev->second);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  insertFree(it->first, it->second);
  return given;
}

std::vector<std::pair<void*, size_t>> BlockPool::releasable() const {
  std::vector<std::pair<void*, size_t>> out;
  for (const auto& kv : segments_) {
    const Block& b = blocks_.at(static_cast<char*>(kv.first));
    if (b.free && b.size == kv.second) out.emplace_back(kv.first, kv.second);
  }
  return out;
}

std::vector<void*> BlockPool::segments() const {
  std::vector<void*> out;
  for (const auto& kv : segments_)
    out.push_back(kv.first);
  return out;
}

void BlockPool::removeSegment(void* base) {
  auto s = segments_.find(base);
  MT_CHECK(s != segments_.end(), "block pool: removeSegment of an unknown segment");
  auto it = blocks_.find(static_cast<char*>(base));
  MT_CHECK(it != blocks_.end() && it->second.free && it->second.size == s->second,
           "block pool: removeSegment of a segment in use");
  eraseFree(it->first, it->second);
  blocks_.erase(it);
  segmentBytes_ -= s->second;
  segments_.erase(s);
}

}  // namespace mt
