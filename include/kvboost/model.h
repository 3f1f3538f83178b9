// kvboost/model.h — the model module's public API: ModelConfig (config.json / GGUF metadata),
// LoadOptions, and the Model handle (load, forward passes over caller-owned K/V views,
// CacheBlend repair). Architectures: llama, mistral, qwen2, qwen3, gemma3 (src/model/arch/).
// The weight-file layer (safetensors / GGUF tensors) is kvboost/model_files.h; the test
// fixture writer is the kvboost_testing library (src/testing/fixture.h).
// Uses kvboost/common.h, kvboost/kernels.h and kvboost/kv_layout.h (the K/V views).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvboost/sampling.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/kv_layout.h"

namespace kvboost {

class Tokenizer;  // kvboost/tokenizer.h (model_identity mixes in its vocabulary)

// rope_scaling from config.json. type "default" (none), "linear", "llama3".
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};


struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | gemma3
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (qwen2; llama attention_bias)
  bool qk_norm = false;         // per-head RMSNorm on q and k before RoPE (qwen3, gemma3)
  std::vector<int64_t> layer_window;  // per layer: sliding-window size, 0 = full attention
  // ---- Gemma 3 (model_type gemma3; the defaults leave the other families unchanged) ----
  std::string hidden_act = "silu";  // silu | gelu_pytorch_tanh (the gate activation)
  float embed_scale = 1.0f;         // embeddings are multiplied by this (gemma3: sqrt(hidden_size))
  double query_pre_attn_scalar = 0;  // attention scale 1/sqrt(this); 0: 1/sqrt(head_dim)
  double rope_local_theta = 0;       // RoPE base of sliding-window layers; 0: rope_theta
  // RMSNorm on the attention output and on the MLP output before each residual add
  // (post_attention_layernorm / post_feedforward_layernorm; the MLP's input norm is then
  // pre_feedforward_layernorm).
  bool sandwich_norms = false;
  // Added to every RMSNorm weight at load: Hugging Face's Gemma3RMSNorm computes x * (1 + w);
  // llama.cpp's converter stores 1 + w in GGUF files, so 0 there.
  float norm_weight_offset = 0.0f;
  std::optional<int32_t> bos_token_id;
  // generation_config.json first, then config.json; GGUF: eos plus the end-of-turn tokens
  // llama.cpp stops at (Gemma's <end_of_turn>, <|eot_id|>, <|im_end|>, ...)
  std::vector<int32_t> eos_token_ids;
  // generation_config.json's sampling defaults (do_sample, temperature, top_p, top_k, with HF's
  // default top_k of 50 when the file is there but leaves it out; repetition_penalty); unset
  // without the file. Requests' unset fields take these (resolve_sampling, kvboost/sampling.h).
  SamplingParams generation;

  // Parses config.json (and generation_config.json when present) of a model directory.
  static ModelConfig from_dir(const std::string& dir);
  // `source` names the config in error messages.
  static ModelConfig from_json(const std::string& config_json,
                               const std::string& generation_config_json = "",
                               const std::string& source = "config.json");
  // The same hyper-parameters from a GGUF file's metadata (general.architecture llama | qwen2 |
  // qwen3 | gemma3, <arch>.block_count, .embedding_length, ...; tie = no output.weight tensor).
  static ModelConfig from_gguf(const std::string& gguf_path);
};

// The GGUF file a model path names: `path` itself when it is a .gguf file, or the only .gguf
// file of a directory without config.json; "" when the path is not a GGUF model (Error when
// a directory holds several .gguf files).
std::string gguf_model_file(const std::string& path);

// The tokenizer stored in a GGUF file's tokenizer.ggml.* metadata ("gpt2" byte-level BPE with
// tokenizer.ggml.pre qwen2 | llama-bpe | gpt-2 | default, or "llama" SentencePiece BPE whose
// merges are derived from the scores), as the tokenizer.json and tokenizer_config.json texts
// Tokenizer::from_json reads (the config carries BOS/EOS, add_bos/eos_token and, when the file
// has one, tokenizer.chat_template). Error naming the file and key on missing or bad metadata.
struct GgufTokenizerFiles {
  std::string tokenizer_json, tokenizer_config_json;
};
GgufTokenizerFiles gguf_tokenizer_files(const std::string& gguf_path);

// The model_type values this build runs.
const std::vector<std::string>& supported_model_types();

