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

const EnumTable<DType>& dtypes() {
  static const EnumTable<DType> kTable = {
      {DType::kF32, "f32"}, {DType::kBF16, "bf16"}, {DType::kF16, "f16"}, {DType::kI32, "i32"},
      {DType::kI64, "i64"}, {DType::kU8, "u8"},     {DType::kF64, "f64"},
  };
  return kTable;
}

const char* dtypeName(DType t) { return enumName(dtypes(), t); }

bool parseDType(const std::string& name, DType* out) { return parseEnum(dtypes(), name, out); }

}  // namespace mt
