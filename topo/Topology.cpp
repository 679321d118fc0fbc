#include "topo/Topology.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"

namespace mt {

const EnumTable<Fabric>& fabrics() {
  static const EnumTable<Fabric> kTable = {
      {Fabric::kInfiniBand, "ib", "InfiniBand"},
      {Fabric::kRoCE, "roce", "RDMA over Converged Ethernet"},
      {Fabric::kEFA, "efa", "AWS Elastic Fabric Adapter"},
      {Fabric::kSocket, "socket", "TCP sockets"},
      {Fabric::kUnknown, "unknown", "", /*selectable=*/false},
  };
  return kTable;
}

const char* fabricName(Fabric f) { return enumName(fabrics(), f); }

bool parseFabric(const std::string& s, Fabric* out) { return parseEnum(fabrics(), s, out); }

const char* pathTypeName(PathType p) {
  switch (p) {
    case PathType::kPIX: return "PIX";
    case PathType::kPXB: return "PXB";
    case PathType::kPHB: return "PHB";
    case PathType::kSYS: return "SYS";
  }
  return "?";
}

double pcieBandwidthGBs(double gts, int width) {
  // Encoding: 8b/10b up to 5 GT/s, 128b/130b from 8 GT/s; bytes = bits / 8.
  const double efficiency = gts <= 5.0 ? 0.8 : 128.0 / 130.0;
  return gts * efficiency / 8.0 * width;
}

double nvlinkPerLinkGBs(int sm) {
  // NCCL's per-link figures (src/graph/topo.h): SM60 18, SM70 20, SM80 20, SM90 20.6 GB/s.
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm >= 70) return 20.0;
  return 18.0;
}

std::vector<int> coresOfMask(const std::string& mask) {
  std::vector<std::string> words;
  std::stringstream ss(mask);
  std::string w;
  while (std::getline(ss, w, ',')) words.push_back(w);
  std::vector<int> cores;
  for (size_t i = 0; i < words.size(); ++i) {
    const uint64_t v = std::strtoull(words[i].c_str(), nullptr, 16);
    const int base = static_cast<int>((words.size() - 1 - i) * 32);
    for (int b = 0; b < 32; ++b)
      if (v & (1ull << b)) cores.push_back(base + b);
  }
  std::sort(cores.begin(), cores.end());
  return cores;
}

double TopoNic::speedGbps() const {
  double s = 0;
  for (const auto& n : nets) s += n.speedGbps;
  return s;
}

namespace {

uint32_t parseHex(const std::string& s) { return static_cast<uint32_t>(std::strtoul(s.c_str(), nullptr, 16)); }

double parseGTs(const std::string& s) { return std::atof(s.c_str()); }  // "32.0 GT/s PCIe"

Fabric inferFabric(uint32_t pciClass, const std::string& vendor, bool hasPci) {
  const uint32_t cls = pciClass >> 8;
  if (!hasPci) return Fabric::kSocket;
  if (vendor == "0x1d0f") return Fabric::kEFA;  // AWS Elastic Fabric Adapter
  if (cls == 0x0207) return Fabric::kInfiniBand;
  if (cls == 0x0200 && vendor == "0x15b3") return Fabric::kRoCE;  // Mellanox/NVIDIA in Ethernet mode
  // An Ethernet controller the file names by class code alone (AWS's aws-ofi-nccl files give the
  // EFA devices of p4d/p5 this way): EFA, RoCE or plain TCP are all possible, so unknown (the
  // summary says to set a profile), not sockets.
  if (cls == 0x0200 && vendor.empty()) return Fabric::kUnknown;
  if (cls == 0x0200) return Fabric::kSocket;
  return Fabric::kUnknown;
}

}  // namespace

Topology Topology::load(const std::string& path) { return fromDocument(parseTopologyXml(path)); }

Topology Topology::fromDocument(const XmlDocument& doc) {
  Topology t;
  t.source_ = doc.path;
  for (const XmlNode& c : doc.root.children) t.walk(c, doc, -1, -1);
  // A second pass once every GPU is known: each GPU's NVLink bandwidth (by its SM generation) and
  // one link per <nvlink> to its target, an NVSwitch or another GPU by bus id.
  for (auto& g : t.gpus_) {
    const double perLink = nvlinkPerLinkGBs(g.sm);
    for (auto& l : g.nvlinks) {
      g.nvlinkGBs += perLink * l.count;
      t.links_.push_back({TopoLink::Kind::kNVLink, g.busid, l.target, perLink * l.count});
    }
  }
  for (const auto& s : t.skipped_) MT_LOG_DEBUG << "topology: skipped unknown element " << s;
  return t;
}

