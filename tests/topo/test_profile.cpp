#include <gtest/gtest.h>

#include <cstdlib>

#include "core/Error.h"
#include "topo/Profile.h"

namespace mt {
namespace {

void expectProfileError(const std::string& text, const std::string& needle) {
  try {
    Profile::parse(text, "p.env");
    FAIL() << "no error for " << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Profile, ErrorsNameFileAndLine) {
  expectProfileError("# comment\nNCCL_IB_HCA=mlx5\nNCCL_IB_HCAA=mlx5\n", "p.env:3: unknown NCCL variable NCCL_IB_HCAA");
  expectProfileError("NCCL_IB_TIMEOUT=99\n", "p.env:1: NCCL_IB_TIMEOUT='99': must be an integer in [1, 31]");
  expectProfileError("\nNCCL_IB_DISABLE=yes\n", "p.env:2: NCCL_IB_DISABLE='yes': must be 0 or 1");
  expectProfileError("NCCL_PROTO=LL,LL256\n", "p.env:1: NCCL_PROTO='LL,LL256': unknown element 'LL256'");
  expectProfileError("NCCL_NET_GDR_LEVEL=FAR\n", "NCCL_NET_GDR_LEVEL='FAR': must be one of LOC,PIX,PXB,PHB,SYS");
  expectProfileError("fabric = ethernet\n", "p.env:1: fabric='ethernet'");
  expectProfileError("NCCL_DEBUG=INFO\nNCCL_DEBUG=WARN\n", "p.env:2: NCCL_DEBUG set twice (first on line 1)");
  expectProfileError("just words\n", "p.env:1: expected KEY=VALUE");
  expectProfileError("colour=blue\n", "p.env:1: unknown key colour");
}

TEST(Profile, DeprecatedNamesWarnWithReplacement) {
  Profile p = Profile::parse("NCCL_MIN_NRINGS=4\nexport NCCL_ALGO=\"^tree\"\nNCCL_PROTO=allreduce:^LL128;broadcast:simple\n",
                             "old.env");
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("old.env:1: NCCL_MIN_NRINGS is deprecated, use NCCL_MIN_NCHANNELS"), std::string::npos);
  ASSERT_EQ(p.nccl.size(), 3u);
  EXPECT_EQ(p.nccl[1].value, "^tree");
}

TEST(Profile, ShippedProfilesLoadAndApplyWithoutOverridingTheUser) {
  const std::string dir = std::getenv("PROFILE_DIR");
  auto names = listProfiles(dir);
  for (const char* want : {"ib-ndr", "ib-hdr", "roce-v2", "socket", "efa"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const auto& n : names) EXPECT_NO_THROW(Profile::load(n, dir)) << n;
  Profile p = Profile::load("ib-ndr", dir);
  EXPECT_EQ(p.hints.at("fabric"), "ib");
  setenv("NCCL_IB_TIMEOUT", "18", 1);
  unsetenv("NCCL_IB_RETRY_CNT");
  auto effective = p.apply();
  EXPECT_STREQ(std::getenv("NCCL_IB_TIMEOUT"), "18");  // the user's value wins
  EXPECT_STREQ(std::getenv("NCCL_IB_RETRY_CNT"), "7");
  bool noted = false;
  for (const auto& l : effective) noted = noted || l.find("NCCL_IB_TIMEOUT=18 (environment; profile says 22)") == 0;
  EXPECT_TRUE(noted);
  EXPECT_THROW(Profile::load("no-such-profile", dir), ConfigError);
}

}  // namespace
}  // namespace mt
