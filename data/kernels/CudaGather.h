#pragma once
// Gathers of the device feed (data/kernels/Gather.cu), on the current stream.

#include <cstdint>

namespace mt::cuda {

// dst[b] = src[idx[b]] for rows of rowBytes bytes.
void gatherRows(void* dst, const void* src, const int64_t* idx, int64_t B, int64_t rowBytes);
// inputs[b, t] = tokens[idx[b] * T + t], targets[b, t] = tokens[idx[b] * T + t + 1].
void gatherTokenWindows(int32_t* inputs, int64_t* targets, const int32_t* tokens, const int64_t* idx, int64_t B,
                        int64_t T);

}  // namespace mt::cuda