// One builder per element (NCCL's topology passes): each appends its element and walks its children.
void Topology::walk(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci) {
  using Builder = void (Topology::*)(const XmlNode&, const XmlDocument&, int, int);
  static const std::pair<const char*, Builder> kBuilders[] = {{"cpu", &Topology::buildCpu},
                                                              {"pci", &Topology::buildPci},
                                                              {"gpu", &Topology::buildGpu},
                                                              {"nic", &Topology::buildNic}};
  for (const auto& [name, build] : kBuilders)
    if (n.name == name) return (this->*build)(n, doc, cpu, parentPci);
  skipped_.push_back("<" + n.name + "> at " + doc.where(n));
}

void Topology::buildCpu(const XmlNode& n, const XmlDocument& doc, int, int) {
  TopoCpu c;
  c.numa = std::atoi(n.attrOr("numaid", "-1").c_str());
  c.affinityMask = n.attrOr("affinity", "");
  c.cores = coresOfMask(c.affinityMask);
  c.arch = n.attrOr("arch", "");
  c.vendor = n.attrOr("vendor", "");
  cpus_.push_back(c);
  const int idx = static_cast<int>(cpus_.size()) - 1;
  for (const XmlNode& ch : n.children)
    walk(ch, doc, idx, -1);
}

void Topology::buildPci(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci) {
  TopoPci p;
  p.busid = n.attrOr("busid", "");
  if (p.busid.empty()) throw ConfigError("topology " + doc.where(n) + ": <pci> without busid");
  p.pciClass = parseHex(n.attrOr("class", "0"));
  p.vendor = n.attrOr("vendor", "");
  p.linkGTs = parseGTs(n.attrOr("link_speed", "0"));
  p.linkWidth = std::atoi(n.attrOr("link_width", "0").c_str());
  p.bandwidthGBs = pcieBandwidthGBs(p.linkGTs, p.linkWidth);
  p.parent = parentPci;
  p.cpu = cpu;
  pcis_.push_back(p);
  const int idx = static_cast<int>(pcis_.size()) - 1;
  links_.push_back(
      {TopoLink::Kind::kPCIe,
       parentPci >= 0 ? pcis_[static_cast<size_t>(parentPci)].busid : "cpu" + std::to_string(cpu), p.busid,
       p.bandwidthGBs});
  addDeviceOfClass(n, idx);
  for (const XmlNode& ch : n.children)
    walk(ch, doc, cpu, idx);
}

// A PCI function whose class says GPU or NIC but that has no <gpu> / <nic> child (pci-only files).
void Topology::addDeviceOfClass(const XmlNode& n, int pci) {
  const TopoPci& p = pcis_[static_cast<size_t>(pci)];
  const uint32_t cls = p.pciClass >> 8;
  bool hasGpuChild = false, hasNicChild = false;
  for (const XmlNode& ch : n.children) {
    hasGpuChild = hasGpuChild || ch.name == "gpu";
    hasNicChild = hasNicChild || ch.name == "nic";
  }
  // A GPU-class device (0x0300 VGA, 0x0302 3D) is a GPU even in pci-only files without <gpu>.
  if ((cls == 0x0300 || cls == 0x0302) && !hasGpuChild) {
    TopoGpu g;
    g.index = static_cast<int>(gpus_.size());
    g.busid = p.busid;
    g.pci = pci;
    g.cpu = p.cpu;
    gpus_.push_back(g);
  }
  // Network controllers (0x02xx) are NICs even without <nic>/<net> children.
  if ((cls >> 8) == 0x02 && !hasNicChild) {
    TopoNic nic;
    nic.index = static_cast<int>(nics_.size());
    nic.busid = p.busid;
    nic.vendor = p.vendor;
    nic.pciClass = p.pciClass;
    nic.pci = pci;
    nic.cpu = p.cpu;
    nic.fabric = inferFabric(p.pciClass, p.vendor, true);
    nics_.push_back(nic);
  }
}

void Topology::buildGpu(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci) {
  TopoGpu g;
  g.index = static_cast<int>(gpus_.size());
  g.busid = parentPci >= 0 ? pcis_[static_cast<size_t>(parentPci)].busid : "";
  g.dev = std::atoi(n.attrOr("dev", "-1").c_str());
  g.sm = std::atoi(n.attrOr("sm", "0").c_str());
  g.rank = std::atoi(n.attrOr("rank", "-1").c_str());
  g.gdr = n.attrOr("gdr", "0") == "1";
  g.pci = parentPci;
  g.cpu = cpu;
  for (const XmlNode& ch : n.children) {
    if (ch.name == "nvlink") {
      TopoNvLink l;
      l.target = ch.attrOr("target", "");
      l.count = std::atoi(ch.attrOr("count", "0").c_str());
      l.toSwitch = (parseHex(ch.attrOr("tclass", "0")) >> 8) == 0x0680;
      g.nvlinks.push_back(l);
    } else if (ch.name == "c2c") {
      const double bw = std::atof(ch.attrOr("bw", "0").c_str());
      const int count = std::atoi(ch.attrOr("count", "1").c_str());
      g.c2cGBs += bw * count;
      links_.push_back({TopoLink::Kind::kC2C, g.busid, "cpu" + std::to_string(cpu), bw * count});
    } else {
      skipped_.push_back("<" + ch.name + "> at " + doc.where(ch));
    }
  }
  gpus_.push_back(g);
}

