// Every real topology sample loads with the right GPU and NIC counts, fabrics and rails; malformed
// files fail with file:line:column.

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>

#include "core/Error.h"
#include "topo/CostModel.h"
#include "topo/Topology.h"

namespace mt {
namespace {

std::string sample(const std::string& name) { return std::string(std::getenv("TOPO_SAMPLES")) + "/" + name; }

std::vector<int> rails(const Topology& t) {
  std::vector<int> out;
  for (size_t g = 0; g < t.gpus().size(); ++g) {
    auto r = t.rail(static_cast<int>(g));
    out.push_back(r.size() == 1 ? r[0] : -static_cast<int>(r.size()));
  }
  return out;
}

TEST(Topology, AzureNdH100v5PciOnly) {
  Topology t = Topology::load(sample("azhpc-ndv5-topo.xml"));
  EXPECT_EQ(t.cpus().size(), 2u);
  EXPECT_EQ(t.gpus().size(), 8u);  // class 0x0302 devices without <gpu> children
  EXPECT_EQ(t.nics().size(), 8u);  // class 0x0207 devices without <nic> children
  for (const auto& n : t.nics()) EXPECT_EQ(n.fabric, Fabric::kInfiniBand);
  EXPECT_EQ(rails(t), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.railPath(0), PathType::kPIX);  // GPU and NIC behind the same virtual bridge
  EXPECT_EQ(t.gpus()[4].cpu, 1);
  EXPECT_EQ(t.cpus()[0].cores.size(), 48u);
  EXPECT_NEAR(t.pcis()[static_cast<size_t>(t.gpus()[0].pci)].bandwidthGBs, 63.0, 0.1);  // Gen5 x16
}

TEST(Topology, OciH100RoceDualPort) {
  Topology t = Topology::load(sample("oci-hpc-H100-topology.xml"));
  EXPECT_EQ(t.gpus().size(), 8u);
  EXPECT_EQ(t.nics().size(), 8u);
  size_t ports = 0;
  for (const auto& n : t.nics()) {
    EXPECT_EQ(n.fabric, Fabric::kRoCE);  // Mellanox in Ethernet mode
    EXPECT_EQ(n.nets.size(), 2u);        // dual-port
    ports += n.nets.size();
    EXPECT_NEAR(n.speedGbps(), 360.0, 1e-9);
  }
  EXPECT_EQ(ports, 16u);
  EXPECT_EQ(rails(t), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.railPath(0), PathType::kPXB);
  EXPECT_NEAR(t.gpus()[0].nvlinkGBs, 18 * 20.6, 1e-6);
  EXPECT_TRUE(t.gpus()[0].nvlinks[0].toSwitch);
  EXPECT_EQ(t.primaryFabric(), Fabric::kRoCE);
}

TEST(Topology, WorkstationWithOneIbNic) {
  Topology t = Topology::load(sample("panlichen-nccl-tests-topo.xml"));
  EXPECT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 1u);
  EXPECT_EQ(t.nics()[0].fabric, Fabric::kInfiniBand);
  EXPECT_NEAR(t.nics()[0].speedGbps(), 56.0, 1e-9);
  // GPUs 4-7 share the NIC's switch; 0-3 reach it across the CPUs.
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(t.rail(g), std::vector<int>{0});
    EXPECT_EQ(t.railPath(g), g < 4 ? PathType::kSYS : PathType::kPIX) << g;
  }
}

TEST(Topology, H200VmDump) {
  Topology t = Topology::load(sample("h200-vm-1gpu-dump.xml"));
  ASSERT_EQ(t.gpus().size(), 1u);
  EXPECT_EQ(t.gpus()[0].sm, 90);
  ASSERT_EQ(t.nics().size(), 1u);
  EXPECT_EQ(t.nics()[0].fabric, Fabric::kSocket);  // eth0 without a PCI device: TCP
  EXPECT_EQ(t.nics()[0].nets[0].name, "eth0");
  EXPECT_EQ(t.rail(0), std::vector<int>{0});
  EXPECT_EQ(t.cpus()[0].numa, -1);
}

