// A scan of stored weights for NaN / Inf, run on every matrix at load (src/model/decoder.cpp).
// Plain types (F32 / F16 / BF16) are checked element by element on the bit pattern (exponent all
// ones); quantized blocks by their scales (every ggml / Q4_Z layout scales integers by f16 d, and
// K-quants also by dmin): a block's elements are finite exactly when its scales are, since the
// integer parts and the 6-bit sub-scales cannot overflow an f32 product of a finite f16.
#pragma once

#include <cstdint>

#include "kvboost/kernels.h"

namespace kvboost::weight_check {

// The index of the first non-finite element of the n elements at `data` (stored as `wt`; n a
// multiple of the block size), or -1 when all are finite. For a quantized type the index is the
// first element of the first block with a non-finite scale.
int64_t find_nonfinite(const void* data, kernels::WType wt, int64_t n);
// Scalar reference: dequantizes (kernels::to_f32) and tests every element with std::isfinite;
// for a quantized type it returns the first element of the block holding the first non-finite
// value, as find_nonfinite does.
int64_t find_nonfinite_ref(const void* data, kernels::WType wt, int64_t n);

}  // namespace kvboost::weight_check