// A weight matrix or vector as the kernels see it.
struct Weight {
  const void* data = nullptr;
  kernels::WType type = kernels::WType::F32;
  int64_t rows = 0, cols = 0;  // [rows, cols]; vectors have rows == 1
  // Non-null: the matrix was repacked at load (LoadOptions::pack_weights) and data is
  // packed->data(), in the kernels::PackedWeight panel layout, not [rows, cols].
  const kernels::PackedWeight* packed = nullptr;
};

// Where one sequence's K/V live for a forward pass: a kv::KvLayout (kvboost/kv_layout.h: per
// layer a pool laid out [n_blocks][block_size][n_kv_heads][head_dim] f32, and the sequence's
// block table; position p is row p % block_size of block block_table[p / block_size]) plus how
// many positions are already stored. The kv module's PagedKvStorage::layout provides the layout
// for paged memory; KvCache below is the one-block special case. The row width may be left 0
// (the model's is used); another model's is an Error.
struct KvView : kv::KvLayout {
  int64_t n_past = 0;  // tokens whose K/V are already stored (positions 0 .. n_past-1)
  // Active for K/V that do not all fit in fast memory (cold-block spill): the forward pass
  // makes the blocks it writes resident before a layer writes them, and runs attention over the
  // ranges of the pager's plan (merged by log-sum-exp), making each resident before reading it.
  kv::Pager pager;
};

// A contiguous per-sequence K/V cache: k/v[layer] is [capacity, n_kv_heads, head_dim] f32 —
// one block of `capacity` tokens. For tools and tests; the engine uses paged memory.
class KvCache {
 public:
  KvCache(const ModelConfig& cfg, int64_t capacity);
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }  // tokens stored
  void clear() { size_ = 0; }
  void truncate(int64_t n) { size_ = n < size_ ? n : size_; }
  float* k(int64_t layer) { return k_ptrs_[size_t(layer)]; }
  float* v(int64_t layer) { return v_ptrs_[size_t(layer)]; }
  void set_size(int64_t n) { size_ = n; }
  KvView view() const;

 private:
  int64_t capacity_, size_ = 0, layer_stride_, n_kv_heads_, head_dim_;
  std::vector<float> k_, v_;
  std::vector<float*> k_ptrs_, v_ptrs_;
  int32_t block0_ = 0;
};

// One sequence's share of a batched forward pass (Model::forward_batch).
struct SeqBatch {
  const int32_t* tokens = nullptr;     // [n]
  // [n] strictly increasing positions; nullptr: kv.n_past, kv.n_past + 1, ... The token at
  // position p writes its K/V to its slot and attends keys [0, p]: every position below p that
  // is not computed in this call must already hold K/V (cached, reused, or computed earlier).
  const int32_t* positions = nullptr;
  int64_t n = 0;
  KvView kv;                           // kv.n_past is used only when positions == nullptr
  float* logits = nullptr;             // [n_logits, vocab]: logits of the last n_logits tokens
  int64_t n_logits = 1;                // 0..n; ignored when logits == nullptr
};

// CacheBlend (Yao et al., EuroSys 2025) selective recompute for Model::forward_blend.
struct BlendOptions {
  int64_t check_layer = 1;   // layers below it recompute every token; K/V of all at check_layer
  float ratio = 0.15f;       // fraction of the reused tokens recomputed after check_layer
  // Gradual filtering (the CacheBlend paper's): first_ratio > ratio selects that fraction at the
  // check layer, and each of the next taper_layers layers re-ranks the survivors by their own
  // K/V deviation there and keeps fewer, down to `ratio` from check_layer + taper_layers on.
  // first_ratio <= ratio: one selection at the check layer.
  float first_ratio = 0.0f;
  int64_t taper_layers = 1;
  // [n] 1: the token's K/V in its slot came from a cache (a candidate to skip); 0: computed
  // in every layer (new tokens). The last token is always computed (it produces the logits).
  const uint8_t* reused = nullptr;
};
struct BlendStats {
  int64_t n_full_layers = 0;      // layers in which every token was computed (plus K/V of all
                                  // tokens at the check layer)
  int64_t n_selected = 0;         // reused tokens recomputed after the check layer
  int64_t n_rows_late = 0;        // tokens computed in the last layer (selected + new)
  int64_t n_row_layers = 0;       // rows x layers computed from the check layer on (the cost)
};

