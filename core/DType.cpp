#include "core/DType.h"

namespace mt {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kF64: return 8;
  }
  return 0;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kF64: return "f64";
  }
  return "?";
}

bool parseDType(const std::string& name, DType* out) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8, DType::kF64}) {
    if (name == dtypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

}  // namespace mt
