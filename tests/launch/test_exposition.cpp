// The Prometheus text exposition (launch/Exposition.h) and the run's metric families
// (launch/RunMetrics.h): HELP/TYPE lines, escaping, NaN/Inf spelling, the names the format allows,
// and per-rank labels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/Error.h"
#include "launch/Exposition.h"
#include "launch/RunMetrics.h"

namespace mt {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Exposition, HelpTypeAndSamples) {
  MetricFamily c{"jobs_done_total", "jobs finished", MetricType::kCounter, {{{}, 3}}};
  MetricFamily g{"temp_celsius",
                 "temperature",
                 MetricType::kGauge,
                 {{{{"room", "a"}}, 21.5}, {{{"room", "b"}, {"floor", "2"}}, -4}}};
  EXPECT_EQ(formatExposition({c, g}),
            "# HELP jobs_done_total jobs finished\n"
            "# TYPE jobs_done_total counter\n"
            "jobs_done_total 3\n"
            "# HELP temp_celsius temperature\n"
            "# TYPE temp_celsius gauge\n"
            "temp_celsius{room=\"a\"} 21.5\n"
            "temp_celsius{room=\"b\",floor=\"2\"} -4\n");
}

TEST(Exposition, EscapesLabelValuesAndHelp) {
  // Label values escape backslash, double quote and newline; HELP escapes backslash and newline
  // only (a quote stays as it is there).
  EXPECT_EQ(escapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escapeHelpText("x \"y\" \\ z\nw"), "x \"y\" \\\\ z\\nw");
  MetricFamily f{"m", "line one\nline \\ two", MetricType::kGauge, {{{{"path", "C:\\tmp\n\"q\""}}, 1}}};
  const std::string text = formatExposition({f});
  EXPECT_EQ(text,
            "# HELP m line one\\nline \\\\ two\n"
            "# TYPE m gauge\n"
            "m{path=\"C:\\\\tmp\\n\\\"q\\\"\"} 1\n");
  // Whatever the values hold, the exposition stays one line per sample.
  int lines = 0;
  for (char c : text)
    lines += c == '\n';
  EXPECT_EQ(lines, 3);
  // UTF-8 passes through untouched.
  EXPECT_EQ(escapeLabelValue("größe"), "größe");
}