// The selection schedule of a CacheBlend pass, shared by Model::forward_blend (CPU) and the
// device runner's pass (gpu::PagedRunner::forward_blend), so both select the same rows:
// candidates are the reused tokens but the last; the check layer keeps keep_at(check) of them
// (first_ratio, or ratio), each taper layer keeps fewer down to ratio. Errors name a ratio
// outside [0, 1].
class BlendSchedule {
 public:
  BlendSchedule(const BlendOptions& opt, int64_t n_tokens, int64_t n_layers);
  int64_t check_layer() const { return check_; }
  int64_t n_candidates() const { return n_cand_; }
  bool is_candidate(int64_t t) const { return cand_[size_t(t)] != 0; }
  // Candidates kept for layer l >= check_layer(): linearly from the first count to the final one.
  int64_t keep_at(int64_t l) const;
  // Whether layer l >= check_layer() measures and re-selects, with n_kept candidates current.
  bool selects_at(int64_t l, int64_t n_kept) const { return l == check_ || keep_at(l) < n_kept; }
  // The rows kept at layer l among the current rows (token index tok[r], deviation dev[r] of
  // each; non-candidates always kept): the keep_at(l) candidates of largest deviation, ties to
  // the earlier row. Returns the mask over rows; *n_kept_cand gets the candidates kept.
  std::vector<uint8_t> select(int64_t l, std::span<const int64_t> tok, std::span<const float> dev,
                              int64_t* n_kept_cand) const;
  // Deviation of one row's fresh K/V (k, v: [width]) from the cached (ck, cv), relative to the
  // fresh vectors' size, K and V each: |k - ck|^2 / |k|^2 + |v - cv|^2 / |v|^2 (in double).
  // The host reference of the device kernel cuda::kv_deviation.
  static float deviation(const float* k, const float* v, const float* ck, const float* cv, int64_t width);
  // deviation() in two steps, for tensor parallelism, where each rank holds some K/V heads of a
  // row: the four sums over [width] (out: |k - ck|^2, |v - cv|^2, |k|^2, |v|^2, in double) are
  // summed over the ranks first, then combined. deviation() == deviation_of_sums(the sums).
  static void deviation_sums(const float* k, const float* v, const float* ck, const float* cv, int64_t width,
                             double out[4]);
  static float deviation_of_sums(const double s[4]);

 private:
  std::vector<uint8_t> cand_;
  int64_t check_ = 0, n_cand_ = 0, n_first_ = 0, n_final_ = 0, taper_ = 0;
};

// The output projection (lm_head, or the embedding table when tied) quantized once at load
// into blocks the quantized matmul reads, as llama.cpp stores its output tensor: decode reads
// the whole [vocab, hidden] head for every token, so on small models it is a large share of the
// bytes per token (Qwen2.5-0.5B: 272 MB of bf16 of 496 MB per token with AWQ layers).
//   Auto: Q8_0 for AWQ checkpoints (their layers are 4-bit already; docs/quantization.md "AWQ 4-bit
//         checkpoints" has the measurement), None otherwise.
//   None: as stored.  Q8_0 / Q6_K / Q4_0: llama.cpp's reference quantizers (kernels::
//         quantize_row). Q6_K needs hidden_size % 256 == 0; otherwise Q8_0 is used instead
//         (llama.cpp's llama-quantize falls back the same way), with a note on stderr.
// Only a float head (F32 / F16 / BF16) is quantized: a head already in blocks (GGUF) is kept
// as it is. A tied embedding stays exact: the lookup keeps reading the stored table, and the
// quantized head is a separate copy. Layer streaming keeps the head resident (quantized).
enum class HeadQuant : uint8_t { Auto, None, Q8_0, Q6_K, Q4_0 };
// "auto" | "none" | "q8_0" | "q6_k" | "q4_0" (case-insensitive); Error naming the value and
// the choices otherwise. `what` names the option in the message (e.g. "--head-quant").
HeadQuant parse_head_quant(const std::string& s, const std::string& what = "head_quant");
const char* head_quant_name(HeadQuant q);  // "auto", "none", "q8_0", ...

