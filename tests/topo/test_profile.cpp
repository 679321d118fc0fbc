#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

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

// comm.<scope>.<field>: ncclConfig_t per communicator, checked against NcclParams.cpp's table.
TEST(Profile, PerCommunicatorNcclConfig) {
  Profile p = Profile::parse("comm.all.cga_cluster_size = 2\ncomm.inter.max_ctas = 4\ncomm.inter.min_ctas = 2\n"
                             "comm.world.net_name = IB\ncomm.intra.split_share = 1\ncomm.all.max_ctas = 16\n"
                             "comm.inter.traffic_class = 106\n",
                             "c.env");
  const CommTuning inter = p.tuning("inter"), world = p.tuning("world"), intra = p.tuning("intra");
  EXPECT_EQ(inter.maxCtas, 4);  // the scope's value beats all's
  EXPECT_EQ(inter.minCtas, 2);
  EXPECT_EQ(inter.cgaClusterSize, 2);
  EXPECT_EQ(inter.trafficClass, 106);
  EXPECT_EQ(world.maxCtas, 16);
  EXPECT_EQ(world.netName, "IB");
  EXPECT_EQ(world.splitShare, -1);
  EXPECT_EQ(intra.splitShare, 1);
  EXPECT_EQ(inter.describe(), "cga_cluster_size=2 min_ctas=2 max_ctas=4 traffic_class=106");
  EXPECT_EQ(CommTuning().describe(), "default");

  expectProfileError("comm.rail.max_ctas=4\n", "p.env:1: comm.rail.max_ctas: unknown communicator scope 'rail'");
  expectProfileError("comm.inter.maxctas=4\n", "p.env:1: comm.inter.maxctas: unknown ncclConfig_t field 'maxctas'");
  expectProfileError("comm.inter.max_ctas=65\n", "p.env:1: comm.inter.max_ctas='65': must be an integer in [1, 64]");
  expectProfileError("comm.all.split_share=2\n", "comm.all.split_share='2': must be 0 or 1");
  expectProfileError("comm.all.cga_cluster_size=9\n", "must be an integer in [0, 8]");
  expectProfileError("comm.inter.max_ctas=4\ncomm.inter.max_ctas=8\n", "p.env:2: comm.inter.max_ctas set twice");
  // NCCL refuses minCTAs > maxCTAs when it creates the communicator; here it names the file.
  expectProfileError("comm.all.min_ctas=8\ncomm.inter.max_ctas=4\n",
                     "p.env: communicators of scope inter get min_ctas 8 > max_ctas 4");
}

// NCCL lets NCCL_MAX_CTAS (and the others of the table) override the field in every communicator:
// a profile that sets both would have its per-communicator value silently ignored.
TEST(Profile, ConfigFieldAndItsOverridingVariableAreRefused) {
  Profile p = Profile::parse("NCCL_MAX_CTAS=8\ncomm.inter.max_ctas=4\n", "both.env");
  try {
    p.checkTuningAgainst({"NCCL_MAX_CTAS=8 (profile both)"});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("both.env:2: comm.inter.max_ctas sets ncclConfig_t maxCTAs, but "
                                         "NCCL_MAX_CTAS=8 (profile both) is in effect"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Profile::parse("comm.world.net_name=IB\n", "n.env").checkTuningAgainst({"NCCL_NET=Socket (environment)"}),
               ConfigError);
  // traffic_class has no overriding variable; unrelated variables do not matter.
  EXPECT_NO_THROW(Profile::parse("comm.all.traffic_class=3\n", "t.env").checkTuningAgainst({"NCCL_IB_TC=5 (environment)"}));
  EXPECT_NO_THROW(p.checkTuningAgainst({"NCCL_MIN_CTAS=2 (environment)"}));
}

// nan passes every comparison and 1e309 parses as inf: both reached the cost model. Each fabric
// number must be finite and in its range, the message naming the file, line, key and value.
TEST(Profile, NonFiniteAndOutOfRangeFabricNumbersAreRefused) {
  for (const std::string v : {"nan", "NaN", "inf", "-inf", "1e309", "100001", "0", "-5", "4e5x", "1e-320"})
    expectProfileError("fabric = ib\nnic_gbps = " + v + "\n",
                       "p.env:2: nic_gbps='" + v + "': expected a finite number in (0, 100000]");
  for (const std::string v : {"nan", "inf", "1.5", "0"})
    expectProfileError("nic_efficiency = " + v + "\n",
                       "p.env:1: nic_efficiency='" + v + "': expected a finite number in (0, 1]");
  Profile p = Profile::parse("nic_gbps = 400\nnic_efficiency = 0.94\n", "ok.env");
  EXPECT_EQ(p.hints.at("nic_gbps"), "400");
}

// A directory given as the profile (a path, or a name whose .env is one) is refused saying so.
TEST(Profile, ADirectoryIsNotAProfile) {
  char tmpl[] = "/tmp/mt_profile_dir_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string named = dir + "/fabric.env";
  ASSERT_EQ(mkdir(named.c_str(), 0755), 0);
  for (const auto& [nameOrPath, file] : {std::pair<std::string, std::string>{dir, dir}, {"fabric", named}}) {
    try {
      Profile::load(nameOrPath, dir);
      ADD_FAILURE() << "no error for " << nameOrPath;
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("profile " + file + ": cannot be read: not a regular file (a directory)"),
                std::string::npos)
          << msg;
      EXPECT_EQ(e.exitCode(), ExitCode::kBadInput);
    }
  }
  rmdir(named.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace mt
