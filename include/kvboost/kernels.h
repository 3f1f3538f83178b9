// kvboost/kernels.h — compute kernels: free functions over plain pointers and explicit shapes.
// No allocation, no virtual calls. Each public kernel dispatches once per call on
// kvboost::active_isa() to a per-ISA version; every fast version has a scalar `_ref` beside it
// that the tests compare against. Uses only kvboost/common.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kvboost {
enum class Isa;  // kvboost/common.h
}

namespace kvboost::kernels {

// Weight element types as stored in checkpoint files. F32/F16/BF16 are plain elements; the
// others are blocks that stay quantized in memory (matmul reads them directly):
//   Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K: the GGUF / ggml block layouts (GgmlType, below);
//   Q4_Z: 20 bytes / 32 elements: f16 d, uint8 z (0..15), uint8 reserved (0), uint8 qs[16]
//         (low nibbles = elements 0..15, high nibbles = elements 16..31, as Q4_0);
//         x = d * (q - z). AWQ's int4 groups (zero point per group) converted at load.
//   Q4_Z128: 68 bytes / 128 elements: f16 d, uint8 z (0..15), uint8 reserved (0), uint8 qs[64]:
//         byte i (0..31) holds element i (low nibble) and 32 + i (high), byte 32 + i holds
//         64 + i and 96 + i; x = d * (q - z). AWQ layers with group_size a multiple of 128 (the
//         usual 128): one header per group instead of Q4_Z's four copies, 4.25 instead of 5 bits
//         per weight (decode reads 15% fewer bytes); 32-byte loads unpack with one mask/shift.
enum class WType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, Q4_0 = 4, Q4_K = 5, Q5_K = 6,
                             Q6_K = 7, Q4_Z = 8, Q5_0 = 9, Q4_Z128 = 10 };
const char* wtype_name(WType);  // "F32", "Q4_K", ... (the dtype strings of TensorInfo)
// Element size in bytes of a plain type (4 or 2). Throws Error for a quantized type, whose
// elements have no size of their own: use wtype_row_bytes.
int wtype_size(WType);
bool wtype_is_quantized(WType);
int64_t wtype_block_elems(WType);  // elements per block (1 for F32/F16/BF16, 32 or 256)
int64_t wtype_block_bytes(WType);  // bytes per block (the element size for F32/F16/BF16)
// Bytes of a row of n elements; n must be a multiple of wtype_block_elems (Error otherwise).
int64_t wtype_row_bytes(WType, int64_t n);

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n] when bias != nullptr)
// x: [M, K] f32 row-major; w: [N, K] of type wt row-major (the nn.Linear layout): N rows of
// wtype_row_bytes(wt, K) bytes each (for a quantized type K must be a multiple of its block);
// bias: [N] f32 or nullptr; y: [M, N] f32. Parallel over N (and M) on the thread pool.
// Quantized weights: each activation row is quantized once per call to 8-bit blocks of 32
// (f32 scale d = max|x| / 127, q = round(x / d)), and the block dot products run on integers
// (llama.cpp's scheme), so the result differs from matmul_ref by at most
// sum over blocks of d/2 * sum |w| in that block (plus f32 rounding).
void matmul(const float* x, const void* w, WType wt, const float* bias, float* y,
            int64_t M, int64_t N, int64_t K);
void matmul_ref(const float* x, const void* w, WType wt, const float* bias, float* y,
                int64_t M, int64_t N, int64_t K);
// The kernel matmul runs for quantized weights from 16 tokens on (prefill), docs/kernels-vnni.md:
// an int8 GEMM over panels repacked per call: 8-row panels with vpmaddubsw (Avx2) or 256-bit
// VEX vpdpbusd (AvxVnni); 16-row panels with 512-bit vpdpbusd (Avx512Vnni, needs the Avx512
// level) or AMX-INT8 tdpbusd tiles (AmxInt8, needs the AMX level); above those, where the AMX
// level is active, AmxBf16: the panels dequantized to bf16 per call and the AMX-BF16 tiles of the
// packed bf16 GEMM (no per-block int32 epilogue; measured ~2.5x AmxInt8). The best the CPU has, capped
// by the kernel path (KVBOOST_ISA / set_kernel_path) and by the environment variable
// KVBOOST_QUANT_GEMM (off|avx2|avxvnni|avx512vnni|avx512bf16|amxint8|amxbf16). Scalar (named "off"): active_isa() is
// Scalar, or KVBOOST_QUANT_GEMM=off: the earlier path (f32 dequantized panels from 64 tokens).
// Q8_0 under Avx2 also keeps that path (measured faster than the GEMM's two nibble planes).
enum class QuantGemm : uint8_t {
  Scalar = 0,
  Avx2 = 1,
  AvxVnni = 2,
  Avx512Vnni = 3,
  Avx512Bf16 = 4,  // bf16-dequantized panels, vdpbf16ps: only by KVBOOST_QUANT_GEMM=avx512bf16
  AmxInt8 = 5,
  AmxBf16 = 6,
};
QuantGemm quant_gemm_path();
const char* quant_gemm_name(QuantGemm);

