#pragma once
// Element types. bf16 and f16 are stored as raw 16-bit patterns (BFloat16, Float16) that are
// bit-compatible with CUDA's __nv_bfloat16/__half, so host and device buffers are interchangeable.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/EnumTable.h"

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt {

// f64 exists for metrics and reductions of statistics; tensors of the model use the others.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kF64 };

size_t dtypeSize(DType t);
const EnumTable<DType>& dtypes();  // "f32", "bf16", "f16", "i32", "i64", "u8", "f64"
const char* dtypeName(DType t);
bool parseDType(const std::string& name, DType* out);
inline bool isFloating(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  MT_HOST_DEVICE explicit BFloat16(float f) : bits(fromFloat(f)) {}
  MT_HOST_DEVICE operator float() const { return toFloat(bits); }
  // Round to nearest even; NaN stays a quiet NaN.
  MT_HOST_DEVICE static uint16_t fromFloat(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  MT_HOST_DEVICE static float toFloat(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  MT_HOST_DEVICE explicit Float16(float f) : bits(fromFloat(f)) {}
  MT_HOST_DEVICE operator float() const { return toFloat(bits); }
  // IEEE binary16 with round to nearest even, subnormals, overflow to inf.
  MT_HOST_DEVICE static uint16_t fromFloat(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (absx < 0x38800000u) {                                             // subnormal or zero
      if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
      uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
      int shift = 126 - static_cast<int>(absx >> 23);  // 14..24
      uint32_t half = mant >> shift;
      uint32_t rem = mant & ((1u << shift) - 1);
      uint32_t mid = 1u << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1u))) ++half;
      return static_cast<uint16_t>(sign | half);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  MT_HOST_DEVICE static float toFloat(uint16_t h) {
    uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
      if (mant == 0) {
        u = sign;
      } else {  // subnormal: normalise
        int e = -1;
        do {
          ++e;
          mant <<= 1;
        } while ((mant & 0x400u) == 0);
        u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
      }
    } else if (exp == 31) {
      u = sign | 0x7f800000u | (mant << 13);
    } else {
      u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };

}  // namespace mt
