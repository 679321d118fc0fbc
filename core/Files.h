#pragma once
// Whole small files (config INI, topology XML, profiles, NCCL logs) read in one go, and small files
// written so that no reader ever sees half of one.

#include <cstdint>
#include <string>

namespace mt {

// The most a whole-file read takes unless the caller says otherwise: far above any real config,
// topology or NCCL log (one process's NCCL INFO log of a 16,384-rank job is a few MB), far below
// what a mistaken /dev/zero would fill memory with.
constexpr uint64_t kWholeFileLimit = 64ull << 20;

// The bytes of `path` into *out. False when it cannot be used, the reason in *why when given: it
// cannot be opened (errno's text), it is not a regular file (a directory, FIFO, device, socket:
// never read, since /dev/zero would be read until memory runs out and a FIFO would block), or it
// holds more than maxBytes. The caller names what the file is.
bool readWholeFile(const std::string& path, std::string* out, std::string* why = nullptr,
                   uint64_t maxBytes = kWholeFileLimit);

// Writes `text` to `path` through a temporary file in the same directory, flushed to disk and
// renamed over `path`: a reader sees the old file or the whole new one, and a full disk or a
// directory in the way is an IoError naming `path` (an ofstream's error at close goes unseen).
void writeFileAtomically(const std::string& path, const std::string& text);

}  // namespace mt