struct LoadOptions {
  bool prefault = true;
  HeadQuant head_quant = HeadQuant::Auto;
  // Layer streaming: bytes of memory for per-layer matrices (q/k/v/o, gate/up/down). 0 = every
  // weight resident (memory-mapped) as usual. Otherwise a reader thread streams each forward
  // pass's layers from the weight files into a ring of budget / layer-size slots while earlier
  // layers compute (src/model/layer_stream.h); embeddings, lm_head, final norm and the small
  // vectors (norms, biases) stay resident outside the budget. A budget that holds every layer
  // keeps everything resident; one below two layers is an Error naming both sizes.
  uint64_t weight_budget = 0;
  // Repack every resident F32 / F16 / BF16 matrix (layers' q/k/v/o/gate/up/down and the
  // output projection) once at load into kernels::PackedWeight panels, which replace the
  // stored copy in memory (mapped pages are dropped with MADV_DONTNEED, owned buffers freed):
  // the same bytes, read by matmul_packed (faster at 2..63 tokens, no per-call packing at 64+).
  // A tied embedding table is packed too and the embedding lookup gathers its rows from the
  // panels (one copy). Quantized matrices and layer streaming (weight_budget that does not
  // hold every layer) keep the stored layout. The environment variable KVBOOST_PACK_WEIGHTS=0
  // turns it off whatever this says (A/B runs of one binary).
  bool pack_weights = true;
  std::function<void(const std::string& stage, size_t done, size_t total)> progress;
  // Where the forward pass runs (--device): the CPU by default. A CUDA device is the engine's
  // (Engine::load checks it first -- kernels::require_device: built without CUDA, no device,
  // index past the count are Errors naming the device -- and runs its passes through the device
  // runner); Model::load itself checks it too and then refuses it, since Model's own forward
  // passes are CPU code. docs/gpu.md says what runs on the device.
  kernels::Device device;
  // Device layer streaming (--vram-budget; a CUDA device only, an Error on the CPU): bytes of
  // device memory for the weights, the K/V pools and the pass scratch. 0 = every layer resident
  // on the device. A budget that cannot hold every layer keeps a prefix of layers resident and
  // streams the rest from pinned host memory through two device slots (gpu::plan_layer_stream).
  uint64_t vram_budget = 0;
};

namespace detail {
struct ModelImpl;  // src/model/model_impl.h: weights, architecture, RoPE tables, streamer
struct LayerWeights;
struct TpFeed;  // src/model/tp_forward.cpp: a TP group's shared pass over a streamed model
}
namespace dist {
class Comm;  // kvboost/dist.h
}

class Model {
 public:
  // `dir`: a Hugging Face model directory (safetensors), a .gguf file, or a directory holding
  // one .gguf file (see gguf_model_file).
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& opt = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const std::string& dir() const;
  // Bytes of the weights the model holds (matrices in their stored types, quantized blocks as
  // blocks; norm and bias vectors as f32), i.e. resident when not layer-streaming
  // (stream_info().resident_bytes says what streaming keeps). Depends only on the checkpoint
  // and LoadOptions::head_quant (a quantized head counts in its blocks; quantizing a tied
  // table adds the head's copy).
  size_t weight_bytes() const;
  // Bytes of the matrices one decoded token reads: every layer's q/k/v/o/gate/up/down and the
  // lm_head, in their stored types (decode's bandwidth bound is this / the read bandwidth).
  size_t decode_weight_bytes() const;
  // The weight files the model was loaded from, in load order (model_identity hashes them).
  std::vector<std::string> weight_paths() const;

  // The embedding table and the output projection as the forward pass reads them (the same
  // data when tied and not quantized at load).
  const Weight& embedding() const;
  const Weight& lm_head() const;
  // Matrices repacked at load (LoadOptions::pack_weights); 0 when every one is as stored.
  int64_t n_packed() const;

  // Layer streaming state and counters (LoadOptions::weight_budget); streaming = false when
  // every weight is resident.
  struct StreamInfo {
    bool streaming = false;
    bool direct = false;           // reads bypass the page cache (O_DIRECT)
    int64_t n_slots = 0;
    uint64_t slot_bytes = 0;       // one layer's matrices as read (4096-byte aligned extents)
    uint64_t pass_bytes = 0;       // bytes read per forward pass
    uint64_t resident_bytes = 0;   // weights kept resident outside the budget (embeddings, ...)
    uint64_t bytes_read = 0, layers_read = 0, passes = 0;
    double read_ms = 0;            // reader thread time inside read calls
    double wait_ms = 0;            // forward passes' time waiting for a layer to arrive
  };
  StreamInfo stream_info() const;

