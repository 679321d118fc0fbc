#pragma once
// One table per enum that has names (config values, logs, checkpoint records): each entry's
// value, its name and what it means. Both directions of the conversion, the list of names a
// config key accepts and its help text come from the one table (launch/Config's choice keys).

#include <string>
#include <vector>

namespace mt {

template <typename E>
struct EnumName {
  E value;
  const char* name;
  const char* meaning = "";  // for help texts; "" when the name says it
  bool selectable = true;    // false: printed but never parsed (e.g. a fabric that is unknown)
};

template <typename E>
using EnumTable = std::vector<EnumName<E>>;

template <typename E>
const char* enumName(const EnumTable<E>& table, E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

template <typename E>
bool parseEnum(const EnumTable<E>& table, const std::string& name, E* out) {
  for (const auto& e : table)
    if (e.selectable && name == e.name) {
      *out = e.value;
      return true;
    }
  return false;
}

// The selectable names, in table order.
template <typename E>
std::vector<std::string> enumChoices(const EnumTable<E>& table) {
  std::vector<std::string> out;
  for (const auto& e : table)
    if (e.selectable) out.push_back(e.name);
  return out;
}

}  // namespace mt