void Topology::buildNic(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci) {
  TopoNic nic;
  nic.index = static_cast<int>(nics_.size());
  if (parentPci >= 0) {
    const TopoPci& p = pcis_[static_cast<size_t>(parentPci)];
    nic.busid = p.busid;
    nic.vendor = p.vendor;
    nic.pciClass = p.pciClass;
  }
  nic.pci = parentPci;
  nic.cpu = cpu;
  nic.fabric = inferFabric(nic.pciClass, nic.vendor, parentPci >= 0);
  for (const XmlNode& ch : n.children) {
    if (ch.name != "net") {
      skipped_.push_back("<" + ch.name + "> at " + doc.where(ch));
      continue;
    }
    TopoNet net;
    net.name = ch.attrOr("name", "");
    net.dev = std::atoi(ch.attrOr("dev", "-1").c_str());
    net.port = std::atoi(ch.attrOr("port", "0").c_str());
    net.speedGbps = std::atof(ch.attrOr("speed", "0").c_str()) / 1000.0;  // the file gives Mb/s
    net.guid = ch.attrOr("guid", "");
    net.gdr = ch.attrOr("gdr", "0") == "1";
    nic.nets.push_back(net);
  }
  // The fabric comes from the PCI class and vendor alone (inferFabric): a class-0x0200 NIC with no
  // vendor stays unknown whatever its ports are named; a profile's fabric= says what it is.
  nics_.push_back(nic);
}

std::vector<int> Topology::ancestors(int pci) const {
  std::vector<int> out;
  for (int p = pci; p >= 0; p = pcis_[static_cast<size_t>(p)].parent) out.push_back(p);
  return out;
}

PathType Topology::path(const TopoGpu& g, const TopoNic& n) const {
  if (g.cpu != n.cpu) return PathType::kSYS;
  if (g.pci < 0 || n.pci < 0) return PathType::kPHB;
  std::vector<int> a = ancestors(g.pci), b = ancestors(n.pci);
  // Switches strictly above each device; the device's own PCI node is not a switch hop.
  a.erase(a.begin());
  b.erase(b.begin());
  int common = -1;
  size_t hopsA = 0;
  for (size_t i = 0; i < a.size() && common < 0; ++i)
    for (size_t j = 0; j < b.size(); ++j)
      if (a[i] == b[j]) {
        common = a[i];
        hopsA = i + j;
        break;
      }
  if (common < 0) return PathType::kPHB;
  return hopsA == 0 ? PathType::kPIX : PathType::kPXB;
}

std::vector<int> Topology::rail(int gpu) const {
  std::vector<int> best;
  PathType bestType = PathType::kSYS;
  const TopoGpu& g = gpus_.at(static_cast<size_t>(gpu));
  for (const auto& n : nics_) {
    PathType p = path(g, n);
    if (best.empty() || p < bestType) {
      best = {n.index};
      bestType = p;
    } else if (p == bestType) {
      best.push_back(n.index);
    }
  }
  return best;
}

PathType Topology::railPath(int gpu) const {
  std::vector<int> r = rail(gpu);
  if (r.empty()) return PathType::kSYS;
  return path(gpus_.at(static_cast<size_t>(gpu)), nics_.at(static_cast<size_t>(r[0])));
}

void Topology::setFabric(Fabric f) {
  for (auto& n : nics_) n.fabric = f;
}

Fabric Topology::primaryFabric() const {
  std::map<Fabric, int> count;
  for (const auto& n : nics_) ++count[n.fabric];
  Fabric best = Fabric::kSocket;
  int most = 0;
  for (const auto& kv : count)
    if (kv.second > most) best = kv.first, most = kv.second;
  return best;
}

double Topology::nvlinkGBsPerGpu() const {
  double bw = 0;
  for (const auto& g : gpus_) bw = std::max(bw, g.nvlinkGBs);
  return bw;
}

namespace {
std::string cpuRange(const std::vector<int>& cores) {
  if (cores.empty()) return "-";
  std::ostringstream os;
  size_t i = 0;
  while (i < cores.size()) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (i) os << ",";
    os << cores[i];
    if (j > i) os << "-" << cores[j];
    i = j + 1;
  }
  return os.str();
}
}  // namespace

