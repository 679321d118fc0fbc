#pragma once
// NCCL's topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE) read into a generic tree with the
// line:column of every element, using pugixml. Checks done here, each a ConfigError naming
// file:line:column: well-formed XML, a <system> root with version="1", and no tab characters in
// indentation (NCCL's own parser rejects them, so such a file would fail later inside NCCL).
// Comments and blank lines are fine (real dumps start with one).

#include <map>
#include <string>
#include <vector>

namespace mt {

struct XmlNode {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;  // in file order
  std::vector<XmlNode> children;
  int line = 0, column = 0;
  const std::string* attr(const std::string& key) const;
  std::string attrOr(const std::string& key, const std::string& fallback) const;
};

struct XmlDocument {
  std::string path;
  XmlNode root;  // <system>
  std::string where(const XmlNode& n) const { return path + ":" + std::to_string(n.line) + ":" + std::to_string(n.column); }
};

XmlDocument parseTopologyXml(const std::string& path);
XmlDocument parseTopologyXmlString(const std::string& text, const std::string& name);

}  // namespace mt
