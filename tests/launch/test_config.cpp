// The typed config table (launch/Config.cpp): every key is validated from its entry (kind, range,
// choices), the messages name the key and say what is accepted, the choice keys backed by an enum
// accept exactly that enum's names, and every enum table converts both ways.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/Compression.h"
#include "core/DType.h"
#include "core/Error.h"
#include "core/Log.h"
#include "data/DeviceFeed.h"
#include "data/H5File.h"
#include "launch/Config.h"
#include "launch/Settings.h"
#include "models/layers/Attention.h"
#include "models/layers/Layout.h"
#include "sharding/ShardedEngine.h"
#include "topo/Topology.h"

namespace mt {
namespace {

// The ConfigError message of validating `key = value` over the defaults, or "" when it passes.
std::string errorOf(const std::string& key, const std::string& value) {
  Config c = Config::fromArgs({"--" + key + "=" + value});
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const ConfigKey& entry(const std::string& key) {
  for (const auto& k : configSchema())
    if (k.key == key) return k;
  throw InternalError("no key " + key);
}

TEST(ConfigTable, DefaultsValidate) {
  EXPECT_NO_THROW(Config::defaults().validate());
  EXPECT_NO_THROW(Settings::fromConfig(Config::defaults()));
  for (const auto& k : configSchema()) EXPECT_FALSE(k.helpText().empty()) << k.key;
}

TEST(ConfigTable, KindsAreChecked) {
  EXPECT_NE(errorOf("train.epochs", "abc").find("not an integer"), std::string::npos);
  EXPECT_NE(errorOf("optim.lr", "x").find("not a number"), std::string::npos);
  EXPECT_NE(errorOf("optim.lr", "inf").find("finite"), std::string::npos);
  EXPECT_NE(errorOf("data.shuffle", "maybe").find("not a boolean"), std::string::npos);
  EXPECT_NE(errorOf("model.hidden", "1,x").find("comma-separated list of integers"), std::string::npos);
}

TEST(ConfigTable, EveryRangeIsEnforcedAtItsBounds) {
  int checked = 0;
  for (const auto& k : configSchema()) {
    if ((k.kind != KeyKind::kInt && k.kind != KeyKind::kFloat) || !k.range.bounded()) continue;
    const KeyRange& r = k.range;
    auto show = [&](double v) {
      if (k.kind == KeyKind::kInt) return std::to_string(static_cast<long long>(v));
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.17g", v);
      return std::string(buf);
    };
    if (r.lo > -1e308) {
      // The bound itself passes when closed and fails when open; just beyond it always fails.
      const double outside = k.kind == KeyKind::kInt ? r.lo - 1 : r.lo - 0.5;
      const std::string e = errorOf(k.key, show(outside));
      EXPECT_NE(e.find("--" + k.key + "="), std::string::npos) << e;
      EXPECT_NE(e.find(r.describe()), std::string::npos) << k.key << ": " << e;
      EXPECT_EQ(errorOf(k.key, show(r.lo)).empty(), !r.loOpen) << k.key;
      ++checked;
    }
    if (r.hi < 1e308) {
      const double outside = k.kind == KeyKind::kInt ? r.hi + 1 : r.hi + 0.5;
      EXPECT_NE(errorOf(k.key, show(outside)).find(r.describe()), std::string::npos) << k.key;
      EXPECT_EQ(errorOf(k.key, show(r.hi)).empty(), !r.hiOpen) << k.key;
    }
  }
  EXPECT_GT(checked, 30);
  EXPECT_NE(errorOf("optim.lr", "-1").find("must be positive"), std::string::npos);
  EXPECT_NE(errorOf("model.dropout", "1").find("must be in [0, 1)"), std::string::npos);
  EXPECT_NE(errorOf("compression.topk_fraction", "0").find("must be in (0, 1]"), std::string::npos);
}

TEST(ConfigTable, ChoicesAcceptTheirNamesOnly) {
  int checked = 0;
  for (const auto& k : configSchema()) {
    if (k.kind != KeyKind::kChoice) continue;
    std::string list;
    for (const auto& c : k.choices) {
      EXPECT_EQ(errorOf(k.key, c.name), "") << k.key << " = " << c.name;
      EXPECT_NE(k.helpText().find(c.name), std::string::npos) << k.key;
      list += (list.empty() ? "" : ", ") + c.name;
    }
    EXPECT_NE(errorOf(k.key, "no-such-name").find("expected one of " + list), std::string::npos) << k.key;
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

template <typename E>
void expectSameNames(const std::string& key, const EnumTable<E>& table) {
  EXPECT_EQ(entry(key).choiceNames(), enumChoices(table)) << key;
}

TEST(ConfigTable, EnumKeysListTheirEnumsNames) {
  expectSameNames("data.feed", feedModes());
  expectSameNames("sharding.strategy", shardStrategies());
  expectSameNames("compression.method", compressionMethods());
  expectSameNames("data.file_locking", fileLockings());
  expectSameNames("run.log_level", logLevels());
  expectSameNames("model.layout", layouts());
  expectSameNames("model.attention", attentionBackends());
  expectSameNames("fp8.recipe", fp8Recipes());
  expectSameNames("fp8.grad_format", fp8Formats());
  for (const char* key : {"sharding.param_dtype", "sharding.reduce_dtype", "train.precision"})
    for (const auto& name : entry(key).choiceNames()) {
      if (name == "auto") continue;  // sharding.param_dtype: resolved by Settings
      if (name == "fp8")
        continue;  // train.precision: FP8 codes with per-tensor scales (core/Fp8.h), no DType
      DType t;
      EXPECT_TRUE(parseDType(name, &t)) << key << " " << name;
    }
}

template <typename E>
void expectRoundTrip(const EnumTable<E>& table) {
  for (const auto& e : table) {
    EXPECT_STREQ(enumName(table, e.value), e.name);
    E back{};
    EXPECT_EQ(parseEnum(table, e.name, &back), e.selectable) << e.name;
    if (e.selectable) EXPECT_EQ(back, e.value) << e.name;
  }
  E none{};
  EXPECT_FALSE(parseEnum(table, "no-such-name", &none));
}

TEST(EnumTables, ConvertBothWays) {
  expectRoundTrip(feedModes());
  expectRoundTrip(shardStrategies());
  expectRoundTrip(compressionMethods());
  expectRoundTrip(fileLockings());
  expectRoundTrip(logLevels());
  expectRoundTrip(layouts());
  expectRoundTrip(attentionBackends());
  expectRoundTrip(dtypes());
  expectRoundTrip(fabrics());
  Fabric f;
  EXPECT_FALSE(parseFabric("unknown", &f));  // printed, never chosen
  EXPECT_STREQ(fabricName(Fabric::kUnknown), "unknown");
}

TEST(ConfigTable, ReferenceHasEveryKeyOnce) {
  const std::string md = configReferenceMarkdown();
  for (const auto& k : configSchema()) {
    const std::string cell = "| `" + k.key + "` |";
    const size_t at = md.find(cell);
    ASSERT_NE(at, std::string::npos) << k.key;
    EXPECT_EQ(md.find(cell, at + 1), std::string::npos) << k.key;
  }
}

// The ConfigError message of Settings::fromConfig over the defaults and `args`, or "".
std::string settingsErrorOf(const std::vector<std::string>& args) {
  try {
    Settings::fromConfig(Config::fromArgs(args));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// run.name = .. put the run's lock, files and checkpoints in run.dir's parent, "." in run.dir itself.
TEST(Settings, RunNameStaysInsideRunDir) {
  for (const std::string name : {"..", ".", "a/../..", "/etc", "a/b", "../x"}) {
    const std::string e = settingsErrorOf({"--run.name=" + name});
    EXPECT_NE(e.find("--run.name=" + name + ": must be a plain name inside run.dir"), std::string::npos)
        << name << ": " << e;
  }
  for (const std::string name : {"..x", ".hidden", "a.b", "run-1"})
    EXPECT_EQ(settingsErrorOf({"--run.name=" + name}), "") << name;
}

// model.attention reaches the GPT's config (auto by default); a name it does not know is refused.
TEST(Settings, AttentionBackendReachesTheGptConfig) {
  EXPECT_EQ(Settings::fromConfig(Config::fromArgs({"--model.type=gpt"})).gpt.attention, AttentionBackend::kAuto);
  EXPECT_EQ(Settings::fromConfig(Config::fromArgs({"--model.type=gpt", "--model.attention=cudnn"})).gpt.attention,
            AttentionBackend::kCudnn);
  EXPECT_EQ(Settings::fromConfig(Config::fromArgs({"--model.type=gpt", "--model.attention=flash"})).gpt.attention,
            AttentionBackend::kFlash);
  const std::string e = settingsErrorOf({"--model.type=gpt", "--model.attention=sdpa"});
  EXPECT_NE(e.find("model.attention"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, flash, cudnn"), std::string::npos) << e;
}

// MT_LOG_LEVEL=verbose was ignored without a word (the run logged at info).
TEST(Settings, UnknownLogLevelInTheEnvironmentIsRefused) {
  const LogLevel before = logLevel();
  setenv("MT_LOG_LEVEL", "verbose", 1);
  const std::string e = settingsErrorOf({});
  EXPECT_NE(
      e.find("environment variable MT_LOG_LEVEL='verbose' is not a log level: expected debug, info, warn or "
             "error"),
      std::string::npos)
      << e;
  setenv("MT_LOG_LEVEL", "warn", 1);
  EXPECT_EQ(settingsErrorOf({"--run.log_level=debug"}), "");
  EXPECT_EQ(logLevel(), LogLevel::kWarn);  // the environment wins over run.log_level
  unsetenv("MT_LOG_LEVEL");
  EXPECT_EQ(settingsErrorOf({"--run.log_level=error"}), "");
  EXPECT_EQ(logLevel(), LogLevel::kError);
  setLogLevel(before);
}

}  // namespace
}  // namespace mt