namespace {
// (domain, bus, device, function) of "dddd:bb:dd.f"; false when it is not one.
bool parseBusId(const std::string& s, uint64_t (&out)[4]) {
  unsigned long long d = 0, b = 0, dev = 0, f = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%llx:%llx:%llx.%llx%c", &d, &b, &dev, &f, &tail) != 4) return false;
  out[0] = d, out[1] = b, out[2] = dev, out[3] = f;
  return true;
}
}  // namespace

const TopoGpu* Topology::gpuByBusId(const std::string& busid) const {
  uint64_t want[4];
  if (!parseBusId(busid, want)) return nullptr;
  for (const auto& g : gpus_) {
    uint64_t have[4];
    if (parseBusId(g.busid, have) && std::equal(want, want + 4, have)) return &g;
  }
  return nullptr;
}

std::vector<int> Topology::railNics() const {
  std::vector<int> out;
  for (const auto& g : gpus_)
    for (int n : rail(g.index))
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Topology::summary() const {
  std::ostringstream os;
  os << "topology " << source_ << ": " << cpus_.size() << " CPU(s), " << gpus_.size() << " GPU(s), " << nics_.size()
     << " NIC(s), primary fabric " << fabricName(primaryFabric()) << "\n";
  for (const auto& g : gpus_) {
    const int numa = g.cpu >= 0 ? cpus_[static_cast<size_t>(g.cpu)].numa : -1;
    os << "  gpu" << g.index << " " << g.busid << " sm" << g.sm << " numa " << numa;
    if (g.nvlinkGBs > 0) os << " nvlink " << g.nvlinkGBs << " GB/s";
    if (g.pci >= 0) os << " pcie " << pcis_[static_cast<size_t>(g.pci)].bandwidthGBs << " GB/s";
    os << " cpus " << (g.cpu >= 0 ? cpuRange(cpus_[static_cast<size_t>(g.cpu)].cores) : "-") << "\n";
  }
  for (const auto& n : nics_) {
    os << "  nic" << n.index << " " << (n.busid.empty() ? "(no pci)" : n.busid) << " " << fabricName(n.fabric) << " "
       << n.speedGbps() << " Gb/s";
    for (const auto& p : n.nets) os << " " << p.name << ":" << p.port;
    os << "\n";
  }
  int unknown = 0;
  for (const auto& n : nics_) unknown += n.fabric == Fabric::kUnknown ? 1 : 0;
  if (unknown > 0)
    os << "  hint: " << unknown << " NIC(s) of unknown fabric (a PCI network class without vendor or port details;"
       << " AWS p4d/p5 files look like this): set topo.profile (efa for AWS EFA with the aws-ofi-nccl plugin,"
       << " roce-v2, ib-ndr, socket) so NCCL and the cost model use the right one\n";
  os << "  rails:";
  for (const auto& g : gpus_) {
    os << " gpu" << g.index << "->";
    std::vector<int> r = rail(g.index);
    if (r.empty()) os << "none";
    for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << "nic" << r[i];
    if (!r.empty()) os << "(" << pathTypeName(railPath(g.index)) << ")";
  }
  os << "\n";
  return os.str();
}

std::string Topology::json() const {
  nlohmann::json j;
  j["source"] = source_;
  j["primary_fabric"] = fabricName(primaryFabric());
  j["cpus"] = nlohmann::json::array();
  for (const auto& c : cpus_)
    j["cpus"].push_back({{"numa", c.numa}, {"affinity", c.affinityMask}, {"cores", c.cores.size()}});
  j["gpus"] = nlohmann::json::array();
  for (const auto& g : gpus_) {
    std::vector<int> r = rail(g.index);
    j["gpus"].push_back({{"index", g.index},
                         {"busid", g.busid},
                         {"sm", g.sm},
                         {"numa", g.cpu >= 0 ? cpus_[static_cast<size_t>(g.cpu)].numa : -1},
                         {"cpus", g.cpu >= 0 ? cpuRange(cpus_[static_cast<size_t>(g.cpu)].cores) : "-"},
                         {"nvlink_gbs", g.nvlinkGBs},
                         {"rail", r},
                         {"rail_path", r.empty() ? "none" : pathTypeName(railPath(g.index))}});
  }
  j["nics"] = nlohmann::json::array();
  for (const auto& n : nics_) {
    nlohmann::json ports = nlohmann::json::array();
    for (const auto& p : n.nets) ports.push_back({{"name", p.name}, {"port", p.port}, {"gbps", p.speedGbps}});
    j["nics"].push_back({{"index", n.index},
                         {"busid", n.busid},
                         {"fabric", fabricName(n.fabric)},
                         {"gbps", n.speedGbps()},
                         {"ports", ports}});
  }
  j["skipped"] = skipped_;
  // Names come from the file as bytes: invalid UTF-8 is replaced (U+FFFD), not thrown as a
  // json type_error that no caller expects (found by tests/fuzz/fuzz_topo).
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mt
