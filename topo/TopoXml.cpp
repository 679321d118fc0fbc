#include "topo/TopoXml.h"

#include <pugixml.hpp>

#include <utility>
#include <vector>

#include "core/Error.h"
#include "core/Files.h"

namespace mt {

const std::string* XmlNode::attr(const std::string& key) const {
  for (const auto& kv : attrs)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

std::string XmlNode::attrOr(const std::string& key, const std::string& fallback) const {
  const std::string* v = attr(key);
  return v ? *v : fallback;
}

namespace {

struct LineIndex {
  std::vector<size_t> starts;  // offset of each line's first character
  explicit LineIndex(const std::string& text) {
    starts.push_back(0);
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') starts.push_back(i + 1);
  }
  std::pair<int, int> at(size_t offset) const {
    size_t line = 0;
    size_t lo = 0, hi = starts.size();
    while (lo + 1 < hi) {
      size_t mid = (lo + hi) / 2;
      if (starts[mid] <= offset) lo = mid;
      else hi = mid;
    }
    line = lo;
    return {static_cast<int>(line + 1), static_cast<int>(offset - starts[line] + 1)};
  }
};

XmlNode convert(const pugi::xml_node& n, const LineIndex& idx) {
  XmlNode out;
  out.name = n.name();
  auto lc = idx.at(static_cast<size_t>(n.offset_debug()));
  out.line = lc.first;
  out.column = lc.second;
  for (const auto& a : n.attributes()) out.attrs.emplace_back(a.name(), a.value());
  for (const auto& c : n.children())
    if (c.type() == pugi::node_element) out.children.push_back(convert(c, idx));
  return out;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError("topology " + where + ": " + what);
}

// NCCL's files nest about 8 levels (system, cpu, pci switches, gpu, nvlink); the tree is built and
// destroyed recursively, so a hostile or broken file must be stopped before that.
constexpr int kMaxDepth = 64;

// The first element nested deeper than kMaxDepth, walked without recursion; null if none.
pugi::xml_node tooDeep(const pugi::xml_node& root) {
  std::vector<std::pair<pugi::xml_node, int>> stack{{root, 1}};
  while (!stack.empty()) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    if (depth > kMaxDepth) return n;
    for (pugi::xml_node c = n.first_child(); c; c = c.next_sibling())
      if (c.type() == pugi::node_element) stack.emplace_back(c, depth + 1);
  }
  return pugi::xml_node();
}

}  // namespace

XmlDocument parseTopologyXmlString(const std::string& text, const std::string& name) {
  LineIndex idx(text);
  // NCCL's hand-written parser stops at tabs; find them first so the message names the spot.
  for (size_t line = 0; line < idx.starts.size(); ++line) {
    for (size_t i = idx.starts[line]; i < text.size() && (text[i] == ' ' || text[i] == '\t'); ++i) {
      if (text[i] == '\t') {
        auto lc = idx.at(i);
        fail(name + ":" + std::to_string(lc.first) + ":" + std::to_string(lc.second),
             "tab character in indentation (NCCL's topology parser rejects tabs; indent with spaces)");
      }
    }
  }
  pugi::xml_document doc;
  pugi::xml_parse_result r = doc.load_buffer(text.data(), text.size(), pugi::parse_default | pugi::parse_comments);
  if (!r) {
    auto lc = idx.at(static_cast<size_t>(r.offset));
    fail(name + ":" + std::to_string(lc.first) + ":" + std::to_string(lc.second), std::string("XML error: ") + r.description());
  }
  pugi::xml_node system = doc.child("system");
  if (!system) {
    pugi::xml_node first = doc.first_child();
    while (first && first.type() != pugi::node_element) first = first.next_sibling();
    auto lc = idx.at(first ? static_cast<size_t>(first.offset_debug()) : 0);
    fail(name + ":" + std::to_string(lc.first) + ":" + std::to_string(lc.second),
         std::string("the root element must be <system>, found <") + (first ? first.name() : "") + ">");
  }
  if (pugi::xml_node deep = tooDeep(system)) {
    auto lc = idx.at(static_cast<size_t>(deep.offset_debug()));
    fail(name + ":" + std::to_string(lc.first) + ":" + std::to_string(lc.second),
         "elements nested deeper than " + std::to_string(kMaxDepth) + " levels (not an NCCL topology file)");
  }
  XmlDocument d;
  d.path = name;
  d.root = convert(system, idx);
  const std::string* version = d.root.attr("version");
  if (!version) fail(d.where(d.root), "<system> has no version attribute (NCCL writes version=\"1\")");
  if (*version != "1") fail(d.where(d.root), "unsupported topology version \"" + *version + "\" (expected \"1\")");
  return d;
}

XmlDocument parseTopologyXml(const std::string& path) {
  std::string text;
  if (!readWholeFile(path, &text)) throw ConfigError("topology file " + path + ": cannot be read");
  return parseTopologyXmlString(text, path);
}

}  // namespace mt
