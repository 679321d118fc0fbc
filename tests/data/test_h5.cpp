#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "data/ImageDataset.h"
#include "data/TokenDataset.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

std::string variant(const std::string& name) { return test::fixturePath("H5_VARIANTS") + "/" + name + ".h5"; }

std::vector<char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

class GoodVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(GoodVariant, ReadsBackExactly) {
  const std::string dir = test::fixturePath("H5_VARIANTS");
  const std::vector<char> images = slurp(dir + "/images.bin"), labels = slurp(dir + "/labels.bin");
  ASSERT_EQ(images.size(), 103u * 784u);
  H5File f = H5File::open(variant(GetParam()));
  ImageDataset ds(f, "train", 4);
  ASSERT_EQ(ds.size(), 103);
  EXPECT_EQ(ds.spec().height, 28);
  EXPECT_EQ(ds.spec().channels, 1);
  ChunkCache cache;
  std::vector<uint8_t> img(784);
  // Out of order, so chunks are revisited through the cache.
  for (int64_t k = 0; k < 103; ++k) {
    const int64_t i = (k * 37) % 103;
    int64_t label = -1;
    ds.read(i, img.data(), &label, &cache);
    ASSERT_EQ(0, std::memcmp(img.data(), images.data() + i * 784, 784)) << GetParam() << " row " << i;
    ASSERT_EQ(label, reinterpret_cast<const int64_t*>(labels.data())[i]) << GetParam() << " row " << i;
  }
  ds.loadIntoMemory();
  int64_t label = -1;
  ds.read(102, img.data(), &label, nullptr);
  EXPECT_EQ(0, std::memcmp(img.data(), images.data() + 102 * 784, 784));
}
INSTANTIATE_TEST_SUITE_P(H5, GoodVariant,
                         ::testing::Values("contiguous", "chunked_rows", "chunked_tiles", "gzip",
                                           "gzip_shuffle_fletcher", "rank3_int32_labels", "auto_chunks"));

TEST(H5, DirectReadsBypassTheLibrary) {
  for (const char* name : {"contiguous", "gzip", "gzip_shuffle_fletcher", "chunked_tiles"}) {
    H5File f = H5File::open(variant(name));
    RowReader r(f, f.describe("/train/images"));
    EXPECT_TRUE(r.direct()) << name;
  }
  // lzf is h5py's own filter: C programs cannot decode it without the plugin.
  H5File f = H5File::open(variant("lzf"));
  EXPECT_FALSE(f.describe("/train/images").directReadable());
  EXPECT_THROW(RowReader(f, f.describe("/train/images")), DataError);
}

// Above kListedChunkLimit chunks RowReader finds each chunk through HDF5's index instead of a
// list made at open; describe(name, 0) takes that path on the small variants: every chunk layout,
// filter and index type reads back the same through both.
TEST(H5, UnlistedChunksReadBackExactly) {
  const std::vector<char> images = slurp(test::fixturePath("H5_VARIANTS") + "/images.bin");
  auto check = [&](const H5File& f, const std::string& name, uint64_t listLimit) {
    const H5DatasetInfo info = f.describe(name, listLimit);
    ASSERT_EQ(info.storage, H5Storage::kChunked) << name;
    EXPECT_EQ(info.chunksListed, listLimit > 0) << name;
    RowReader r(f, info);
    EXPECT_TRUE(r.direct()) << name;
    EXPECT_EQ(r.storageGap(), "") << name;
    ChunkCache cache;
    std::vector<char> rows(103 * r.rowBytes());
    r.readRows(0, 103, rows.data(), &cache);
    EXPECT_EQ(0, std::memcmp(rows.data(), images.data(), rows.size())) << name << " listLimit " << listLimit;
    for (int64_t k = 0; k < 103; ++k) {  // one row at a time, out of order, with and without a cache
      const int64_t i = (k * 37) % 103;
      r.readRows(i, 1, rows.data(), k % 2 ? &cache : nullptr);
      ASSERT_EQ(0, std::memcmp(rows.data(), images.data() + i * 784, 784)) << name << " row " << i;
    }
  };
  for (const char* v : {"chunked_rows", "chunked_tiles", "gzip", "gzip_shuffle_fletcher", "auto_chunks"}) {
    H5File f = H5File::open(variant(v));
    check(f, "/train/images", 0);
  }
  H5File latest = H5File::open(variant("latest_formats"));
  for (const char* name : {"/fixed_array", "/extensible_array", "/btree2", "/single_chunk"})
    for (uint64_t limit : {uint64_t{0}, kListedChunkLimit})
      check(latest, name, limit);
  // Damage is still found on this path: the flipped byte, and the chunks a header declares
  // but the file does not hold.
  H5File flipped = H5File::open(variant("fletcher_flipped"));
  RowReader r(flipped, flipped.describe("/train/images", 0));
  std::vector<char> row(784);
  try {
    r.readRows(45, 1, row.data());
    FAIL() << "no checksum error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk at row 40 of /train/images fails its Fletcher-32 checksum"),
              std::string::npos)
        << e.what();
  }
  H5File huge = H5File::open(variant("declared_huge"));
  EXPECT_EQ(RowReader(huge, huge.describe("/train/images", 0)).storageGap(), "1 of 15625000 chunks stored");
}

