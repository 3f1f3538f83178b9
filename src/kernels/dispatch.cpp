// The one place where a kernel version is chosen (kvboost::active_isa(), KVBOOST_ISA override).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cpu/cpu_kernels.h"
#include "cpu/flash_attention.h"
#include "cpu/matmul_packed_isa.h"
#include "kvboost/common.h"

namespace kvboost::kernels {

const char* wtype_name(WType t) {
  switch (t) {
    case WType::F32: return "F32";
    case WType::F16: return "F16";
    case WType::BF16: return "BF16";
    case WType::Q8_0: return "Q8_0";
    case WType::Q4_0: return "Q4_0";
    case WType::Q5_0: return "Q5_0";
    case WType::Q4_K: return "Q4_K";
    case WType::Q5_K: return "Q5_K";
    case WType::Q6_K: return "Q6_K";
    case WType::Q4_Z: return "Q4_Z";
    case WType::Q4_Z128: return "Q4_Z128";
  }
  return "?";
}

int wtype_size(WType t) {
  switch (t) {
    case WType::F32: return 4;
    case WType::F16: case WType::BF16: return 2;
    default: break;
  }
  fail("wtype_size: ", wtype_name(t), " is a block type (", wtype_block_bytes(t), " bytes per ",
       wtype_block_elems(t), " elements); use wtype_row_bytes");
}

const char* quant_gemm_name(QuantGemm q) {
  switch (q) {
    case QuantGemm::Scalar: return "off";
    case QuantGemm::Avx2: return "avx2";
    case QuantGemm::AvxVnni: return "avxvnni";
    case QuantGemm::Avx512Vnni: return "avx512vnni";
    case QuantGemm::AmxInt8: return "amxint8";
    case QuantGemm::AmxBf16: return "amxbf16";
    case QuantGemm::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

const char* kernel_path_names() {
  return "scalar, avx2, avxvnni, avx512, avx512vnni, avx512bf16, amx (= amxbf16), amxint8 (AMX-BF16 floats, AMX-INT8 quantized GEMM)";
}

bool parse_kernel_path(std::string_view s, Isa& isa, QuantGemm& quant) {
  if (s == "scalar") isa = Isa::Scalar, quant = QuantGemm::Scalar;
  else if (s == "avx2") isa = Isa::Avx2, quant = QuantGemm::Avx2;
  else if (s == "avxvnni" || s == "avx-vnni" || s == "avx_vnni") isa = Isa::Avx2, quant = QuantGemm::AvxVnni;
  else if (s == "avx512" || s == "avx512vnni" || s == "avx512-vnni" || s == "avx512_vnni")
    isa = Isa::Avx512, quant = QuantGemm::Avx512Vnni;
  else if (s == "avx512bf16" || s == "avx512-bf16" || s == "avx512_bf16") isa = Isa::Avx512Bf16, quant = QuantGemm::Avx512Bf16;
  else if (s == "amx" || s == "amxbf16" || s == "amx-bf16" || s == "amx_bf16")
    isa = Isa::AmxBf16, quant = QuantGemm::AmxBf16;
  else if (s == "amxint8" || s == "amx-int8" || s == "amx_int8") isa = Isa::AmxBf16, quant = QuantGemm::AmxInt8;
  else return false;
  return true;
}

namespace {
// The quantized-GEMM cap of the kernel path: -1 until first read (then KVBOOST_ISA's, or none).
std::atomic<int> g_quant_cap{-1};

QuantGemm kernel_path_quant_cap() {
  int v = g_quant_cap.load(std::memory_order_relaxed);
  if (v < 0) {
    Isa isa = Isa::AmxBf16;
    QuantGemm q = QuantGemm::AmxBf16;
    if (const char* e = std::getenv("KVBOOST_ISA"); e && *e) (void)parse_kernel_path(e, isa, q);
    v = int(q);
    g_quant_cap.store(v, std::memory_order_relaxed);
  }
  return QuantGemm(v);
}
}  // namespace

void set_kernel_path(std::string_view s) {
  Isa isa;
  QuantGemm q;
  if (!parse_kernel_path(s, isa, q)) fail("kernel path '", s, "' is unknown: expected one of ", kernel_path_names());
  set_active_isa(isa);  // clamped to what the CPU and OS support
  g_quant_cap.store(int(q), std::memory_order_relaxed);
}

QuantGemm quant_gemm_path() {
  const Isa isa = active_isa();
  if (isa < Isa::Avx2) return QuantGemm::Scalar;
  const CpuFeatures& f = cpu_features();
  // What this CPU runs, within the active float level.
  // Avx512Bf16 (vdpbf16ps over bf16-dequantized panels) only when asked for by name: since the
  // AVX512-VNNI kernel's 32-row tiles and vectorised packing it is 1.08-1.2x faster on Zen 5
  // (pp512 2026-12-04: q8_0 1.13x, q4_0 1.19x, Gemma 3 270M Q4_K_M 1.08x) and the Intel
  // AVX512-BF16 host ran the bf16 path at 0.4x (docs/kernels-vnni.md).
  bool have[7] = {true, true, f.avxvnni, isa >= Isa::Avx512 && f.avx512vnni && f.avx512bw && f.avx512vl,
                  false,
                  isa >= Isa::AmxBf16 && f.amx_tile && f.amx_int8 && f.avx512vnni,
                  isa >= Isa::AmxBf16};
  QuantGemm cap = kernel_path_quant_cap();
  // KVBOOST_QUANT_GEMM caps it further (read on every call: tests and benchmarks switch it).
  if (const char* e = std::getenv("KVBOOST_QUANT_GEMM"); e && *e) {
    const std::string v(e);
    QuantGemm c;
    if (v == "off" || v == "scalar") c = QuantGemm::Scalar;
    else if (v == "avx2") c = QuantGemm::Avx2;
    else if (v == "avxvnni") c = QuantGemm::AvxVnni;
    else if (v == "avx512vnni") c = QuantGemm::Avx512Vnni;
    else if (v == "avx512bf16") c = QuantGemm::Avx512Bf16, have[4] = isa >= Isa::Avx512Bf16;
    else if (v == "amxint8") c = QuantGemm::AmxInt8;
    else if (v == "amxbf16" || v == "amx") c = QuantGemm::AmxBf16;
    else fail("KVBOOST_QUANT_GEMM='", v, "': expected off, avx2, avxvnni, avx512vnni, avx512bf16, amxint8 or amxbf16");
    if (c < cap) cap = c;
  }
  for (int q = int(cap); q > 0; --q)
    if (have[q]) return QuantGemm(q);
  return QuantGemm::Scalar;
}

void matmul(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
            int64_t N, int64_t K) {
  if (wtype_is_quantized(wt)) {
    cpu::check_quant_args(wt, K, "matmul");
    if (M <= 0 || N <= 0) return;
    // The scalar path is the same integer algorithm (not matmul_ref), so KVBOOST_ISA=scalar
    // runs what a CPU without AVX2 runs.
    if (active_isa() >= Isa::Avx2) {
      const QuantGemm path = quant_gemm_path();
      // Decode / verification over Q8_0 / Q4_0 / Q5_0 (two rows per vpdpbusd, blocks unpacked
      // once for up to 6 tokens) and Q4_K / Q6_K (a row's 256-block as four zmm in element
      // order): the 512-bit VNNI GEMV (docs/kernels-vnni.md).
      if (M < cpu::kQGemmMinM &&
          (wt == WType::Q8_0 || wt == WType::Q4_0 || wt == WType::Q5_0 || wt == WType::Q4_K || wt == WType::Q6_K) &&
          path >= QuantGemm::Avx512Vnni &&
          active_isa() >= Isa::Avx512 && cpu_features().avx512vnni)
        return cpu::gemv_q_avx512vnni(x, w, wt, bias, y, M, N, K);
      // Every quantized path changes kernel, and rounding, at the same call size, kQGemmMinM
      // tokens: a prompt's tokens get bit-identical rows in any call of >= kQGemmMinM tokens
      // (PrefillSplit.*). Below it: the GEMV / small-M tiles.
      if (M >= cpu::kQGemmMinM) {
        switch (path) {
          case QuantGemm::AmxBf16: return cpu::matmul_qbf16_amx(x, w, wt, bias, y, M, N, K);
          case QuantGemm::AmxInt8: return cpu::matmul_qgemm_amx(x, w, wt, bias, y, M, N, K);
          case QuantGemm::Avx512Bf16: return cpu::matmul_qbf16_avx512bf16(x, w, wt, bias, y, M, N, K);
          case QuantGemm::Avx512Vnni: return cpu::matmul_qgemm_avx512vnni(x, w, wt, bias, y, M, N, K);
          case QuantGemm::AvxVnni: return cpu::matmul_qgemm_avxvnni(x, w, wt, bias, y, M, N, K);
          case QuantGemm::Avx2: return cpu::matmul_qgemm_avx2(x, w, wt, bias, y, M, N, K);
          default: break;  // off: the tiles below (f32 dequantized panels from 64 tokens)
        }
      }
      return cpu::matmul_q_avx2(x, w, wt, bias, y, M, N, K);
    }
    return cpu::matmul_q_scalar(x, w, wt, bias, y, M, N, K);
  }
  if (active_isa() >= Isa::Avx2) return cpu::matmul_avx2(x, w, wt, bias, y, M, N, K);
  matmul_ref(x, w, wt, bias, y, M, N, K);
}

namespace {
// AMX from this many tokens (its tiles hold 16 and the tokens are padded to 32; fewer go to
// vdpbf16ps, same layout). AVX-512 f32 FMA above this many (decode and small batches are
// bandwidth-bound: the AVX2 GEMV / small-M paths, with their prefetch, read the same layout).
constexpr int64_t kAmxMinM = 16;
constexpr int64_t kAvx512MinM = 17;
}  // namespace

void matmul_packed(const float* x, const PackedWeight& w, const float* bias, float* y, int64_t M) {
  if (M <= 0) return;
  if (w.empty()) fail("matmul_packed: empty PackedWeight");
  const Isa isa = active_isa();
  if (w.layout() == PackLayout::Bf16Pairs) {
    if (isa >= Isa::AmxBf16 && M >= kAmxMinM) return cpu::matmul_packed_amx(x, w, bias, y, M);
    if (isa >= Isa::Avx512Bf16) return cpu::matmul_packed_avx512bf16(x, w, bias, y, M);
    fail("matmul_packed: the weight [", w.n(), ", ", w.k(), "] was packed in the Bf16Pairs layout "
         "(for avx512bf16/amx) but the active path is ", isa_name(isa),
         ": pack it again under this path (pack_weight)");
  }
  if (isa >= Isa::Avx512 && M >= kAvx512MinM) return cpu::matmul_packed_avx512(x, w, bias, y, M);
  if (isa >= Isa::Avx2) return cpu::matmul_packed_avx2(x, w, bias, y, M);
  matmul_packed_ref(x, w, bias, y, M);
}

namespace {
// Element-wise kernels are split over the thread pool from this many floats on (37 tokens at
// hidden 896; a single decode row stays on the calling thread, where a pool round trip would
// cost more than the work).
constexpr int64_t kEltParallelMin = 1 << 15;

// f(r0, r1) over rows [0, n_rows), split over the pool when the rows hold enough floats.
template <typename F>
void for_rows(int64_t n_rows, int64_t dim, F&& f) {
  if (n_rows < 2 || n_rows * dim < kEltParallelMin) {
    if (n_rows > 0) f(int64_t(0), n_rows);
    return;
  }
  parallel_for(n_rows, 1, 2, f);
}
}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps) {
  const bool avx2 = active_isa() >= Isa::Avx2;
  for_rows(n_rows, dim, [&](int64_t r0, int64_t r1) {
    if (avx2) cpu::rms_norm_avx2(x + r0 * dim, w, y + r0 * dim, r1 - r0, dim, eps);
    else rms_norm_ref(x + r0 * dim, w, y + r0 * dim, r1 - r0, dim, eps);
  });
}

void add_rms_norm(float* x, const float* d, const float* w, float* y, int64_t n_rows, int64_t dim,
                  float eps) {
  const bool avx2 = active_isa() >= Isa::Avx2;
  for_rows(n_rows, dim, [&](int64_t r0, int64_t r1) {
    const int64_t o = r0 * dim;
    if (avx2) cpu::add_rms_norm_avx2(x + o, d + o, w, y + o, r1 - r0, dim, eps);
    else add_rms_norm_ref(x + o, d + o, w, y + o, r1 - r0, dim, eps);
  });
}

void silu_mul(const float* gate, const float* up, float* y, int64_t n) {
  const bool avx2 = active_isa() >= Isa::Avx2;
  // Ranges on 16-float boundaries: threads never share a cache line of y.
  parallel_for(n, 16, kEltParallelMin, [&](int64_t b, int64_t e) {
    if (avx2) cpu::silu_mul_avx2(gate + b, up + b, y + b, e - b);
    else silu_mul_ref(gate + b, up + b, y + b, e - b);
  });
}

void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n) {
  const bool avx2 = active_isa() >= Isa::Avx2;
  parallel_for(n, 16, kEltParallelMin, [&](int64_t b, int64_t e) {
    if (avx2) cpu::gelu_tanh_mul_avx2(gate + b, up + b, y + b, e - b);
    else gelu_tanh_mul_ref(gate + b, up + b, y + b, e - b);
  });
}

int64_t argmax(const float* x, int64_t n) {
  if (active_isa() >= Isa::Avx2) return cpu::argmax_avx2(x, n);
  return argmax_ref(x, n);
}

void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q,
               int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
               int64_t head_dim, int64_t window, float scale, float* scratch) {
  if (active_isa() >= Isa::Avx2)
    return cpu::attention_avx2(q, k, v, out, n_q, q_pos0, n_kv_tokens, n_heads, n_kv_heads,
                               head_dim, window, scale, scratch);
  cpu::attention_scalar(q, k, v, out, n_q, q_pos0, n_kv_tokens, n_heads, n_kv_heads, head_dim,
                        window, scale, scratch);
}

