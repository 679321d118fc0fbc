// metrics.jsonl as kills, resumes and full disks leave it (launch/Metrics): a resume drops torn
// lines and the records of steps trained again, keeps events and a whole last record that only
// lacks its newline; a failed write never throws and leaves no partial record. And the run guard's
// divergence streak (launch/RunGuard) on one process.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/Error.h"
#include "launch/Metrics.h"
#include "launch/RunGuard.h"

namespace mt {
namespace {

class MetricsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt_metrics_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/metrics.jsonl";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".tmp").c_str());
    rmdir(dir_.c_str());
  }
  void put(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }
  std::vector<std::string> lines() const {
    std::ifstream in(path_);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);)
      out.push_back(l);
    return out;
  }
  std::string dir_, path_;
};

TEST_F(MetricsFile, ResumeDropsTornLinesAndRedoneStepsKeepsEvents) {
  put("{\"type\":\"step\",\"step\":1,\"loss\":1}\n"
      "{\"type\":\"step\",\"st{\"type\":\"step\",\"step\":2,\"loss\":1}\n"  // torn, glued by an older build
      "{\"type\":\"eval\",\"step\":2,\"test_loss\":1}\n"
      "\n"
      "{\"type\":\"step\",\"step\":3,\"loss\":1}\n"
      "{\"type\":\"memory\",\"step\":3}\n"
      "{\"type\":\"preempted\",\"step\":3}\n"
      "{\"type\":\"eval\",\"step\":3,\"test_loss\":1}\n"
      "{\"type\":\"step\",\"step\":4,\"loss\":1}");  // whole, but its newline never written
  MetricsWriter w;
  w.open(path_, /*append=*/true);
  const MetricsRepair rep = w.repairForResume(2);
  EXPECT_EQ(rep.tornLines, 1);
  EXPECT_EQ(rep.redoneRecords, 4);  // step 3, memory 3, eval 3, step 4
  w.write({{"type", "resume"}, {"step", 2}});
  EXPECT_EQ(lines(),
            (std::vector<std::string>{
                "{\"type\":\"step\",\"step\":1,\"loss\":1}", "{\"type\":\"eval\",\"step\":2,\"test_loss\":1}",
                "{\"type\":\"preempted\",\"step\":3}", "{\"step\":2,\"type\":\"resume\"}"}));
}

TEST_F(MetricsFile, ResumeKeepsALastRecordThatOnlyLacksItsNewline) {
  put("{\"type\":\"step\",\"step\":1,\"loss\":1}\n{\"type\":\"step\",\"step\":2,\"loss\":1}");
  MetricsWriter w;
  w.open(path_, true);
  const MetricsRepair rep = w.repairForResume(2);
  EXPECT_EQ(rep.tornLines + rep.redoneRecords, 0);
  w.write({{"type", "resume"}, {"step", 2}});
  EXPECT_EQ(lines().size(), 3u);
  EXPECT_EQ(lines()[1], "{\"type\":\"step\",\"step\":2,\"loss\":1}");
}

// The resume records kept are the run's history of resumes (meshtrain_resumes_total counts them).
TEST_F(MetricsFile, ResumeCountsEarlierResumes) {
  put("{\"type\":\"step\",\"step\":1,\"loss\":1}\n"
      "{\"type\":\"resume\",\"step\":1}\n"
      "{\"type\":\"step\",\"step\":2,\"loss\":1}\n"
      "{\"type\":\"resume\",\"step\":2}\n"
      "{\"type\":\"resume\",\"step\":2}\n"
      "{\"type\":7,\"step\":2}\n");  // not a resume record, and no crash on a non-string type
  MetricsWriter w;
  w.open(path_, true);
  EXPECT_EQ(w.repairForResume(2).resumeRecords, 3);
  w.write({{"type", "resume"}, {"step", 2}});
  EXPECT_EQ(w.repairForResume(2).resumeRecords, 4);
}

TEST_F(MetricsFile, ANonFiniteNumberIsWrittenNull) {
  MetricsWriter w;
  w.open(path_, false);
  w.write({{"type", "step"}, {"step", 1}, {"loss", std::nan("")}});
  EXPECT_EQ(lines(), std::vector<std::string>{"{\"loss\":null,\"step\":1,\"type\":\"step\"}"});
}

TEST(MetricsWriter, AFailedWriteDoesNotThrowAndSaysWhy) {
  MetricsWriter w;
  w.open("/dev/full", false);
  EXPECT_NO_THROW(w.write({{"type", "step"}, {"step", 1}}));
  EXPECT_NE(w.error().find("writing /dev/full failed: No space left on device"), std::string::npos)
      << w.error();
  const std::string first = w.error();
  w.write({{"type", "step"}, {"step", 2}});  // nothing more is tried; the first failure stays
  EXPECT_EQ(w.error(), first);
}

TEST(MetricsWriter, AnUnopenableFileIsAnIoError) {
  MetricsWriter w;
  EXPECT_THROW(w.open("/nonexistent-dir/metrics.jsonl", false), IoError);
}

TEST(RunGuard, DivergesAfterTheConfiguredStreakOfNonFiniteLosses) {
  RunGuard g(MPI_COMM_NULL, 3);
  g.submit(0, true, false);
  g.submit(1, true, false);
  g.submit(2, false, false);  // a finite loss ends a streak
  EXPECT_EQ(g.streak(), 0);
  g.submit(3, true, false);
  g.submit(4, true, false);
  EXPECT_FALSE(g.diverged());
  g.submit(5, true, false);
  EXPECT_TRUE(g.diverged());
  EXPECT_EQ(g.streakStart(), 3);
  EXPECT_EQ(g.lastAgreedStep(), 5);
  EXPECT_FALSE(g.recordsFailed());
  g.submit(6, false, true);
  EXPECT_TRUE(g.recordsFailed());
}

}  // namespace
}  // namespace mt
