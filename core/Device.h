#pragma once
#include <string>

namespace mt {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index) { return {DeviceType::kCUDA, index}; }
  bool isCpu() const { return type == DeviceType::kCPU; }
  bool isCuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && (isCpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return isCpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace mt
