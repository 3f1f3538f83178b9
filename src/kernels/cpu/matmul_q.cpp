// Quantized weights (kernels.h WType Q8_0 .. Q5_0): block sizes, the scalar reference
// dequantization of a row, activation quantization, and the scalar integer-dot matmul that
// KVBOOST_ISA=scalar (or a CPU without AVX2) runs. The AVX2 version is matmul_q_avx2.cpp; both
// follow one scheme (llama.cpp's): activations to int8 blocks of 32 with an f32 scale, integer
// dot products per block, f32 accumulation across blocks.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels {

namespace {
GgmlType ggml_of(WType t) {
  switch (t) {
    case WType::Q8_0: return GgmlType::Q8_0;
    case WType::Q4_0: return GgmlType::Q4_0;
    case WType::Q5_0: return GgmlType::Q5_0;
    case WType::Q4_K: return GgmlType::Q4_K;
    case WType::Q5_K: return GgmlType::Q5_K;
    case WType::Q6_K: return GgmlType::Q6_K;
    default: break;
  }
  fail("wtype ", wtype_name(t), " has no ggml type");
}
inline float h2f(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | (uint16_t(p[1]) << 8))); }
}  // namespace

bool wtype_is_quantized(WType t) {
  switch (t) {
    case WType::Q8_0: case WType::Q4_0: case WType::Q5_0: case WType::Q4_K: case WType::Q5_K:
    case WType::Q6_K: case WType::Q4_Z: case WType::Q4_Z128:
      return true;
    default: return false;
  }
}

int64_t wtype_block_elems(WType t) {
  switch (t) {
    case WType::F32: case WType::F16: case WType::BF16: return 1;
    case WType::Q8_0: case WType::Q4_0: case WType::Q5_0: case WType::Q4_Z: return 32;
    case WType::Q4_Z128: return 128;
    case WType::Q4_K: case WType::Q5_K: case WType::Q6_K: return 256;
  }
  fail("wtype ", int(t), " is not a weight type");
}

int64_t wtype_block_bytes(WType t) {
  switch (t) {
    case WType::F32: return 4;
    case WType::F16: case WType::BF16: return 2;
    case WType::Q8_0: return 34;
    case WType::Q4_0: return 18;
    case WType::Q5_0: return 22;
    case WType::Q4_Z: return 20;
    case WType::Q4_Z128: return 68;
    case WType::Q4_K: return 144;
    case WType::Q5_K: return 176;
    case WType::Q6_K: return 210;
  }
  fail("wtype ", int(t), " is not a weight type");
}

int64_t wtype_row_bytes(WType t, int64_t n) {
  const int64_t be = wtype_block_elems(t);
  if (n < 0 || n % be != 0)
    fail("wtype_row_bytes: a row of ", n, " elements is not whole ", wtype_name(t), " blocks of ", be);
  return n / be * wtype_block_bytes(t);
}

namespace cpu {

void check_quant_args(WType wt, int64_t K, const char* who) {
  if (!wtype_is_quantized(wt)) fail(who, ": ", wtype_name(wt), " is not a quantized type");
  const int64_t be = wtype_block_elems(wt);
  if (K <= 0 || K % be != 0)
    fail(who, ": K = ", K, " is not a positive multiple of the ", wtype_name(wt), " block of ", be);
}

void dequantize_wrow_ref(const void* src, WType wt, float* dst, int64_t n) {
  if (wt == WType::Q4_Z128) {
    check_quant_args(wt, n, "dequantize Q4_Z128");
    const uint8_t* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n / 128; ++i, b += 68, dst += 128) {
      const float d = h2f(b);
      const int z = b[2];
      for (int h = 0; h < 2; ++h)  // bytes 32h .. 32h + 31: elements 64h + j and 64h + 32 + j
        for (int j = 0; j < 32; ++j) {
          dst[64 * h + j] = d * float(int(b[4 + 32 * h + j] & 0x0F) - z);
          dst[64 * h + 32 + j] = d * float(int(b[4 + 32 * h + j] >> 4) - z);
        }
    }
    return;
  }
  if (wt != WType::Q4_Z) return dequantize_row_ref(src, ggml_of(wt), dst, n);
  check_quant_args(wt, n, "dequantize Q4_Z");
  const uint8_t* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / 32; ++i, b += 20, dst += 32) {
    const float d = h2f(b);
    const int z = b[2];
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(int(b[4 + j] & 0x0F) - z);
      dst[j + 16] = d * float(int(b[4 + j] >> 4) - z);
    }
  }
}

void dequantize_wrow(const void* src, WType wt, float* dst, int64_t n) {
  if (wt != WType::Q4_Z && wt != WType::Q4_Z128) return dequantize_row(src, ggml_of(wt), dst, n);
  dequantize_wrow_ref(src, wt, dst, n);
}

