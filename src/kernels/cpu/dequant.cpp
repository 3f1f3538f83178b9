// Scalar reference dequantization of ggml blocks (the layouts are described in kernels.h).
// The arithmetic mirrors the gguf Python package (gguf/quants.py) operation for operation in
// f32 — d * scale first, then d1 * q - m1 — so both give bit-identical results; this file and
// dequant_avx2.cpp are compiled with -ffp-contract=off so that no FMA changes the rounding.
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels {

namespace {

inline uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
inline float h2f(const uint8_t* p) { return f16_to_f32(rd16(p)); }

void deq_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const float d = h2f(b);
    for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
  }
}

void deq_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = h2f(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(int(b[2 + j] & 0x0F) - 8);
      y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
    }
  }
}

// ggml-common.h block_q5_0 / ggml-quants.c dequantize_row_q5_0; gguf quants.py Q5_0 computes
// d * float(q - 16) the same way.
void deq_q5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const float d = h2f(b);
    const uint32_t qh = uint32_t(b[2]) | uint32_t(b[3]) << 8 | uint32_t(b[4]) << 16 | uint32_t(b[5]) << 24;
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[6 + j] & 0x0F) | int((qh >> j) & 1) << 4;
      const int hi = (b[6 + j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      y[j] = d * float(lo - 16);
      y[j + 16] = d * float(hi - 16);
    }
  }
}

void deq_q4_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144, y += 256) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t* sc = b + 4;
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      cpu::k_scale_min(sc, j, s, m);
      const float d1 = d * float(s), m1 = dmin * float(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) y[32 * j + l] = d1 * float((q[l] >> shift) & 0x0F) - m1;
    }
  }
}

void deq_q5_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176, y += 256) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t* sc = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      cpu::k_scale_min(sc, j, s, m);
      const float d1 = d * float(s), m1 = dmin * float(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
        y[32 * j + l] = d1 * float(v) - m1;
      }
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210, y += 256) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = h2f(b + 208);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {  // quarter k of half h: elements h*128 + k*32 + l
        const uint8_t* lo = ql + 64 * h + 32 * (k % 2);
        const int lshift = 4 * (k / 2);
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l;
          const int q = (((lo[l] >> lshift) & 0x0F) | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
          y[e] = (d * float(sc[e / 16])) * float(q);
        }
      }
    }
  }
}

}  // namespace

bool ggml_type_supported(uint32_t id) {
  switch (GgmlType(id)) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0:
    case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
  }
  return false;
}

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::BF16: return "BF16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q5_0: return "Q5_0";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q5_K: return "Q5_K";
    case GgmlType::Q6_K: return "Q6_K";
  }
  return "?";
}

int64_t ggml_block_elems(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return 1;
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return 32;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return 256;
  }
  fail("ggml type ", uint32_t(t), " is not supported");
}

int64_t ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return 18;
    case GgmlType::Q5_0: return 22;
    case GgmlType::Q8_0: return 34;
    case GgmlType::Q4_K: return 144;
    case GgmlType::Q5_K: return 176;
    case GgmlType::Q6_K: return 210;
  }
  fail("ggml type ", uint32_t(t), " is not supported");
}

void cpu::check_dequant_args(GgmlType t, int64_t n) {
  if (!ggml_type_supported(uint32_t(t))) fail("dequantize_row: ggml type ", uint32_t(t), " is not supported");
  if (n < 0 || n % ggml_block_elems(t) != 0)
    fail("dequantize_row: ", n, " elements is not a multiple of the ", ggml_type_name(t), " block size ",
         ggml_block_elems(t));
}

void dequantize_row_ref(const void* src, GgmlType t, float* dst, int64_t n) {
  cpu::check_dequant_args(t, n);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = h2f(s + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(rd16(s + 2 * i));
      return;
    case GgmlType::Q8_0: return deq_q8_0(s, dst, n / 32);
    case GgmlType::Q4_0: return deq_q4_0(s, dst, n / 32);
    case GgmlType::Q5_0: return deq_q5_0(s, dst, n / 32);
    case GgmlType::Q4_K: return deq_q4_k(s, dst, n / 256);
    case GgmlType::Q5_K: return deq_q5_k(s, dst, n / 256);
    case GgmlType::Q6_K: return deq_q6_k(s, dst, n / 256);
  }
}

}  // namespace kvboost::kernels