// A dataset appended one sample at a time: 100,000 chunks of images and 100,000 of labels. Opening
// listed every chunk with H5Dget_chunk_info(i), which HDF5 1.10 answers by walking the index from
// its first entry: O(n^2), about 2 minutes for this file on the 2-core CI machine.
TEST(H5, OneSamplePerChunkOpensAndReadsInLinearTime) {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  H5File f = H5File::open(variant("one_per_chunk"));
  ImageDataset ds(f, "train", 1);  // describes both datasets and reads every label
  const double opened = seconds();
  ASSERT_EQ(ds.size(), 100000);
  EXPECT_EQ(ds.spec().height, 8);
  ChunkCache cache;
  std::vector<uint8_t> img(64);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const int64_t row = (i * 7919) % ds.size();  // shuffled, as the loader reads
    int64_t label = -1;
    ds.read(row, img.data(), &label, &cache);
    ASSERT_EQ(label, row % 10) << "row " << row;
    for (int64_t j = 0; j < 64; ++j)
      ASSERT_EQ(img[static_cast<size_t>(j)], (row * 7 + j) % 251) << "row " << row << " byte " << j;
  }
  const double total = seconds();
  std::printf("one sample per chunk, 100000 chunks x 2: open %.2f s, open + read all %.2f s\n", opened,
              total);
  EXPECT_LT(opened, 10.0);  // ~0.3 s here
  EXPECT_LT(total, 20.0);   // ~1 s here
}

// Every broken file gives a DataError naming the file and what is wrong.
void expectDataError(const std::string& file, int64_t minSamples, const std::string& needle) {
  try {
    H5File f = H5File::open(file);
    ImageDataset ds(f, "train", minSamples);
    std::vector<uint8_t> img(784);
    int64_t label;
    ds.read(ds.size() - 1, img.data(), &label, nullptr);
    FAIL() << "no error for " << file;
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(e.exitCode(), ExitCode::kBadInput);
  }
}

TEST(H5, BadFilesAreClearErrors) {
  expectDataError(variant("bad_dtype"), 1, "/train/images has type f32, expected u8");
  expectDataError(variant("bad_rank"), 1, "/train/images has shape [103,784]");
  expectDataError(variant("bad_count"), 1, "/train/labels has 50 labels for 103 images");
  expectDataError(variant("missing_labels"), 1, "dataset /train/labels not found");
  expectDataError(variant("tiny"), 4, "has 2 samples, fewer than the 4 ranks");
  expectDataError(variant("not_hdf5"), 1, "not an HDF5 file");
  expectDataError(variant("truncated"), 1, "truncated");
  expectDataError(variant("truncated_chunked"), 1, "truncated");
  expectDataError(variant("does_not_exist"), 1, "No such file or directory");
  expectDataError(variant("lzf"), 1, "/train/images is compressed with HDF5 filter lzf (id 32000)");
}

// A num_classes that is not a count (zero, negative, huge, a float, a string, an array, a u64 above
// int64) was ignored (or, for an array, read past its one-value buffer): each is refused, naming
// the file, the attribute and what it holds.
TEST(H5, BadClassCountAttributesAreRefused) {
  expectDataError(variant("num_classes_zero"), 1,
                  "attribute num_classes of /train/labels = 0 is outside [1, 2147483647]");
  expectDataError(variant("num_classes_negative"), 1,
                  "attribute num_classes of / = -3 is outside [1, 2147483647]");
  expectDataError(variant("num_classes_huge"), 1,
                  "num_classes of /train/labels = 1099511627776 is outside [1, 2147483647]");
  expectDataError(variant("num_classes_float"), 1,
                  "attribute num_classes of /train/labels is of type f64, expected one integer");
  expectDataError(variant("num_classes_string"), 1,
                  "attribute num_classes of / is of type string, expected one integer");
  expectDataError(variant("num_classes_array"), 1,
                  "attribute num_classes of /train/labels is 2 values of i64");
  expectDataError(variant("num_classes_u64"), 1,
                  "attribute num_classes of / = 9223372036854775809 does not fit int64");
}

