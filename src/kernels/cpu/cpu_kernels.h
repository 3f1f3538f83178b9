// Internal: per-ISA kernel entry points. Only dispatch.cpp chooses among them.
#pragma once
#include <cstring>

#include "kvboost/kernels.h"

namespace kvboost::kernels::cpu {

void matmul_avx2(const float* x, const void* w, WType wt, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K);

// Packed weights (kernels.h PackedWeight): features per panel, and the feature stored at
// position pos (0..15) of a panel's k row.
constexpr int kPackedPanel = 16;
int packed_feature(WType wt, int pos);
// matmul over raw [N, K] weights through the packed micro-kernel, packing panels on the fly
// (quantized weights: each panel dequantized to f32 as it is packed).
void matmul_raw_tiles_avx2(const float* x, const void* w, WType wt, const float* bias, float* y,
                           int64_t M, int64_t N, int64_t K);
void matmul_packed_avx2(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M);

void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps);
void add_rms_norm_avx2(float* x, const float* d, const float* w, float* y, int64_t n_rows, int64_t dim,
                       float eps);
void silu_mul_avx2(const float* gate, const float* up, float* y, int64_t n);
void gelu_tanh_mul_avx2(const float* gate, const float* up, float* y, int64_t n);
int64_t argmax_avx2(const float* x, int64_t n);

void attention_avx2(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                    int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, int64_t window, float scale, float* scratch);
void attention_scalar(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                      int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, int64_t window, float scale, float* scratch);

// All 8 of k_scale_min's scales and mins at once, as bytes in two 32-bit words each: w[0] holds
// scales 0..3 (byte j = scale j), w[1] scales 4..7, w[2] mins 0..3, w[3] mins 4..7. A dozen word
// operations instead of eight byte-by-byte extractions (the fast GEMVs widen the words in one
// vector instruction).
inline void k_scales_mins8(const uint8_t* q, uint32_t w[4]) {
  uint32_t u[3];
  std::memcpy(u, q, 12);
  w[0] = u[0] & 0x3f3f3f3fu;
  w[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  w[2] = u[1] & 0x3f3f3f3fu;
  w[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
}

}  // namespace kvboost::kernels::cpu

namespace kvboost::kernels::cpu {

// ---- quantized blocks ----
void dequantize_row_avx2(const void* src, GgmlType t, float* dst, int64_t n);
// Throws Error unless t is supported and n a multiple of its block size.
void check_dequant_args(GgmlType t, int64_t n);
// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes
// (llama.cpp get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split
// between a nibble of byte j+4 and the top 2 bits of bytes j-4 and j.
inline void k_scale_min(const uint8_t* q, int j, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace kvboost::kernels::cpu

namespace kvboost::kernels::cpu {

// ---- matmul over quantized weights (matmul_q.cpp, matmul_q_avx2.cpp) ----
// Activations are quantized per row to blocks of 32: row m, block b has int8 q[m*K + 32b ..
// + 32], scale d[m*nb + b] (max|x| / 127) and s[m*nb + b] = d * sum(q) (the block sum that
// zero points and K-quant mins multiply). nb = K / 32.
constexpr int kActBlock = 32;
// From this many tokens on (prefill), matmul over quantized weights dequantizes them instead:
// AVX2 a 16-row panel at a time into the f32 packed layout for the outer-product FMA tiles
// (matmul_packed_avx2.cpp, as plain weights from 64 tokens on), the scalar version a row at a
// time. Dequantizing costs ~K operations per row against 2 * K * M FLOPs, and without
// AVX-VNNI the f32 6x16 FMA tiles do more multiply-adds per instruction than maddubs/madd plus
// per-block scaling. No activation rounding on that path.
constexpr int64_t kDequantMinM = 64;
struct QAct {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  int64_t K = 0, nb = 0;
};
// Quantizes rows [m_begin, m_end) of x into the arrays of `a` (which must be sized for them).
void quantize_act_scalar(const float* x, int64_t m_begin, int64_t m_end, int64_t K, int8_t* q, float* d,
                         float* s);
void quantize_act_avx2(const float* x, int64_t m_begin, int64_t m_end, int64_t K, int8_t* q, float* d,
                       float* s);
// Quantizes x [M, K] into this thread's scratch (grown, never shrunk: no allocation per call
// once the largest M * K has been seen), in parallel over rows when M is large.
QAct quantize_act(const float* x, int64_t M, int64_t K, bool avx2);
// Throws Error unless wt is quantized and K a positive multiple of its block.
void check_quant_args(WType wt, int64_t K, const char* who);
// The integer-dot matmul: scalar (any CPU) and AVX2 versions of kernels::matmul for quantized wt.
void matmul_q_scalar(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                     int64_t N, int64_t K);
void matmul_q_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                   int64_t N, int64_t K);
// The integer-dot scheme of matmul_q_scalar for any M (no dequantized f32 path): the scalar
// reference of the prefill GEMMs below.
void matmul_q_int_ref(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                      int64_t N, int64_t K);
// Quantized prefill GEMMs, panels repacked per call into interleaved bytes, int8 activations:
// 8-row panels (matmul_qgemm_impl.h) for AVX2 (maddubs) and AVX-VNNI (256-bit vpdpbusd); 16-row
// panels (matmul_qgemm_avx512_impl.h) for AVX512-VNNI (512-bit vpdpbusd, masked tails) and
// AMX-INT8 (tdpbusd tiles). dispatch.cpp runs them from kQGemmMinM tokens on.
constexpr int64_t kQGemmMinM = 16;
void matmul_qgemm_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                       int64_t N, int64_t K);
void matmul_qgemm_avxvnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                          int64_t N, int64_t K);
void matmul_qgemm_avx512vnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                             int64_t N, int64_t K);
void matmul_qgemm_amx(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                      int64_t N, int64_t K);
// Quantized prefill on AMX-BF16 tiles over per-call bf16-dequantized panels (matmul_qbf16_amx.cpp;
// only where active_isa() >= Isa::AmxBf16).
void matmul_qbf16_amx(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                      int64_t K);
// Decode / verification (a few tokens) over Q8_0 / Q4_0 / Q5_0 blocks as stored, 512-bit vpdpbusd, two
// rows per zmm (gemv_q_avx512_impl.h; only where the Avx512 level and AVX512-VNNI are active).
void gemv_q_avx512vnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                       int64_t K);
// The same over vdpbf16ps tiles (matmul_qbf16_avx512bf16.cpp; only where active_isa() >= Avx512Bf16).
void matmul_qbf16_avx512bf16(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                             int64_t N, int64_t K);
// n elements (whole blocks) of a quantized row to f32: dispatching (fast) and scalar reference.
void dequantize_wrow(const void* src, WType wt, float* dst, int64_t n);
void dequantize_wrow_ref(const void* src, WType wt, float* dst, int64_t n);

}  // namespace kvboost::kernels::cpu
