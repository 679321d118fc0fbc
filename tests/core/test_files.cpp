#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/Error.h"
#include "core/Files.h"

namespace mt {
namespace {

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt_files_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(Files, ReadsARegularFileWhole) {
  std::ofstream(path("a.txt")) << "line 1\nline 2\n";
  std::string text, why;
  ASSERT_TRUE(readWholeFile(path("a.txt"), &text, &why)) << why;
  EXPECT_EQ(text, "line 1\nline 2\n");
}

TEST_F(Files, RefusesWhatIsNotARegularFile) {
  std::string text = "unchanged", why;
  EXPECT_FALSE(readWholeFile(dir_, &text, &why));
  EXPECT_EQ(why, "not a regular file (a directory)");
  EXPECT_FALSE(readWholeFile("/dev/zero", &text, &why));  // would fill memory if read
  EXPECT_EQ(why, "not a regular file (a character device)");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(readWholeFile(path("fifo"), &text, &why));  // would block without a writer
  EXPECT_EQ(why, "not a regular file (a FIFO)");
  EXPECT_FALSE(readWholeFile(path("missing"), &text, &why));
  EXPECT_EQ(why, "No such file or directory");
  EXPECT_EQ(text, "unchanged");
  EXPECT_FALSE(readWholeFile(dir_, &text));  // the reason is optional
}

TEST_F(Files, RefusesMoreThanTheLimit) {
  std::ofstream(path("big")) << std::string(5000, 'x');
  std::string text, why;
  EXPECT_FALSE(readWholeFile(path("big"), &text, &why, 4096));
  EXPECT_NE(why.find("holds 5000 bytes, more than the 4096 bytes"), std::string::npos) << why;
  EXPECT_TRUE(readWholeFile(path("big"), &text, &why, 5000));
  // A file whose size the kernel does not report (procfs) is bounded while it is read.
  EXPECT_FALSE(readWholeFile("/proc/self/maps", &text, &why, 16));
  EXPECT_NE(why.find("more than the 16 bytes"), std::string::npos) << why;
}

TEST_F(Files, WritesAtomicallyAndReportsFailures) {
  writeFileAtomically(path("config.ini"), "a = 1\n");
  writeFileAtomically(path("config.ini"), "a = 2\n");
  std::string text;
  ASSERT_TRUE(readWholeFile(path("config.ini"), &text));
  EXPECT_EQ(text, "a = 2\n");
  ASSERT_EQ(::mkdir(path("taken").c_str(), 0755), 0);
  try {
    writeFileAtomically(path("taken"), "x");
    FAIL() << "a directory in the way was overwritten";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path("taken")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Is a directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(writeFileAtomically(path("no/such/dir/x"), "x"), IoError);
  // Nothing of the failed attempts is left behind.
  EXPECT_EQ(std::system(("test $(ls " + dir_ + " | wc -l) -eq 2").c_str()), 0);
}

}  // namespace
}  // namespace mt