// Kernel paths: one KVBOOST_ISA / --isa value names both the float level (Isa) and the highest
// quantized GEMM (QuantGemm) to use; each is clamped to what the CPU and OS give:
//   scalar                        Scalar      off
//   avx2                          Avx2        avx2 (no VNNI, even where the CPU has AVX-VNNI)
//   avxvnni                       Avx2        avxvnni
//   avx512, avx512vnni            Avx512      avx512vnni
//   avx512bf16                    Avx512Bf16  avx512vnni
//   amx, amxbf16                  AmxBf16     amxbf16
//   amxint8                       AmxBf16     amxint8
// (plus the spellings amx-bf16, amx_bf16, amx-int8, amx_int8, avx512-bf16, avx512_bf16).
bool parse_kernel_path(std::string_view s, Isa& isa, QuantGemm& quant);
// Sets both (the --isa flag of the benchmarks); throws Error naming the value if unknown.
void set_kernel_path(std::string_view s);
// The spellings parse_kernel_path accepts, for error messages and --help.
const char* kernel_path_names();

// ---- weights repacked for the matmul micro-kernels (done once, at load) ----
// Layout: panels of 16 output features; panel p holds w[16p .. 16p + 16) as [K][16] (k-major),
// so prefill's register tiles (6 tokens x 16 features) read one contiguous 32/64-byte vector
// per k and decode streams each panel linearly. N is padded to a multiple of 16 with zeros.
// Within a k row: f32 and f16 in feature order; bf16 interleaved (features i and 8 + i in the
// same 32-bit word) so that a shift and a mask turn a 32-byte load into two f32 vectors.
// The element type is the source's (no precision is lost; the packed copy is the same size).
// That is PackLayout::Panel16, read by the AVX2 and AVX-512 (f32 FMA) kernels. BF16 weights
// packed for Isa::Avx512Bf16 / AmxBf16 take PackLayout::Bf16Pairs instead:
//   panels of 16 features, [Kp / 2][16][2] bf16 per panel: 64-byte row r holds, for each feature
//   n of the panel, w[n][2r] (low half of the 32-bit word n) and w[n][2r + 1] (high half) — the
//   operand of vdpbf16ps, and 16 rows of it (32 k) are exactly an AMX B tile (16 x 64 bytes).
//   Kp = K rounded up to 32 (one AMX tile of k) and N up to 32 (two panels: the kernels' 32-
//   feature tiles), the padding zeros.
// Those kernels round the activations to bf16 (RNE, as f32_to_bf16) and sum in f32, so their
// result is matmul_packed_ref's on x rounded to bf16, up to f32 summation order; vs the f32
// reference each output moves by at most 2^-8 * sum_k |x[m,k] * w[n,k]| more.
enum class PackLayout : uint8_t { Panel16 = 0, Bf16Pairs = 1 };
const char* pack_layout_name(PackLayout);
// The layout pack_weight(w, wt, N, K) chooses under `isa`: Bf16Pairs for BF16 weights from
// Isa::Avx512Bf16 up, Panel16 otherwise.
PackLayout pack_layout_for(Isa isa, WType wt);
class PackedWeight {
 public:
  PackedWeight() = default;
  WType wt() const { return wt_; }
  PackLayout layout() const { return layout_; }
  int64_t n() const { return n_; }        // output features (rows of the source)
  int64_t k() const { return k_; }        // input features
  const void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }  // packed size, padding included
  bool empty() const { return !data_; }

 private:
  friend PackedWeight pack_weight(const void* w, WType wt, int64_t N, int64_t K, PackLayout layout);
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<uint8_t[], Free> data_;
  size_t bytes_ = 0;
  WType wt_ = WType::F32;
  PackLayout layout_ = PackLayout::Panel16;
  int64_t n_ = 0, k_ = 0;
};
// w: [N, K] of type wt (the nn.Linear layout, as matmul takes it); plain types only (F32,
// F16, BF16: quantized weights are used in their block layout, Error otherwise). 64-byte
// aligned result.
// Parallel over panels; costs about one pass over the weights.
// The layout is pack_layout_for(active_isa(), wt): pack under the path that will run it.
PackedWeight pack_weight(const void* w, WType wt, int64_t N, int64_t K);
// An explicit layout (tests, tools): Bf16Pairs takes BF16 weights only (Error otherwise).
PackedWeight pack_weight(const void* w, WType wt, int64_t N, int64_t K, PackLayout layout);
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): matmul over a packed weight, any M (M = 1
// is decode's GEMV). x: [M, w.k()] f32; bias: [w.n()] or nullptr; y: [M, w.n()] f32.
// Dispatches on the weight's layout and active_isa(): Bf16Pairs runs the AMX kernel (from 16
// tokens) or the AVX512-BF16 one, and is an Error under a lower path (repack under that path);
// Panel16 runs AVX-512 (f32 FMA, from 17 tokens), AVX2, or the scalar reference.
void matmul_packed(const float* x, const PackedWeight& w, const float* bias, float* y, int64_t M);
// Scalar reference over the packed layout, either one (double accumulation, f32 activations):
// checks the layout and the fast versions.
void matmul_packed_ref(const float* x, const PackedWeight& w, const float* bias, float* y,
                       int64_t M);
// Row n of the source weight (w[n, 0..K) as pack_weight saw it) as f32: out [w.k()]. Exact
// (the packed elements are the source's). For a tied embedding table that is only kept packed:
// the lookup gathers one element per 16-feature k row (strided reads; cheap next to a matmul).
void packed_row(const PackedWeight& w, int64_t n, float* out);

// Row-wise RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.   x, y: [n_rows, dim]; w: [dim].
// x == y is allowed. Large inputs (prefill) are split by rows over the thread pool.
void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps);
void rms_norm_ref(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps);
// The residual add fused with the RMSNorm after it (the decoder's `x += sublayer output;
// h = rms_norm(x)`) in one pass over x and d: x += d, then y = rms_norm(x) * w.
// x, d, y: [n_rows, dim]; w: [dim]. y may alias d, not x. Equals the add loop followed by
// rms_norm up to the order of the sum of squares (bit-identical with GCC on each path).
void add_rms_norm(float* x, const float* d, const float* w, float* y, int64_t n_rows, int64_t dim,
                  float eps);