void paged_attention_split(const float* q, const float* k_pool, const float* v_pool,
                           const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                           int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                           int64_t n_splits, float* lse) {
  if (active_isa() >= Isa::Avx512)
    return cpu::paged_attention_avx512(q, k_pool, v_pool, block_table, out, n_q, q_pos0,
                                       n_kv_tokens, block_size, n_heads, n_kv_heads, head_dim,
                                       window, scale, n_splits, lse);
  if (active_isa() >= Isa::Avx2)
    return cpu::paged_attention_avx2(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens,
                                     block_size, n_heads, n_kv_heads, head_dim, window, scale,
                                     n_splits, lse);
  cpu::paged_attention_scalar(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens,
                              block_size, n_heads, n_kv_heads, head_dim, window, scale, n_splits, lse);
}

void paged_attention_lse(const float* q, const float* k_pool, const float* v_pool,
                         const int32_t* block_table, float* out, float* lse, int64_t n_q,
                         int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale) {
  paged_attention_split(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size,
                        n_heads, n_kv_heads, head_dim, window, scale, /*n_splits=*/0, lse);
}

void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                     int64_t n_rows, int64_t head_dim) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float a = lse[r], b = lse_part[r];
    if (b == -std::numeric_limits<float>::infinity()) continue;  // the part saw no key
    float* o = out + r * head_dim;
    const float* p = out_part + r * head_dim;
    if (a == -std::numeric_limits<float>::infinity()) {
      for (int64_t d = 0; d < head_dim; ++d) o[d] = p[d];
      lse[r] = b;
      continue;
    }
    const float m = std::max(a, b);
    const float wa = std::exp(a - m), wb = std::exp(b - m), inv = 1.0f / (wa + wb);
    for (int64_t d = 0; d < head_dim; ++d) o[d] = (o[d] * wa + p[d] * wb) * inv;
    lse[r] = m + std::log(wa + wb);
  }
}

void paged_attention(const float* q, const float* k_pool, const float* v_pool,
                     const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                     int64_t n_kv_tokens, int64_t block_size, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, int64_t window, float scale) {
  paged_attention_split(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size,
                        n_heads, n_kv_heads, head_dim, window, scale, /*n_splits=*/0, nullptr);
}

void dequantize_row(const void* src, GgmlType t, float* dst, int64_t n) {
  if (active_isa() >= Isa::Avx2) return cpu::dequantize_row_avx2(src, t, dst, n);
  dequantize_row_ref(src, t, dst, n);
}

}  // namespace kvboost::kernels