void quantize_act_scalar(const float* x, int64_t m_begin, int64_t m_end, int64_t K, int8_t* q, float* d,
                         float* s) {
  const int64_t nb = K / kActBlock;
  for (int64_t m = m_begin; m < m_end; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kActBlock;
      int8_t* qb = q + m * K + b * kActBlock;
      float amax = 0.0f;
      for (int i = 0; i < kActBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float db = amax / 127.0f, id = db > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int i = 0; i < kActBlock; ++i) {
        const int v = int(std::nearbyint(xb[i] * id));  // round to nearest even, as cvtps2dq
        qb[i] = int8_t(v);
        sum += v;
      }
      d[m * nb + b] = db;
      s[m * nb + b] = db * float(sum);
    }
}

QAct quantize_act(const float* x, int64_t M, int64_t K, bool avx2) {
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf, sbuf;
  const int64_t nb = K / kActBlock;
  if (int64_t(qbuf.size()) < M * K) qbuf.resize(size_t(M * K));
  if (int64_t(dbuf.size()) < M * nb) dbuf.resize(size_t(M * nb)), sbuf.resize(size_t(M * nb));
  int8_t* q = qbuf.data();
  float *d = dbuf.data(), *s = sbuf.data();
  // Rows split across threads once there is enough work for it to pay (~64K elements).
  parallel_for(M, 1, M * K >= (int64_t(1) << 16) ? 2 : INT64_MAX, [&](int64_t b, int64_t e) {
    if (avx2) quantize_act_avx2(x, b, e, K, q, d, s);
    else quantize_act_scalar(x, b, e, K, q, d, s);
  });
  QAct a;
  a.q = q, a.d = d, a.s = s, a.K = K, a.nb = nb;
  return a;
}

namespace {

// One weight block as small integers: w[e] (int8) with, per 32-element sub-block j, an f32
// scale fsc[j] and min fmin[j], and per 16 elements an integer multiplier isc (Q6_K's int8
// scales; 1 otherwise): element e of sub-block j is fsc[j] * isc[e / 16] * w[e] - fmin[j].
struct Decoded {
  int8_t w[256];
  int isc[16];
  float fsc[8], fmin[8];
  int n_sub;
};

void decode_block(WType wt, const uint8_t* b, Decoded& o) {
  switch (wt) {
    case WType::Q8_0:
      o.n_sub = 1, o.fsc[0] = h2f(b), o.fmin[0] = 0.0f, o.isc[0] = o.isc[1] = 1;
      std::memcpy(o.w, b + 2, 32);
      return;
    case WType::Q4_0: case WType::Q4_Z: {
      const int z = wt == WType::Q4_0 ? 8 : b[2];
      const uint8_t* qs = b + (wt == WType::Q4_0 ? 2 : 4);
      o.n_sub = 1, o.fsc[0] = h2f(b), o.fmin[0] = 0.0f, o.isc[0] = o.isc[1] = 1;
      for (int j = 0; j < 16; ++j) {
        o.w[j] = int8_t((qs[j] & 0x0F) - z);
        o.w[j + 16] = int8_t((qs[j] >> 4) - z);
      }
      return;
    }
    case WType::Q4_Z128: {
      const int z = b[2];
      o.n_sub = 4;
      for (int j = 0; j < 4; ++j) o.fsc[j] = h2f(b), o.fmin[j] = 0.0f;
      for (int i = 0; i < 8; ++i) o.isc[i] = 1;
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 32; ++j) {
          o.w[64 * h + j] = int8_t((b[4 + 32 * h + j] & 0x0F) - z);
          o.w[64 * h + 32 + j] = int8_t((b[4 + 32 * h + j] >> 4) - z);
        }
      return;
    }
    case WType::Q5_0: {
      const uint32_t qh = uint32_t(b[2]) | uint32_t(b[3]) << 8 | uint32_t(b[4]) << 16 | uint32_t(b[5]) << 24;
      o.n_sub = 1, o.fsc[0] = h2f(b), o.fmin[0] = 0.0f, o.isc[0] = o.isc[1] = 1;
      for (int j = 0; j < 16; ++j) {
        o.w[j] = int8_t(((b[6 + j] & 0x0F) | int((qh >> j) & 1) << 4) - 16);
        o.w[j + 16] = int8_t(((b[6 + j] >> 4) | int((qh >> (j + 16)) & 1) << 4) - 16);
      }
      return;
    }
    case WType::Q4_K: case WType::Q5_K: {
      const bool five = wt == WType::Q5_K;
      const float d = h2f(b), dmin = h2f(b + 2);
      const uint8_t* sc = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      o.n_sub = 8;
      for (int i = 0; i < 16; ++i) o.isc[i] = 1;
      for (int j = 0; j < 8; ++j) {
        uint8_t s, m;
        k_scale_min(sc, j, s, m);
        o.fsc[j] = d * float(s), o.fmin[j] = dmin * float(m);
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l)
          o.w[32 * j + l] = int8_t(((q[l] >> shift) & 0x0F) | (five ? ((qh[l] >> j) & 1) << 4 : 0));
      }
      return;
    }
    case WType::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = h2f(b + 208);
      o.n_sub = 8;
      for (int i = 0; i < 16; ++i) o.isc[i] = sc[i];
      for (int j = 0; j < 8; ++j) o.fsc[j] = d, o.fmin[j] = 0.0f;
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          const uint8_t* lo = ql + 64 * h + 32 * (k % 2);
          const int lshift = 4 * (k / 2);
          for (int l = 0; l < 32; ++l)
            o.w[128 * h + 32 * k + l] =
                int8_t((((lo[l] >> lshift) & 0x0F) | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32);
        }
      return;
    }
    default: fail("decode_block: ", wtype_name(wt), " is not quantized");
  }
}