void add_rms_norm_ref(float* x, const float* d, const float* w, float* y, int64_t n_rows,
                      int64_t dim, float eps);

// Rotary embedding, Hugging Face rotate-half convention: within each head the pair is
// (i, i + head_dim/2). x: [n_tokens, n_heads, head_dim], rotated in place. cos/sin:
// [n_tokens, head_dim/2], already evaluated at each token's position.
void rope_rotate_half(float* x, const float* cos, const float* sin, int64_t n_tokens,
                      int64_t n_heads, int64_t head_dim);

// Re-positions keys that were rotated at positions p to positions p + delta (chunk reuse at
// another position): RoPE is a rotation, R(p + delta) = R(delta) R(p), so one extra rotation by
// delta * inv_freq[i] per pair does it; values need no change. k: [n_tokens, n_heads, head_dim]
// in place; inv_freq: [head_dim / 2] (rope scaling included). The angle is evaluated in double.
void rope_shift(float* k, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* inv_freq,
                int64_t delta);

// y[i] = silu(gate[i]) * up[i]; gate/up/y: [n]. y may alias gate. The AVX2 version evaluates
// e^x with a polynomial (~2 ulp of the reference); large n is split over the thread pool.
void silu_mul(const float* gate, const float* up, float* y, int64_t n);
void silu_mul_ref(const float* gate, const float* up, float* y, int64_t n);
// y[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
// (Gemma's gated MLP, GeGLU). gate/up/y: [n]. y may alias gate.
void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n);
void gelu_tanh_mul_ref(const float* gate, const float* up, float* y, int64_t n);

