// f32 -> quantized blocks (kernels.h quantize_row): llama.cpp's reference quantizers
// (ggml-quants.c quantize_row_q8_0_ref, quantize_row_q4_0_ref, quantize_row_q6_K_ref with
// make_qx_quants), so that a matrix quantized here holds what llama-quantize would write for it
// without an importance matrix; and Q4_Z (AWQ's per-group min/max asymmetric rounding, as
// src/model/awq.cpp's quantize). Scalar: it runs once at load (the output projection), not per
// token. Compiled without FMA contraction so that the results do not depend on the compiler.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels {

namespace {

void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// ggml's nearest_int: round to nearest, ties to even (the 1.5 * 2^23 trick); |v| < 2^22.
int nearest_int(float v) { return int(std::nearbyint(v)); }

constexpr float kGroupMaxEps = 1e-15f;  // ggml GROUP_MAX_EPS

void q8_0_block(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(std::roundf(x[j] * id)));
}

void q4_0_block(const float* x, uint8_t* b) {
  float amax = 0.0f, mx = 0.0f;  // the value of largest magnitude, with its sign
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), mx = x[j];
  const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[16 + j] * id + 8.5f)));
    b[2 + j] = uint8_t(lo | (hi << 4));
  }
}

// AWQ-style asymmetric 4-bit (what the fixture tool's AWQ writer does per group of 32):
// s = max(max - min, 1e-5) / 15 rounded to f16, z = clamp(-round(min / s), 0, 15),
// q = clamp(round(x / s) + z, 0, 15).
void q4_z_block(const float* x, uint8_t* b) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < 32; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
  const uint16_t sh = f32_to_f16(std::max(mx - mn, 1e-5f) / 15.0f);
  const float s = f16_to_f32(sh);
  const int z = int(std::clamp(-std::nearbyint(mn / s), 0.0f, 15.0f));
  std::memcpy(b, &sh, 2);
  b[2] = uint8_t(z), b[3] = 0;
  auto q = [&](float v) { return int(std::clamp(std::nearbyint(v / s) + float(z), 0.0f, 15.0f)); };
  for (int j = 0; j < 16; ++j) b[4 + j] = uint8_t(q(x[j]) | (q(x[16 + j]) << 4));
}

// ggml make_qx_quants with rmse_type 1 (weights x^2) and no importance matrix: the scale of n
// values on the levels -nmax .. nmax - 1 that minimises the weighted squared error over 19
// candidate inverse scales around -nmax / max; L gets the levels + nmax.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float mx = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  float iscale = -float(nmax) / mx;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / mx;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q6_K (kernels.h): 16 sub-blocks of 16 with an int8 scale each, one f16 super-scale.
void q6_k_block(const float* x, uint8_t* b) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int ib = 0; ib < 16; ++ib) {
    const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    if (std::fabs(scale) > max_abs_scale) max_abs_scale = std::fabs(scale), max_scale = scale;
  }
  std::memset(b, 0, 210);
  if (max_abs_scale < kGroupMaxEps) return;  // all zero: d = 0
  const float iscale = -128.0f / max_scale;
  put_f16(b + 208, 1.0f / iscale);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
  const float d = f16_to_f32(uint16_t(b[208] | (uint16_t(b[209]) << 8)));
  for (int j = 0; j < 16; ++j) {
    const float dj = d * float(sc[j]);
    if (dj == 0.0f) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(std::clamp(nearest_int(x[16 * j + i] / dj), -32, 31) + 32);
  }
  // Element 128h + 32k + l: low 4 bits in ql[64h + 32(k % 2) + l] (high nibble when k >= 2),
  // top 2 bits at 2k in qh[32h + l] (dequant.cpp's layout).
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* q = reinterpret_cast<const uint8_t*>(L) + 128 * h + l;
      ql[l] = uint8_t((q[0] & 0xF) | ((q[64] & 0xF) << 4));
      ql[l + 32] = uint8_t((q[32] & 0xF) | ((q[96] & 0xF) << 4));
      qh[l] = uint8_t((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
    }
}

}  // namespace

bool quantize_row_supported(WType wt) {
  return wt == WType::Q8_0 || wt == WType::Q4_0 || wt == WType::Q6_K || wt == WType::Q4_Z;
}

void quantize_row(const float* src, WType wt, void* dst, int64_t n) {
  if (!quantize_row_supported(wt))
    fail("quantize_row: ", wtype_name(wt), " is not a type this build quantizes to (Q8_0, Q4_0, Q6_K, Q4_Z)");
  cpu::check_quant_args(wt, n, "quantize_row");
  const int64_t be = wtype_block_elems(wt), bb = wtype_block_bytes(wt);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / be; ++i, src += be, out += bb) {
    switch (wt) {
      case WType::Q8_0: q8_0_block(src, out); break;
      case WType::Q4_0: q4_0_block(src, out); break;
      case WType::Q6_K: q6_k_block(src, out); break;
      default: q4_z_block(src, out); break;
    }
  }
}

}  // namespace kvboost::kernels