TEST(Exposition, NonFiniteValuesAsPrometheusSpellsThem) {
  EXPECT_EQ(formatMetricValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(formatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(formatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  MetricFamily f{"loss", "l", MetricType::kGauge, {{{}, std::nan("")}}};
  EXPECT_TRUE(contains(formatExposition({f}), "\nloss NaN\n"));
}

TEST(Exposition, ValuesReadBackExactly) {
  EXPECT_EQ(formatMetricValue(0.1), "0.1");
  EXPECT_EQ(formatMetricValue(0), "0");
  EXPECT_EQ(formatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(formatMetricValue(9007199254740992.0), "9007199254740992");  // 2^53 bytes, exact
  EXPECT_EQ(formatMetricValue(80e9), "80000000000");
  for (double v : {1.0 / 3.0, 2.0 / 3.0, 1e-300, 1.7976931348623157e308, 123456.789e-7})
    EXPECT_EQ(std::strtod(formatMetricValue(v).c_str(), nullptr), v) << formatMetricValue(v);
}

TEST(Exposition, NamesTheFormatAllows) {
  EXPECT_TRUE(isValidMetricName("meshtrain_step"));
  EXPECT_TRUE(isValidMetricName("ns:sub_total"));
  EXPECT_TRUE(isValidMetricName("_x1"));
  EXPECT_FALSE(isValidMetricName(""));
  EXPECT_FALSE(isValidMetricName("1abc"));
  EXPECT_FALSE(isValidMetricName("a-b"));
  EXPECT_FALSE(isValidMetricName("a b"));
  EXPECT_TRUE(isValidLabelName("rank"));
  EXPECT_FALSE(isValidLabelName("__name"));  // reserved
  EXPECT_FALSE(isValidLabelName("a:b"));     // colons are for metric names only
  EXPECT_FALSE(isValidLabelName("9"));
}

TEST(Exposition, RefusesWhatTheFormatForbids) {
  const MetricFamily counterWithoutTotal{"jobs", "h", MetricType::kCounter, {{{}, 1}}};
  EXPECT_THROW(formatExposition({counterWithoutTotal}), InternalError);
  const MetricFamily badName{"a-b", "h", MetricType::kGauge, {}};
  EXPECT_THROW(formatExposition({badName}), InternalError);
  const MetricFamily badLabel{"a", "h", MetricType::kGauge, {{{{"__x", "1"}}, 1}}};
  EXPECT_THROW(formatExposition({badLabel}), InternalError);
  const MetricFamily twiceLabel{"a", "h", MetricType::kGauge, {{{{"r", "1"}, {"r", "2"}}, 1}}};
  EXPECT_THROW(formatExposition({twiceLabel}), InternalError);
  const MetricFamily g{"a", "h", MetricType::kGauge, {}};
  EXPECT_THROW(formatExposition({g, g}), InternalError);
}

// The run's families: every counter ends in _total (the formatter checks), units are in the
// names, each rank's figures carry its rank label, and the exit causes are all there from the start.
TEST(RunMetricsFamilies, IntervalFiguresAndLabels) {
  RunMetrics m(MetricsExportOptions{});
  m.identify({"/tmp/none", "run \"x\"", "mlp", "no_shard", "cpu", 2, 100, 0, 128});
  std::string text = m.render();
  EXPECT_TRUE(contains(text, "meshtrain_step 0\n"));
  EXPECT_TRUE(contains(text,
                       "meshtrain_run_info{run=\"run \\\"x\\\"\",model=\"mlp\",strategy=\"no_shard\","
                       "device=\"cpu\"} 1\n"));
  EXPECT_FALSE(contains(text, "meshtrain_loss "));  // not before the first report
  for (const char* cause : {"finished", "preempted", "failure", "bad_input", "comm_failure", "diverged"})
    EXPECT_TRUE(contains(text, std::string("meshtrain_exits_total{cause=\"") + cause + "\"} 0\n")) << cause;

  IntervalFigures f;
  f.step = 10;
  f.totalSteps = 100;
  f.seconds = 2.0;
  f.loss = std::nan("");
  f.samplesPerS = 640;
  f.stepSeconds = 0.2;
  f.ranks = {{0.1, 0.01, 0.05, 1000, 2048, 4096}, {0.15, 0.02, 0.5, 1001, 2049, 8192}};
  f.stragglerRank = 1;
  f.stragglerLagS = 0.05;
  f.stragglerLagRatio = 0.5;
  m.interval(f);
  m.stepDone(20);
  m.checkpointWritten(10, 0.25);
  m.resumed(0, 2);
  text = m.render();
  EXPECT_TRUE(contains(text, "meshtrain_step 20\n"));  // live, between log intervals
  EXPECT_TRUE(contains(text, "meshtrain_logged_step 10\n"));
  EXPECT_TRUE(contains(text, "meshtrain_loss NaN\n"));
  EXPECT_TRUE(contains(text, "# TYPE meshtrain_samples_total counter\nmeshtrain_samples_total 2560\n"));
  EXPECT_TRUE(contains(text, "meshtrain_allocator_allocated_bytes{rank=\"0\"} 1000\n"));
  EXPECT_TRUE(contains(text, "meshtrain_allocator_peak_bytes{rank=\"1\"} 8192\n"));
  EXPECT_TRUE(contains(text, "meshtrain_data_wait_ratio{rank=\"1\"} 0.5\n"));
  EXPECT_TRUE(contains(text, "meshtrain_comm_wait_seconds{rank=\"1\"} 0.02\n"));
  EXPECT_TRUE(contains(text, "meshtrain_straggler_rank 1\n"));
  EXPECT_TRUE(contains(text, "meshtrain_checkpoints_written_total 1\n"));
  EXPECT_TRUE(contains(text, "meshtrain_checkpoint_duration_seconds 0.25\n"));
  EXPECT_TRUE(contains(text, "meshtrain_resumes_total 2\n"));
  EXPECT_FALSE(contains(text, "meshtrain_tokens_per_second"));  // the MLP computes none
  EXPECT_FALSE(contains(text, "meshtrain_mfu_ratio"));
  EXPECT_FALSE(contains(text, "meshtrain_loss_scale"));  // no loss scaler (not f16)
  EXPECT_FALSE(contains(text, "meshtrain_skipped_steps_total"));
  f.lossScale = 32768;  // f16: the scaler's figures
  f.skippedSteps = 3;
  m.interval(f);
  text = m.render();
  EXPECT_TRUE(contains(text, "meshtrain_loss_scale 32768\n"));
  EXPECT_TRUE(contains(text, "# TYPE meshtrain_skipped_steps_total counter\nmeshtrain_skipped_steps_total 3\n"));
  for (const MetricFamily& fam : m.families()) {
    EXPECT_EQ(fam.name.rfind("meshtrain_", 0), 0u) << fam.name;
    EXPECT_FALSE(fam.help.empty()) << fam.name;
  }
}

TEST(RunMetricsFamilies, ExitCauses) {
  EXPECT_EQ(exitCauseOf(0, false), ExitCause::kFinished);
  EXPECT_EQ(exitCauseOf(0, true), ExitCause::kPreempted);
  EXPECT_EQ(exitCauseOf(1, false), ExitCause::kFailure);
  EXPECT_EQ(exitCauseOf(2, false), ExitCause::kBadInput);
  EXPECT_EQ(exitCauseOf(3, true), ExitCause::kCommFailure);
  EXPECT_EQ(exitCauseOf(4, false), ExitCause::kDiverged);
  EXPECT_EQ(exitCauseOf(137, false), ExitCause::kFailure);
  RunMetrics m(MetricsExportOptions{});
  m.finish(ExitCause::kDiverged);
  m.finish(ExitCause::kFinished);  // once only: an abort after the end does not count again
  const std::string text = m.render();
  EXPECT_TRUE(contains(text, "meshtrain_exits_total{cause=\"diverged\"} 1\n"));
  EXPECT_TRUE(contains(text, "meshtrain_exits_total{cause=\"finished\"} 0\n"));
}

}  // namespace
}  // namespace mt