// Rows [n_begin, n_end) for tokens [0, M): each weight block is decoded once per chunk of up
// to kChunk tokens.
void q_rows_scalar(const QAct& a, const uint8_t* w, WType wt, const float* bias, float* y, int64_t M,
                   int64_t N, int64_t n_begin, int64_t n_end) {
  constexpr int64_t kChunk = 8;
  const int64_t K = a.K, be = wtype_block_elems(wt), bb = wtype_block_bytes(wt), nblk = K / be;
  const size_t rb = size_t(nblk * bb);
  Decoded dec;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = w + size_t(n) * rb;
    for (int64_t m0 = 0; m0 < M; m0 += kChunk) {
      const int64_t mc = std::min(kChunk, M - m0);
      float acc[kChunk] = {};
      for (int64_t blk = 0; blk < nblk; ++blk) {
        decode_block(wt, row + blk * bb, dec);
        for (int64_t t = 0; t < mc; ++t) {
          const int64_t m = m0 + t;
          for (int j = 0; j < dec.n_sub; ++j) {
            const int64_t ab = blk * dec.n_sub + j;  // activation block
            const int8_t* xq = a.q + m * K + ab * kActBlock;
            const int8_t* wq = dec.w + 32 * j;
            int lo = 0, hi = 0;
            for (int l = 0; l < 16; ++l) lo += int(wq[l]) * int(xq[l]);
            for (int l = 16; l < 32; ++l) hi += int(wq[l]) * int(xq[l]);
            const int dot = dec.isc[2 * j] * lo + dec.isc[2 * j + 1] * hi;
            acc[t] += dec.fsc[j] * a.d[m * a.nb + ab] * float(dot) - dec.fmin[j] * a.s[m * a.nb + ab];
          }
        }
      }
      for (int64_t t = 0; t < mc; ++t) y[(m0 + t) * N + n] = acc[t] + (bias ? bias[n] : 0.0f);
    }
  }
}

// Many tokens (M >= kDequantMinM): each row dequantized once, f32 dots for every token.
void dq_rows_scalar(const float* x, const uint8_t* w, WType wt, const float* bias, float* y, int64_t M,
                    int64_t N, int64_t K, int64_t n_begin, int64_t n_end) {
  thread_local std::vector<float> row;
  if (int64_t(row.size()) < K) row.resize(size_t(K));
  const size_t rb = size_t(wtype_row_bytes(wt, K));
  for (int64_t n = n_begin; n < n_end; ++n) {
    dequantize_wrow_ref(w + size_t(n) * rb, wt, row.data(), K);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * row[size_t(k)];
      y[m * N + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

}  // namespace

void matmul_q_scalar(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                     int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  if (M >= kDequantMinM) {
    parallel_for(N, 16, 32, [&](int64_t b, int64_t e) {
      dq_rows_scalar(x, static_cast<const uint8_t*>(w), wt, bias, y, M, N, K, b, e);
    });
    return;
  }
  const QAct a = quantize_act(x, M, K, /*avx2=*/false);
  parallel_for(N, 16, M * N * K >= (int64_t(1) << 16) ? 32 : INT64_MAX, [&](int64_t b, int64_t e) {
    q_rows_scalar(a, static_cast<const uint8_t*>(w), wt, bias, y, M, N, b, e);
  });
}

void matmul_q_int_ref(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                      int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  if (M <= 0 || N <= 0) return;
  const QAct a = quantize_act(x, M, K, /*avx2=*/false);
  q_rows_scalar(a, static_cast<const uint8_t*>(w), wt, bias, y, M, N, 0, N);
}

}  // namespace cpu
}  // namespace kvboost::kernels
