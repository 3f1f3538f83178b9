// Scalar reference matmul and type conversion: the ground truth for every fast version.
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::kernels {

namespace {
inline float load_w(const void* w, WType wt, int64_t i) {
  switch (wt) {
    case WType::F32: {
      float f;
      std::memcpy(&f, static_cast<const char*>(w) + i * 4, 4);
      return f;
    }
    case WType::F16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case WType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    default: break;  // quantized types are dequantized a row at a time (below)
  }
  return 0.0f;
}
}  // namespace

void to_f32(const void* src, WType wt, float* dst, int64_t n) {
  if (wtype_is_quantized(wt)) return cpu::dequantize_wrow(src, wt, dst, n);
  if (wt == WType::F32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_w(src, wt, i);
}

void matmul_ref(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                int64_t N, int64_t K) {
  if (wtype_is_quantized(wt)) {
    // Each weight row dequantized exactly (scalar reference), then a double-accumulated dot
    // with the f32 activations: what the integer kernels approximate.
    cpu::check_quant_args(wt, K, "matmul_ref");
    const size_t rb = size_t(wtype_row_bytes(wt, K));
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 20))
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> row(static_cast<size_t>(K));
      cpu::dequantize_wrow_ref(static_cast<const uint8_t*>(w) + size_t(n) * rb, wt, row.data(), K);
      for (int64_t m = 0; m < M; ++m) {
        double acc = bias ? bias[n] : 0.0;
        for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * double(row[size_t(k)]);
        y[m * N + n] = float(acc);
      }
    }
    return;
  }
  // Accumulates in double so the reference is more accurate than any fast version.
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 20))
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * load_w(w, wt, n * K + k);
      y[m * N + n] = float(acc);
    }
  }
}

}  // namespace kvboost::kernels
