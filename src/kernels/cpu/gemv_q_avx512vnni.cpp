// Decode GEMV over Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K blocks with 512-bit vpdpbusd (gemv_q_avx512_impl.h), native
// build: -mavx512f/bw/vl/vnni for this file only; dispatch.cpp calls it below kQGemmMinM tokens where the
// quantized path is avx512vnni or above (the Avx512 level and AVX512-VNNI).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

#define KVB_GV_NS gemv512
#include "cpu/gemv_q_avx512_impl.h"

namespace kvboost::kernels::cpu {

void gemv_q_avx512vnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                       int64_t K) {
  check_quant_args(wt, K, "matmul");
  if (wt != WType::Q8_0 && wt != WType::Q4_0 && wt != WType::Q5_0 && wt != WType::Q4_K && wt != WType::Q6_K)
    fail("gemv_q_avx512vnni: ", wtype_name(wt), " is not Q8_0, Q4_0, Q5_0, Q4_K or Q6_K");
  if (M <= 0 || N <= 0) return;
  if (wt == WType::Q4_K || wt == WType::Q6_K)
    return gemv512::gemv_k(x, static_cast<const uint8_t*>(w), wt == WType::Q4_K ? gemv512::kGvQ4K : gemv512::kGvQ6K,
                           bias, y, M, N, K);
  const int kind = wt == WType::Q4_0 ? gemv512::kGvQ4 : wt == WType::Q5_0 ? gemv512::kGvQ5 : gemv512::kGvQ8;
  gemv512::gemv(x, static_cast<const uint8_t*>(w), kind, bias, y, M, N, K);
}

}  // namespace kvboost::kernels::cpu
