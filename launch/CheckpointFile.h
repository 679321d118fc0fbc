#pragma once
// One rank's file of a checkpoint, rank<r>.h5 (docs/data-format.md, "Checkpoints"):
//   /pieces/offsets, /pieces/lengths  i64: the global ranges of the flat parameter vector it holds
//   /value                            f32: those ranges, concatenated
//   /state/<name>                     f32: the optimizer state over the same ranges
//   /compression/<kind>/<param>       f32: this rank's compressor state (version 2; the root
//                                     attribute compression_state lists the names in order)
// Its checksum (meta.json's files[r].crc32) is the CRC32 of, in order: version 2 only, the two
// piece arrays; /value; every /state/<name> in meta's state_names order; version 2 only, the
// compression_state attribute's text and every compressor tensor in its order.
//
// Everything read from a file is checked before it is used as an offset, a length or a shape, so a
// damaged or forged file is a CheckpointError (exit 2) naming it, never an internal CHECK.

#include <string>
#include <utility>
#include <vector>

#include "core/Tensor.h"
#include "data/H5File.h"
#include "launch/CheckpointMeta.h"

namespace mt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The global ranges a file holds: range k is rows [starts[k], starts[k] + lengths[k]) of /value.
struct PieceIndex {
  std::vector<int64_t> offsets, lengths, starts;
  int64_t total = 0;
};

// What save() writes for one rank (host tensors).
struct RankFileContent {
  Tensor offsets, lengths, value;  // i64, i64, f32
  NamedTensors state;              // in meta's state_names order
  NamedTensors compression;        // "error/<param>", "q/<param>"
};

// Runs `read`, which reads checkpoint files: any other mt::Error (HDF5, I/O) becomes a
// CheckpointError (exit 2) saying that `where` is unreadable.
template <typename F>
auto readingCheckpoint(const std::string& where, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(where + " is unreadable: " + e.what());
  }
}

// fsync of a file or a directory; IoError naming it.
void fsyncPath(const std::string& path, bool directory);

// Writes `path` and fsyncs it; returns its checksum and payload bytes.
std::pair<uint32_t, int64_t> writeRankFile(const std::string& path, const RankFileContent& content);

// Reads file q's piece index and checks it: ranges inside the model, /value and every /state/<name>
// one f32 per row of them. `where` names the file in messages.
PieceIndex readPieceIndex(const H5File& file, const CheckpointMeta& meta, const std::string& where);
// The compressor tensors the file lists, checked to be datasets of the file.
std::vector<std::string> compressionStateNames(const H5File& file, const std::string& where);
// Opens <dir>/files[q], checks its index and its checksum (streamed, a bounded buffer at a time);
// `value` (index total floats), when given, receives /value on the way.
PieceIndex verifyRankFile(const std::string& dir, const CheckpointMeta& meta, size_t q,
                          std::vector<float>* value = nullptr);

// Every parameter of a checkpoint whole, in f32 (the master weights, whatever precision it trained
// in), from files of any world size and strategy, each file verified: `flat` is the packed vector
// meta.params' offsets index. Not collective.
struct ConsolidatedCheckpoint {
  CheckpointMeta meta;
  std::vector<float> flat;
  // Parameter `p` as a host tensor viewing `flat` (valid while this object lives).
  Tensor param(const CheckpointParam& p);
};
ConsolidatedCheckpoint consolidateCheckpoint(const std::string& dir);

// One HDF5 file with every parameter whole (/params/<name>, f32) and the architecture, from a
// checkpoint of any world size and strategy, every file verified. Written to a temporary name and
// renamed, so a failed export leaves an existing `out` untouched. Not collective.
void exportConsolidated(const std::string& dir, const std::string& out);

}  // namespace mt