// Every window of a token split, read as the loader reads them (streamed, or from memory).
void readAllWindows(const std::string& file, bool memory) {
  H5File f = H5File::open(file);
  TokenDataset ds(f, "train", 64, 1);
  if (memory) ds.loadIntoMemory();
  std::vector<int32_t> inputs(64);
  std::vector<int64_t> targets(64);
  for (int64_t i = 0; i < ds.size(); ++i)
    ds.read(i, inputs.data(), targets.data(), nullptr);
}

void expectTokenError(const std::string& name, const std::string& needle) {
  for (bool memory : {false, true}) {
    const std::string file = variant(name);
    try {
      readAllWindows(file, memory);
      FAIL() << "no error for " << file << (memory ? " in memory" : " streamed");
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }
}

TEST(H5, BadVocabularyAttributesAndTokenIdsAreRefused) {
  EXPECT_NO_THROW(readAllWindows(variant("tokens_good"), false));
  EXPECT_NO_THROW(readAllWindows(variant("tokens_good"), true));
  expectTokenError("tokens_vocab_zero", "attribute vocab_size of / = 0 is outside [1, 2147483647]");
  expectTokenError("tokens_vocab_negative", "attribute vocab_size of / = -1 is outside [1, 2147483647]");
  expectTokenError("tokens_vocab_huge", "attribute vocab_size of / = 2147483648 is outside [1, 2147483647]");
  expectTokenError("tokens_vocab_float", "attribute vocab_size of / is of type f64, expected one integer");
  expectTokenError("tokens_vocab_string",
                   "attribute vocab_size of / is of type string, expected one integer");
  // An id the vocab_size attribute does not cover, and one a cast to int32 would make negative:
  // named with the dataset and the index, whether the split is streamed or in memory.
  expectTokenError("tokens_beyond_vocab",
                   "dataset /train/tokens[3000] = 150 is outside [0, 100) (its vocab_size");
  expectTokenError("tokens_u32_wraps", "dataset /train/tokens[40] = 2147483653 is outside [0, 2147483647)");
}

TEST(H5, WriterRoundTrip) {
  const std::string path = test::fixturePath("TEST_FIXTURES") + "/writer_roundtrip.h5";
  Tensor a = test::randomTensor({5, 7}, 1);
  Tensor b = Tensor::empty({3}, DType::kI64);
  for (int i = 0; i < 3; ++i) b.data<int64_t>()[i] = -i * 1000000000000LL;
  Tensor c = a.toDType(DType::kBF16);
  {
    H5Writer w(path);
    w.write("/x/a", a, 2, 6);
    w.write("/x/b", b);
    w.write("/c", c);
    w.writeStringAttribute("/", "note", "hello");
    w.writeIntAttribute("/x", "n", 42);
    w.close();
  }
  H5File f = H5File::open(path);
  EXPECT_EQ(test::relErr(f.readTensor("/x/a"), a), 0.0);
  EXPECT_EQ(f.readTensor("/x/b").data<int64_t>()[2], -2000000000000LL);
  Tensor c2 = f.readTensor("/c");
  EXPECT_EQ(c2.dtype(), DType::kBF16);
  EXPECT_EQ(std::memcmp(c2.rawData(), c.rawData(), c.nbytes()), 0);
  EXPECT_EQ(f.readStringAttribute("/", "note"), "hello");
  EXPECT_EQ(f.readIntAttribute("/x", "n", 0), 42);
  EXPECT_TRUE(RowReader(f, f.describe("/x/a")).direct());
}

TEST(H5, ConvertedFashionMnist) {
  H5File f = H5File::open(test::fixturePath("FASHION_H5"));
  ImageDataset train(f, "train", 1), test(f, "test", 1);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.spec().numClasses, 10);
  EXPECT_EQ(train.spec().height, 28);
  EXPECT_EQ(f.readStringAttribute("/", "format"), "meshtrain-images");
  std::vector<int64_t> counts(10, 0);
  std::vector<uint8_t> img(784);
  for (int64_t i = 0; i < test.size(); ++i) {
    int64_t label;
    test.read(i, img.data(), &label, nullptr);
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++counts[static_cast<size_t>(label)];
  }
  for (int64_t c : counts) EXPECT_EQ(c, 1000);  // Fashion-MNIST's test set is balanced
}

}  // namespace
}  // namespace mt