// Causal grouped-query attention over a contiguous KV cache.
// q:   [n_q, n_heads, head_dim]   queries for positions q_pos0 .. q_pos0 + n_q - 1
// k,v: [n_kv_tokens, n_kv_heads, head_dim], token t is at position t (t < n_kv_tokens)
// out: [n_q, n_heads, head_dim]
// Query i attends keys j with j <= q_pos0 + i and, when window > 0, (q_pos0 + i) - j < window.
// scale multiplies q·k (1/sqrt(head_dim) for these models). Scores accumulate in f32.
// scratch: at least n_threads * n_kv_tokens floats.
void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q,
               int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
               int64_t head_dim, int64_t window, float scale, float* scratch);
void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                   int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                   int64_t head_dim, int64_t window, float scale);

// ---- paged attention (FlashAttention-2 style) ----
// Paged causal grouped-query attention over one layer's block pools.
// q:       [n_q, n_heads, head_dim] f32, queries at positions q_pos0 .. q_pos0 + n_q - 1
// k_pool, v_pool: [n_blocks_total][block_size][n_kv_heads][head_dim] f32
// block_table: [ceil(n_kv_tokens / block_size)] physical block ids; token t lives in block
//              block_table[t / block_size], slot t % block_size. No other pool slot is read.
// out:     [n_q, n_heads, head_dim]
// Query i attends keys j <= q_pos0 + i (j < n_kv_tokens) and, when window > 0,
// (q_pos0 + i) - j < window; a query that sees no key gets 0. n_heads % n_kv_heads == 0.
// Keys/values stream through fixed tiles with an online softmax: extra memory is O(tile) per
// thread, never O(context) or O(context^2), and nothing is allocated. Few-query calls (decode)
// split the context across threads (split-K) and merge the partial softmaxes.
void paged_attention(const float* q, const float* k_pool, const float* v_pool,
                     const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                     int64_t n_kv_tokens, int64_t block_size, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, int64_t window, float scale);
// The same with the split-K factor fixed: n_splits key chunks per work unit (1 = unsplit,
// 0 = automatic, as paged_attention). For tests and benchmarks; capped by a fixed workspace.
void paged_attention_split(const float* q, const float* k_pool, const float* v_pool,
                           const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                           int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                           int64_t n_splits, float* lse = nullptr);
// paged_attention that also writes each row's log-sum-exp of its scaled scores
// (lse: [n_q, n_heads]; -inf for a row that sees no key), so that results over disjoint key
// ranges can be merged exactly with attention_merge (attention over K/V that do not all fit in
// memory at once: cold-block spill). Keys of a range [k0, k1) are passed as the sub-problem
// block_table + k0 / block_size, n_kv_tokens = k1 - k0, q_pos0 - k0 (k0 a multiple of block_size).
void paged_attention_lse(const float* q, const float* k_pool, const float* v_pool,
                         const int32_t* block_table, float* out, float* lse, int64_t n_q,
                         int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale);
// out/lse ([n_rows, head_dim] / [n_rows]) become the attention over the union of their keys and
// out_part/lse_part's (a log-sum-exp weighted average). lse = -inf means "no keys yet".
void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                     int64_t n_rows, int64_t head_dim);
// Scalar reference: one key at a time through the block table, double accumulation.
void paged_attention_ref(const float* q, const float* k_pool, const float* v_pool,
                         const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                         int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale);

// Converts n elements of type wt to f32 (embedding rows, norms). For a quantized type n must be
// a multiple of its block (whole blocks: one row of an embedding table).
void to_f32(const void* src, WType wt, float* dst, int64_t n);