  // Runs tokens[0..n) at positions kv.n_past .. kv.n_past+n-1, writes their K/V into the
  // slots the block table names, attends over positions [0, kv.n_past + n), and writes logits:
  // [n, vocab] when all_logits, else [vocab] for the last token only. Thread-safe: forward
  // keeps no state in the Model.
  void forward(const int32_t* tokens, int64_t n, const KvView& kv, float* logits,
               bool all_logits = false) const;
  // The same over a contiguous cache, appending at kv.size(). Throws Error if kv lacks room.
  void forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits,
               bool all_logits = false) const;

  // Several sequences in one pass over the weights (continuous batching: decode tokens of many
  // sequences, prefill chunks, scattered recompute sets). Matmuls run over all tokens of all
  // sequences together; attention runs per sequence over its own block table.
  void forward_batch(const SeqBatch* seqs, int64_t n_seqs) const;

  // One sequence's tokens at positions kv.n_past .. kv.n_past + n - 1 with CacheBlend repair:
  // layers below check_layer compute all n tokens (overwriting their K/V); at check_layer each
  // reused token's fresh K and V are compared with the cached ones in its slot, and in the
  // later layers only the most deviated `ratio` of reused tokens plus every non-reused token
  // is computed and writes its K/V; the other tokens keep their cached K/V there. Logits of
  // the last token go to `logits` [vocab].
  BlendStats forward_blend(const int32_t* tokens, int64_t n, const KvView& kv,
                           const BlendOptions& opt, float* logits) const;

  // RoPE inverse frequencies [head_dim / 2] (rope scaling applied), for re-positioning keys.
  // Gemma 3's sliding layers rotate with another base: pass the layer for its frequencies.
  const std::vector<float>& rope_inv_freq() const;
  const std::vector<float>& rope_inv_freq(int64_t layer) const;

 private:
  friend class TpShard;  // tp_forward.cpp reads the bound weights
  Model();
  ModelConfig cfg_;
  std::unique_ptr<detail::ModelImpl> impl_;  // src/model/model_impl.h
};

// ---- tensor parallelism (src/model/tp_forward.cpp, docs/gpu.md) ----
// One rank's shard of a model (Megatron-style): attention heads split across `world` ranks
// (rows of Wq/Wk/Wv and their biases, columns of Wo) and the MLP's intermediate dimension
// (rows of gate/up, columns of down); embeddings, norms and the head stay whole on every rank.
// forward() all-reduces (sums) the partial outputs of the O and down projections, so every rank
// holds the same residual stream and the same logits. n_heads and n_kv_heads must divide by
// world (GQA groups stay on one rank); the intermediate split may be uneven. Architectures:
// llama, mistral, qwen2, qwen3 (others: Error). The model must be loaded with
// LoadOptions::pack_weights = false (Error otherwise); a quantized matrix split along its
// columns needs the split at a block boundary. Row slices point into the model's weights;
// column slices are copied (about 1/world of Wo and down per rank). A layer-streamed model
// (LoadOptions::weight_budget) runs through create_group only.
//
// The plan every shard follows, on the CPU (TpShard) and on a device (kvboost/gpu.h
// PagedRunnerOptions::comm): rank `rank`'s contiguous heads and its slice of the intermediate
// dimension. Errors: a rank outside [0, world), an architecture other than llama, mistral,
// qwen2, qwen3 (gemma3's sandwich norms), n_heads or n_kv_heads not a multiple of world,
// intermediate_size below world. world 1 is the whole model.
struct TpPlan {
  int rank = 0, world = 1;
  ModelConfig config;      // the shard's: n_heads / world, n_kv_heads / world, intermediate i1 - i0
  int64_t q0 = 0, q1 = 0;  // rows of Wq and the q bias, columns of Wo (the rank's heads x head_dim)
  int64_t k0 = 0, k1 = 0;  // rows of Wk, Wv and their biases (its K/V heads x head_dim)
  int64_t i0 = 0, i1 = 0;  // rows of gate and up, columns of down
  bool o_bias = true;      // the o_proj bias is added on rank 0 only (the all-reduce sums every rank's)
};
TpPlan tp_plan(const ModelConfig& c, int rank, int world);
// Rows [r0, r1) x columns [c0, c1) of a row-major matrix of `type` with `cols` columns:
// tp_slice_bytes is its size ((r1 - r0) rows of kernels::wtype_row_bytes(type, c1 - c0) bytes),
// tp_copy_slice copies it densely to dst. Error naming `what` for ranges outside the matrix and
// when c0 or c1 is not on a block boundary of the type (quantized matrices split by columns need
// the split at a multiple of their block: 32 for Q4_Z / Q8_0, 128 for Q4_Z128, 256 for K-quants).
size_t tp_slice_bytes(kernels::WType type, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                      const std::string& what);
void tp_copy_slice(const void* src, kernels::WType type, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   void* dst, const std::string& what);