void expectError(const std::string& xml, const std::string& where, const std::string& what) {
  try {
    Topology::fromDocument(parseTopologyXmlString(xml, "bad.xml"));
    FAIL() << "no error for " << xml;
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.xml:" + where), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Topology, MalformedFilesNameLineAndColumn) {
  expectError("<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\">\n  </cpu>\n</system>\n", "4:",
              "XML error");
  expectError("<system version=\"2\">\n</system>\n", "1:", "unsupported topology version \"2\"");
  expectError("<system>\n</system>\n", "1:", "no version attribute");
  expectError("<system version=\"1\">\n\t<cpu numaid=\"0\"/>\n</system>\n", "2:1", "tab character");
  expectError("<machine version=\"1\"/>\n", "1:", "root element must be <system>");
  expectError("<system version=\"1\"><cpu><pci class=\"0x0302\"/></cpu></system>", "1:", "<pci> without busid");
}

// 50 000 nested elements overflowed the stack (segfault) in the recursive tree build: refused.
TEST(Topology, DeepNestingIsRefusedNotACrash) {
  std::string xml = "<system version=\"1\">\n";
  for (int i = 0; i < 50000; ++i) xml += "<pci>";
  for (int i = 0; i < 50000; ++i) xml += "</pci>";
  xml += "\n</system>\n";
  expectError(xml, "2:", "nested deeper than 64 levels");
  std::string ok = "<system version=\"1\">";  // 60 levels parse
  for (int i = 0; i < 59; ++i) ok += "<x>";
  for (int i = 0; i < 59; ++i) ok += "</x>";
  ok += "</system>";
  EXPECT_NO_THROW(parseTopologyXmlString(ok, "ok.xml"));
}

TEST(Topology, CommentsBlankLinesAndUnknownElements) {
  Topology t = Topology::fromDocument(parseTopologyXmlString(
      "<!-- a comment -->\n\n<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"0000000f\">\n"
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
      "      <gpu dev=\"0\" sm=\"80\"><nvlink target=\"0000:02:00.0\" count=\"12\" tclass=\"0x068000\"/><future/></gpu>\n"
      "    </pci>\n    <gizmo/>\n  </cpu>\n</system>\n",
      "ok.xml"));
  EXPECT_EQ(t.gpus().size(), 1u);
  EXPECT_NEAR(t.gpus()[0].nvlinkGBs, 240.0, 1e-9);  // A100: 12 links x 20 GB/s
  EXPECT_EQ(t.cpus()[0].cores, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(t.skipped().size(), 2u);
  EXPECT_NE(t.skipped()[0].find("<future> at ok.xml:6"), std::string::npos) << t.skipped()[0];
  EXPECT_NE(t.skipped()[1].find("<gizmo> at ok.xml:8"), std::string::npos) << t.skipped()[1];
}

TEST(Topology, FabricOverrideAndMasks) {
  Topology t = Topology::load(sample("oci-hpc-H100-topology.xml"));
  t.setFabric(Fabric::kInfiniBand);
  EXPECT_EQ(t.primaryFabric(), Fabric::kInfiniBand);
  EXPECT_EQ(coresOfMask("00000001,80000000"), (std::vector<int>{31, 32}));
  EXPECT_NEAR(pcieBandwidthGBs(8.0, 16), 15.75, 0.01);
  EXPECT_NEAR(pcieBandwidthGBs(5.0, 16), 8.0, 1e-9);
}

// The shape of AWS's aws-ofi-nccl p4d/p5 files (written here, not copied): GPUs and Ethernet-class
// NICs behind PCI switches, the NICs given by class code only (no vendor, no <nic>/<net>), plus a
// vendor-named Ethernet port on the CPU root that no GPU is near.
TEST(Topology, ClassOnlyNicsAreUnknownAndOffRailNicsAreNotCounted) {
  const std::string xml =
      "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ffff\" arch=\"x86_64\" vendor=\"GenuineIntel\">"
      "<pci busid=\"0000:10:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
      "<pci busid=\"0000:10:1c.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/>"
      "<pci busid=\"0000:10:1b.0\" class=\"0x020000\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/></pci>"
      "<pci busid=\"0000:20:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
      "<pci busid=\"0000:20:1c.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/>"
      "<pci busid=\"0000:20:1b.0\" class=\"0x020000\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/></pci>"
      "<pci busid=\"0000:05:00.0\" class=\"0x020000\" vendor=\"0x8086\" link_speed=\"8.0 GT/s PCIe\" link_width=\"8\"/>"
      "</cpu></system>";
  Topology t = Topology::fromDocument(parseTopologyXmlString(xml, "p4d-shape.xml"));
  ASSERT_EQ(t.gpus().size(), 2u);
  ASSERT_EQ(t.nics().size(), 3u);
  EXPECT_EQ(t.nics()[0].fabric, Fabric::kUnknown);  // class 0x0200 and nothing else: not "socket"
  EXPECT_EQ(t.nics()[1].fabric, Fabric::kUnknown);
  EXPECT_EQ(t.nics()[2].fabric, Fabric::kSocket);  // a named Ethernet vendor without RDMA: TCP
  EXPECT_EQ(t.primaryFabric(), Fabric::kUnknown);
  EXPECT_EQ(rails(t), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.railNics(), (std::vector<int>{0, 1}));  // the root port is no GPU's rail
  const std::string s = t.summary();
  EXPECT_NE(s.find("2 NIC(s) of unknown fabric"), std::string::npos) << s;
  EXPECT_NE(s.find("efa for AWS EFA"), std::string::npos) << s;
  // trainer predict's per-node bandwidth counts the two rail NICs, not the management port.
  EXPECT_EQ(CostModel::specFrom(t, nullptr).nicsPerNode, 2);
}

// A rank finds its GPU in the file by PCI bus id, in CUDA's or nvidia-smi's spelling; a bus id the
// file does not have finds nothing (trainer refuses it: exit 2, not the index-order guess).
TEST(Topology, GpuByBusId) {
  Topology t = Topology::load(sample("h200-vm-1gpu-dump.xml"));
  ASSERT_EQ(t.gpus().size(), 1u);
  EXPECT_EQ(t.gpuByBusId("0000:00:06.0"), &t.gpus()[0]);
  EXPECT_EQ(t.gpuByBusId("00000000:00:06.0"), &t.gpus()[0]);  // nvidia-smi's 8-digit domain
  EXPECT_EQ(t.gpuByBusId("0000:00:07.0"), nullptr);
  EXPECT_EQ(t.gpuByBusId("not a bus id"), nullptr);
  Topology a = Topology::load(sample("azhpc-ndv5-topo.xml"));
  for (const auto& g : a.gpus()) {
    std::string upper = g.busid;
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(a.gpuByBusId(upper), &g) << upper;  // CUDA writes hex digits in upper case
  }
}

}  // namespace
}  // namespace mt

// Found by tests/fuzz/fuzz_topo: a NIC name that is not UTF-8 made json() throw nlohmann's
// type_error, which `trainer topo --json` did not catch (std::terminate, SIGABRT).
TEST(Topology, NonUtf8NamesDoNotBreakTheJsonSummary) {
  const std::string xml =
      "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\" vendor=\"GenuineIntel\">"
      "<pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">"
      "<gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\"/></pci>"
      "<pci busid=\"0000:02:00.0\" class=\"0x020700\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">"
      "<nic><net name=\"mlx5_\xa3\xff\" dev=\"0\" speed=\"400000\" port=\"1\" gdr=\"1\"/></nic></pci></cpu></system>";
  mt::Topology t = mt::Topology::fromDocument(mt::parseTopologyXmlString(xml, "nonutf8.xml"));
  std::string j;
  ASSERT_NO_THROW(j = t.json());
  EXPECT_NE(j.find("\xef\xbf\xbd"), std::string::npos) << j;  // U+FFFD in place of the bad bytes
  EXPECT_NO_THROW(t.summary());
}

