// A checkpoint's meta.json as input (launch/CheckpointMeta): what save() writes parses back; every
// field of the wrong type or out of range, a missing or wrong checksum, an unknown version are
// CheckpointErrors naming the file and the key. And the architecture comparison of resumes
// (launch/Architecture): structure differs -> changes, dropout and normalisation -> notes.

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "launch/Architecture.h"
#include "launch/CheckpointMeta.h"

namespace mt {
namespace {

using Json = nlohmann::json;

CheckpointMeta sample() {
  CheckpointMeta m;
  m.state.step = 40;
  m.state.loaderSeq = 40;
  m.state.seed = 7;
  m.state.lossScale = 8192.f;
  m.state.scalerClean = 12;
  m.state.scalerSkipped = 5;
  m.optimizerSteps = 40;
  m.identity = {R"({"format":"meshtrain-architecture","type":"mlp"})", "/data/f.h5", "train", 256, "/runs/a"};
  m.worldSize = 2;
  m.numel = 110;
  m.stateNames = {"exp_avg", "exp_avg_sq"};
  m.compression = "powersgd";
  m.params = {{"fc.weight", {10, 10}, 0}, {"fc.bias", {10}, 100}};
  m.files = {{"rank0.h5", 123, 440}, {"rank1.h5", 4294967295u, 440}};
  // Two FP8 states, [casts, scale, scaleInv, amax, h_0] bits each, per rank (a NaN amax included).
  m.state.fp8Names = {"h0.qkv.x", "h0.qkv.w"};
  m.fp8Ranks = {
      {3, 0x43e00000, 0x3b924925, 0x3f800000, 0x3f800000, 3, 0x3f800000, 0x3f800000, 0x7fc00000, 0},
      {3, 0x43e00000, 0x3b924925, 0x40000000, 0x3f800000, 3, 0x3f800000, 0x3f800000, 0xffffffff, 0}};
  return m;
}

// meta.json of sample() changed by `edit`, its checksum recomputed (as a knowing editor would).
std::string edited(const std::function<void(Json&)>& edit, bool reseal = true) {
  Json j = Json::parse(sample().toJson());
  edit(j);
  if (reseal && j.contains("meta_crc32")) {
    j.erase("meta_crc32");
    const std::string body = j.dump();
    j["meta_crc32"] = crc32Of(body.data(), body.size());
  }
  return j.dump(2);
}

// The CheckpointError message of parsing `text`, or "" when it parses.
std::string errorOf(const std::string& text) {
  try {
    parseCheckpointMeta(text, "/ck/step_40");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointMeta, WhatSaveWritesParsesBack) {
  const CheckpointMeta m = parseCheckpointMeta(sample().toJson(), "/ck/step_40");
  EXPECT_EQ(m.version, kCheckpointVersion);
  EXPECT_EQ(m.state.step, 40);
  EXPECT_EQ(m.state.seed, 7u);
  EXPECT_EQ(m.state.lossScale, 8192.f);  // the f16 loss scaler's state, skipped steps included
  EXPECT_EQ(m.state.scalerSkipped, 5);
  EXPECT_EQ(m.identity.dataPath, "/data/f.h5");
  EXPECT_EQ(m.identity.globalBatch, 256);
  EXPECT_EQ(m.identity.runDir, "/runs/a");
  EXPECT_EQ(m.compression, "powersgd");
  ASSERT_EQ(m.params.size(), 2u);
  EXPECT_EQ(m.params[0].shape, (Shape{10, 10}));
  EXPECT_EQ(m.params[1].offset, 100);
  EXPECT_EQ(m.files[1].crc32, 4294967295u);
  EXPECT_EQ(m.state.fp8Names, sample().state.fp8Names);
  EXPECT_EQ(m.fp8Ranks, sample().fp8Ranks);
  EXPECT_EQ(m.toJson(), sample().toJson());
}

TEST(CheckpointMeta, ValuesOfTheWrongTypeOrRangeNameTheKey) {
  const std::string where = "checkpoint /ck/step_40: meta.json: ";
  const struct {
    std::function<void(Json&)> edit;
    std::string message;
  } cases[] = {
      {[](Json& j) { j["step"] = 1e300; }, "'step' must be an integer in [0, "},
      {[](Json& j) { j["step"] = -1; }, "'step' must be an integer in [0, "},
      {[](Json& j) { j["step"] = "40"; }, "'step' must be an integer in [0, 1125899906842624], not \"40\""},
      {[](Json& j) { j["numel"] = "110"; }, "'numel' must be an integer"},
      {[](Json& j) { j["version"] = 999; },
       "'version' is 999; this trainer reads checkpoint versions 1 to 2"},
      {[](Json& j) { j["world_size"] = 0; }, "'world_size' must be an integer in [1, "},
      {[](Json& j) { j["world_size"] = 3; }, "'files' lists 2 files for world_size 3"},
      {[](Json& j) { j["files"][1]["name"] = "../../etc/passwd"; }, "'files[1].name' must be rank1.h5"},
      {[](Json& j) { j["files"][0]["crc32"] = "x"; }, "'files[0].crc32' must be an integer"},
      {[](Json& j) { j["files"][0]["crc32"] = 4294967296; },
       "'files[0].crc32' must be an integer in [0, 4294967295]"},
      {[](Json& j) { j["loss_scale"] = "inf"; }, "'loss_scale' must be a number"},
      {[](Json& j) { j["seed"] = -3; }, "'seed' must be a non-negative integer"},
      {[](Json& j) { j["strategy"] = "zero3"; }, "'strategy' names no sharding strategy"},
      {[](Json& j) { j["state_names"] = {"a/b"}; }, "'state_names[0]' is not a state name"},
      {[](Json& j) { j.erase("params"); }, "'params' is missing"},
      {[](Json& j) { j["params"] = Json::array(); }, "'params' is empty"},
      {[](Json& j) {
         j["params"][0]["shape"] = {"10", 10};
       },
       "'params[0].shape' must be an integer"},
      {[](Json& j) { j["params"][1]["offset"] = 105; },
       "'params[1]' fc.bias (10 elements at offset 105) lies beyond"},
      {[](Json& j) { j["params"][1]["offset"] = 95; }, "'params' two parameters overlap at offset 95"},
      {[](Json& j) {
         j["params"][0]["shape"] = {1 << 30, 1 << 30, 1 << 30};
       },
       "'params[0].shape' must be an integer"},
      {[](Json& j) { j["params"][1]["name"] = "fc.weight"; }, "'params[1].name' repeats fc.weight"},
      {[](Json& j) { j["data"]["batch_size"] = 0; }, "'data.batch_size' must be an integer in [1, "},
      {[](Json& j) { j["compression"] = "zip"; }, "'compression' names no compression method"},
      {[](Json& j) { j["run_dir"] = 3; }, "'run_dir' must be a string"},
      {[](Json& j) { j["fp8"]["names"][1] = "h0.qkv.x"; }, "'fp8.names' repeat a name"},
      {[](Json& j) { j["fp8"]["names"][0] = "../x"; }, "'fp8.names[0]' is not a state name"},
      {[](Json& j) { j["fp8"]["ranks"].erase(1); }, "'fp8.ranks' must hold world_size (2) lists"},
      {[](Json& j) { j["fp8"]["ranks"][1].erase(9); }, "'fp8.ranks[1]' must be a list of a whole number"},
      {[](Json& j) { j["fp8"]["ranks"][0][1] = 4294967296; },
       "'fp8.ranks[0]' must be an integer in [0, 4294967295]"},
      {[](Json& j) { j["fp8"]["ranks"][0][0] = -1; }, "'fp8.ranks[0]' must be an integer in [0, "},
      {[](Json& j) { j["fp8"] = 3; }, "'fp8' must be an object"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(errorOf(edited(c.edit)).rfind(where + c.message, 0), 0u) << errorOf(edited(c.edit));
}

TEST(CheckpointMeta, ChecksumIsRequiredAndChecked) {
  EXPECT_EQ(errorOf(edited([](Json& j) { j.erase("meta_crc32"); })),
            "checkpoint /ck/step_40: meta.json: 'meta_crc32' is missing");
  EXPECT_EQ(errorOf(edited([](Json& j) { j["step"] = 41; }, false)),
            "checkpoint /ck/step_40: meta.json does not match its checksum (edited or corrupt)");
  EXPECT_NE(errorOf("{\"format\": \"meshtrain-checkpoint\", ").find("meta.json is corrupt"),
            std::string::npos);
  EXPECT_NE(errorOf("[1, 2]").find("not a meshtrain checkpoint"), std::string::npos);
}

TEST(CheckpointMeta, VersionOneHasNoDataOrCompression) {
  const CheckpointMeta m = parseCheckpointMeta(edited([](Json& j) { j["version"] = 1; }), "/ck");
  EXPECT_EQ(m.version, 1);
  EXPECT_TRUE(m.identity.dataPath.empty());
  EXPECT_TRUE(m.compression.empty());
}

std::string mlp(const std::string& activation, int hidden, double dropout, double mean) {
  Json layers = Json::array();
  layers.push_back({{"name", "input"}, {"kind", "image_input"}, {"mean", mean}, {"output", "flat_hwc"}});
  layers.push_back({{"name", "fc1"}, {"kind", "linear"}, {"in_features", 784}, {"out_features", hidden}});
  layers.push_back({{"name", "act1"}, {"kind", activation}});
  if (dropout > 0) layers.push_back({{"name", "drop1"}, {"kind", "dropout"}, {"p", dropout}});
  layers.push_back({{"name", "fc2"}, {"kind", "linear"}, {"in_features", hidden}, {"out_features", 10}});
  return Json{{"type", "mlp"}, {"layers", layers}}.dump();
}

TEST(Architecture, StructureChangesDropoutAndNormalisationAreNotes) {
  const std::string base = mlp("relu", 256, 0.1, 0.5);
  EXPECT_TRUE(compareArchitectures(base, base).changes.empty());
  EXPECT_TRUE(compareArchitectures(base, base).notes.empty());
  const ArchitectureDiff sizes = compareArchitectures(base, mlp("relu", 238, 0.1, 0.5));
  ASSERT_EQ(sizes.changes.size(), 2u);
  EXPECT_EQ(sizes.changes[0], "layers[fc1].out_features: 256 in the checkpoint, 238 in this model");
  EXPECT_EQ(sizes.changes[1], "layers[fc2].in_features: 256 in the checkpoint, 238 in this model");
  const ArchitectureDiff act = compareArchitectures(base, mlp("gelu", 256, 0.1, 0.5));
  ASSERT_EQ(act.changes.size(), 1u);
  EXPECT_EQ(act.changes[0], "layers[act1].kind: \"relu\" in the checkpoint, \"gelu\" in this model");
  const ArchitectureDiff soft = compareArchitectures(base, mlp("relu", 256, 0.0, 0.25));
  EXPECT_TRUE(soft.changes.empty());
  ASSERT_EQ(soft.notes.size(), 2u);
  EXPECT_EQ(soft.notes[0], "dropout (p per layer): [0.1] in the checkpoint, [] in this model");
  EXPECT_EQ(soft.notes[1], "layers[input].mean: 0.5 in the checkpoint, 0.25 in this model");
  const ArchitectureDiff gpt = compareArchitectures(R"({"type":"gpt","n_head":4,"n_embd":64})",
                                                    R"({"type":"gpt","n_head":16,"n_embd":64})");
  ASSERT_EQ(gpt.changes.size(), 1u);
  EXPECT_EQ(gpt.changes[0], "n_head: 4 in the checkpoint, 16 in this model");
}

}  // namespace
}  // namespace mt