class TpShard {
 public:
  static std::unique_ptr<TpShard> create(const Model& m, int rank, int world);
  // All `world` shards, for ranks that are threads of one process (the engine's TpRanks): as
  // create() for each rank, and a layer-streamed model runs too. The shards then share the
  // model's streamer, so a pass reads each layer once, as at TP = 1: rank 0 acquires the layer,
  // every rank binds its slices of the slot between two barriers (row slices point into it,
  // column slices are copied to buffers of the pass: about 1/world of Wo and down of one layer
  // per rank), and rank 0 releases it once every rank is done with the layer. create() on a
  // streamed model is an Error (a rank in a forked process has no reader thread).
  static std::vector<std::unique_ptr<TpShard>> create_group(const Model& m, int world);
  ~TpShard();
  // The shard's shapes: n_heads / world, n_kv_heads / world, its share of intermediate_size.
  // A KvCache of this config holds the rank's K/V.
  const ModelConfig& config() const { return cfg_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  // As Model::forward (tokens at kv.size() ..; logits [n, vocab] or [vocab]) on every rank at
  // once; comm.world() must equal world() and comm.rank() rank().
  void forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits, dist::Comm& comm) const;
  // As Model::forward_batch over the rank's paged K/V (each view's pools of this shard's
  // config), on every rank at once with the same sequences, tokens and block tables; logits of
  // the sequences that ask for them (a rank that needs none may pass logits = nullptr). K/V in
  // a cold tier: every rank's views carry pagers sharing one kv::PagerSync over the ranks (the
  // leader pages in the blocks of all of them).
  void forward_batch(const SeqBatch* seqs, int64_t n_seqs, dist::Comm& comm) const;
  // As Model::forward_blend over the rank's K/V (kv: a view of this shard's config, the cached
  // K/V of the reused tokens in their slots), on every rank at once. The deviation of a row is
  // measured over every K/V head: each rank's partial sums over its heads are all-reduced before
  // the selection (BlendSchedule::deviation_sums), so all ranks keep the same rows, the rows
  // TP = 1 keeps up to float reassociation. Logits [vocab] of the last token on every rank.
  BlendStats forward_blend(const int32_t* tokens, int64_t n, const KvView& kv, const BlendOptions& opt, float* logits,
                           dist::Comm& comm) const;

 private:
  TpShard() = default;
  const Model* model_ = nullptr;
  ModelConfig cfg_;
  int rank_ = 0, world_ = 1;
  std::vector<detail::LayerWeights> layers_;  // streamed: the slices' shapes, data null
  std::vector<std::vector<uint8_t>> store_;  // the copied column slices
  std::shared_ptr<detail::TpFeed> feed_;     // a streamed model: the group's pass
  TpPlan plan_;
  static std::unique_ptr<TpShard> make(const Model& m, int rank, int world, std::shared_ptr<detail::TpFeed> feed);
};

// ---- model identity (src/model/identity.cpp) ----
// The content identity of a model for keys of stored K/V (chunk stores, shared tiers): never
// equal for two models whose K/V could differ, equal for a renamed or copied file. XXH3-128
// over every weight file's full contents (weight_file_hash), the ModelConfig fields the forward
// pass reads, the tokenizer's vocabulary (id -> token, special flag) and `kv_format` (how the
// stored K/V are encoded, e.g. "f32" / "int8"). "kvb1-" + 32 hex digits. cache_file: a file
// remembering per-file hashes by path, device, inode, size and mtime (a restart does not read
// the weights again); "" = in-memory memo only. docs/chunk-identity.md has the cost.
std::string model_identity(const Model& m, const Tokenizer& tok, std::string_view kv_format,
                           const std::string& cache_file = "");
// XXH3-128 of one file's bytes as 32 hex digits, memoized as model_identity says.
std::string weight_file_hash(const std::string& path, const std::string& cache_file = "");


}  // namespace kvboost
