#pragma once
// Byte copies and fills for Tensor on CUDA devices, on the current stream. Copies that touch host
// memory are synchronous (the host buffer may be reused when they return); device-to-device copies
// and fills are stream-ordered and return at once.

#include <cstddef>

#include "core/Device.h"

namespace mt {

void cudaCopyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes);
void cudaZeroBytes(void* dst, Device device, size_t bytes);
// Number of CUDA devices; 0 when there is no driver or no GPU (never throws).
int cudaDeviceCountOrZero();

}  // namespace mt
