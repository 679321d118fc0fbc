#pragma once
// The typed machine model built from a topology XML tree (NCCL's graph, simplified to what
// placement and the cost model need): CPUs (NUMA nodes with their affinity masks), PCI switches,
// GPUs, NICs with their network ports, and links with bandwidths — PCIe gen x width, NVLink count
// x per-link rate, C2C. Each NIC's fabric (InfiniBand, RoCE, EFA, socket) is inferred from its PCI
// class and vendor and can be overridden. A GPU's rail is the set of NICs nearest to it: below the
// same PCI switch, else on the same CPU, else any.

#include <string>
#include <vector>

#include "core/EnumTable.h"
#include "topo/TopoXml.h"

namespace mt {

enum class Fabric { kInfiniBand, kRoCE, kEFA, kSocket, kUnknown };
const EnumTable<Fabric>& fabrics();
const char* fabricName(Fabric f);
bool parseFabric(const std::string& s, Fabric* out);

// How far apart two devices are, NCCL's path types from near to far.
enum class PathType { kPIX, kPXB, kPHB, kSYS };
const char* pathTypeName(PathType p);

struct TopoCpu {
  int numa = -1;
  std::string affinityMask;  // as in the file: comma-separated 32-bit hex words, most significant first
  std::vector<int> cores;    // cores in the mask
  std::string arch, vendor;
};

struct TopoPci {
  std::string busid;
  uint32_t pciClass = 0;
  std::string vendor;
  double linkGTs = 0;  // transfer rate per lane
  int linkWidth = 0;
  double bandwidthGBs = 0;  // per direction
  int parent = -1;          // index into pcis, -1: attached to a CPU
  int cpu = -1;
  bool isSwitch() const { return (pciClass >> 8) == 0x0604; }
};

struct TopoNvLink {
  std::string target;  // busid of the peer GPU or NVSwitch
  int count = 0;
  bool toSwitch = false;
};

struct TopoGpu {
  int index = 0;  // 0..n-1 in file order
  std::string busid;
  int dev = -1, sm = 0, rank = -1;
  bool gdr = false;
  int pci = -1, cpu = -1;
  std::vector<TopoNvLink> nvlinks;
  double nvlinkGBs = 0;  // total NVLink bandwidth per direction
  double c2cGBs = 0;
};

struct TopoNet {
  std::string name;
  int dev = -1, port = 0;
  double speedGbps = 0;
  std::string guid;
  bool gdr = false;
};

struct TopoNic {
  int index = 0;
  std::string busid;  // empty for a NIC without a PCI parent (a socket interface)
  std::string vendor;
  uint32_t pciClass = 0;
  Fabric fabric = Fabric::kUnknown;
  std::vector<TopoNet> nets;
  int pci = -1, cpu = -1;
  double speedGbps() const;  // sum over ports
};

struct TopoLink {
  enum class Kind { kPCIe, kNVLink, kC2C } kind;
  std::string from, to;
  double bandwidthGBs;
};

class Topology {
 public:
  static Topology load(const std::string& path);
  static Topology fromDocument(const XmlDocument& doc);

  const std::string& source() const { return source_; }
  const std::vector<TopoCpu>& cpus() const { return cpus_; }
  const std::vector<TopoPci>& pcis() const { return pcis_; }
  const std::vector<TopoGpu>& gpus() const { return gpus_; }
  const std::vector<TopoNic>& nics() const { return nics_; }
  const std::vector<TopoLink>& links() const { return links_; }
  const std::vector<std::string>& skipped() const { return skipped_; }  // unknown elements, where

  PathType path(const TopoGpu& g, const TopoNic& n) const;
  // The GPU at PCI bus id `busid` ("0000:1b:00.0", any case, a 4- or 8-digit domain as CUDA and
  // nvidia-smi write it); null when the file has none there (it describes another machine).
  const TopoGpu* gpuByBusId(const std::string& busid) const;
  // NICs nearest to GPU i (its rail), ascending NIC index.
  std::vector<int> rail(int gpu) const;
  PathType railPath(int gpu) const;
  // The NICs that are some GPU's rail, ascending (a NIC no GPU is nearest to, such as a management
  // port on the CPU root, carries no collective traffic); empty without GPUs.
  std::vector<int> railNics() const;
  // Overrides every NIC's fabric (a profile that knows better, e.g. IB presented as Ethernet).
  void setFabric(Fabric f);
  // The fabric the inter-node traffic will use: the most common among NICs (socket if none).
  Fabric primaryFabric() const;
  double nvlinkGBsPerGpu() const;

  std::string summary() const;
  std::string json() const;

 private:
  void walk(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci);
  // The builders walk() dispatches to, one per element; cpu and parentPci locate the element.
  void buildCpu(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci);
  void buildPci(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci);
  void buildGpu(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci);
  void buildNic(const XmlNode& n, const XmlDocument& doc, int cpu, int parentPci);
  void addDeviceOfClass(const XmlNode& n, int pci);
  std::vector<int> ancestors(int pci) const;

  std::string source_;
  std::vector<TopoCpu> cpus_;
  std::vector<TopoPci> pcis_;
  std::vector<TopoGpu> gpus_;
  std::vector<TopoNic> nics_;
  std::vector<TopoLink> links_;
  std::vector<std::string> skipped_;
};

// PCIe bandwidth per direction in GB/s for a "32.0 GT/s PCIe" link of `width` lanes.
double pcieBandwidthGBs(double gts, int width);
// NVLink bandwidth per link per direction (NCCL's figures) for a GPU of compute capability sm.
double nvlinkPerLinkGBs(int sm);
// The cores of an affinity mask ("0000ffff,ffffffff": 32-bit words, most significant first).
std::vector<int> coresOfMask(const std::string& mask);

}  // namespace mt