// ---- quantized blocks (GGUF / ggml layouts) ----
// Element types of GGUF tensors; the values are ggml's type ids as stored in the file.
// Block layouts follow llama.cpp (ggml-common.h); all multi-byte fields are little-endian:
//   Q8_0: 34 bytes / 32 elements: f16 d, int8 q[32];             x = d * q
//   Q4_0: 18 bytes / 32 elements: f16 d, uint8 qs[16];           x = d * (nibble - 8), low
//         nibbles are elements 0..15, high nibbles 16..31
//   Q5_0: 22 bytes / 32 elements: f16 d, uint8 qh[4] (bit j of the little-endian uint32 is the
//         5th bit of element j), qs[16] (nibbles as Q4_0); x = d * ((nibble | bit << 4) - 16).
//         llama.cpp's fallback for rows that are not whole 256-blocks (Gemma 3 270M: K = 640)
//   Q4_K: 144 bytes / 256: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) for 8 sub-blocks of
//         32, qs[128] (bytes 32c..32c+31 hold sub-block 2c in low nibbles, 2c+1 in high);
//         x = d*scale_j * q - dmin*min_j
//   Q5_K: 176 bytes / 256: as Q4_K plus qh[32] before qs: bit j of qh[l] is the 5th bit of
//         element l of sub-block j
//   Q6_K: 210 bytes / 256: ql[128], qh[64], int8 scales[16] (one per 16 elements), f16 d;
//         x = d * scale * (q6 - 32)
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                                 Q6_K = 14, BF16 = 30 };
// True for the types above; `id` is a raw type id from a file.
bool ggml_type_supported(uint32_t id);
const char* ggml_type_name(GgmlType t);
int64_t ggml_block_elems(GgmlType t);  // elements per block (1 for F32/F16/BF16)
int64_t ggml_block_bytes(GgmlType t);  // bytes per block
// Bytes of n elements (n a multiple of the block size).
inline int64_t ggml_row_bytes(GgmlType t, int64_t n) {
  return n / ggml_block_elems(t) * ggml_block_bytes(t);
}

// dst[0..n) = the n elements of src (type t) as f32. n must be a multiple of
// ggml_block_elems(t) (Error otherwise). Bit-exact to the gguf Python package's dequantize
// (same f32 operations in the same order, no FMA contraction). Single-threaded.
void dequantize_row(const void* src, GgmlType t, float* dst, int64_t n);
void dequantize_row_ref(const void* src, GgmlType t, float* dst, int64_t n);

// The other direction, for weights quantized at load (the output projection, LoadOptions::
// head_quant): dst = the n elements of src (f32) as wtype_row_bytes(wt, n) bytes of wt blocks.
// Q8_0, Q4_0 and Q6_K are llama.cpp's reference quantizers without an importance matrix
// (quantize_row_q8_0_ref: d = max|x| / 127, q = round(x / d); q4_0_ref: d = (signed max) / -8;
// q6_K_ref: per-16 scales chosen by make_qx_quants' weighted least squares); Q4_Z is per-32
// min/max asymmetric (AWQ's rounding). n must be a multiple of the block; other types: Error.
// Single-threaded and scalar (load time).
bool quantize_row_supported(WType wt);
void quantize_row(const float* src, WType wt, void* dst, int64_t n);

// ---- sampling math (over one row of logits) ----
// In-place softmax of x[0..n).
void softmax(float* x, int64_t n);
// Index of the largest value (first one on ties; NaNs never win, except a NaN at 0, which
// nothing compares greater than). The AVX2 version gives the same index as the reference.
int64_t argmax(const float* x, int64_t n);
int64_t argmax_ref(const float* x, int64_t n);


// ---- compute devices (issue 29) ----
// Where a model runs: the CPU (the default) or CUDA device `index`. parse_device reads "cpu",
// "cuda" (= cuda:0) and "cuda:N"; anything else is an Error naming `what` and the value.
// require_device throws an Error naming the device when it cannot be used here: a build without
// -DKVBOOST_CUDA=ON ("kvboost was built without CUDA (-DKVBOOST_CUDA=ON)"), no CUDA device, or an
// index past the device count (both say how many devices CUDA sees). Never #ifdef at call sites.
struct Device {
  enum class Kind : uint8_t { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;
  bool is_cpu() const { return kind == Kind::Cpu; }
  std::string name() const;  // "cpu", "cuda:0"
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }  // C++17: nvcc includes this
};
Device parse_device(std::string_view s, std::string_view what = "device");
bool cuda_built();       // false without -DKVBOOST_CUDA=ON
int cuda_device_count();  // 0 without CUDA, without a driver or without a device; never throws
void require_device(const Device& d, std::string_view what = "device");

}  // namespace kvboost::kernels
