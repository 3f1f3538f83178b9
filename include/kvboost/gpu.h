// kvboost/gpu.h — the optional CUDA backend: a GPU decoder for the Llama family (llama, mistral,
// qwen2, qwen3) with its weights either all resident on the device or streamed layer by layer
// from pinned host memory through a few device slots (models larger than the device's weight
// budget), and the engine's paged device runner (PagedRunner: the forward passes of the
// engine's scheduler over device K/V pools indexed by the kv manager's block ids) with its
// host-side pass planning; with a dist::Comm, one rank of a tensor-parallel group of such
// runners. Uses kvboost/model.h, kvboost/kv_layout.h (block ids) and kvboost/dist.h.
//
// The API exists in every build. A build without -DKVBOOST_CUDA=ON answers every call that needs
// the device with Error "built without CUDA (-DKVBOOST_CUDA=ON)"; built_with_cuda() and
// device_count() never throw, so callers test for a device without any #ifdef.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvboost/dist.h"  // dist::Comm (tensor parallelism on devices)
#include "kvboost/kv.h"  // kv::HotTier, kv::IoPiece, kv::SlotCopy (the device KV spill)
#include "kvboost/kv_layout.h"
#include "kvboost/model.h"

namespace kvboost::gpu {

// False in a build without -DKVBOOST_CUDA=ON.
bool built_with_cuda();
// CUDA devices visible to this process; 0 without CUDA, without a driver or without a device.
int device_count();

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_bytes = 0, free_bytes = 0;
};
DeviceInfo device_info(int device = 0);

// Host -> device copy bandwidth in GB/s (1e9 bytes/s) from pinned (cudaHostAlloc) memory with
// cudaMemcpyAsync: `bytes` per copy, four copies queued back to back per timing, the median of
// `reps` timings after one warm-up. The ceiling that layer streaming is measured against.
double pinned_h2d_gbps(size_t bytes, int reps = 5, int device = 0);

struct DecoderOptions {
  int device = 0;
  int64_t max_tokens = 2048;  // K/V capacity of the sequence (prompt + generated)
  int64_t max_batch = 512;    // tokens per pass; longer prompts are prefilled in chunks
  // 0: every layer's weights resident on the device. S >= 2: streamed: all layer weights stay in
  // pinned host memory, and only S layer slots live on the device; while the compute stream runs
  // layer l, a copy stream fills the free slots with layers l + 1 .. l + S - 1 (CUDA events mark
  // "slot filled" and "slot free"). Embeddings, final norm and lm_head are always resident.
  // S >= n_layers behaves as streamed too (one copy per layer and pass), for tests.
  int64_t stream_slots = 0;
};

struct DecoderStats {
  int64_t passes = 0;          // forward passes (a chunked prefill counts each chunk)
  int64_t tokens = 0;          // tokens run
  uint64_t bytes_h2d = 0;      // layer weight bytes copied host -> device (streamed mode)
  int64_t layer_copies = 0;    // layer copies issued
};

// One sequence on the device: a contiguous f32 K/V cache of max_tokens positions per layer.
// Weights come from a loaded Model (its files: safetensors or GGUF with F32/F16/BF16 tensors;
// other dtypes are rejected with an Error naming the tensor). Matmuls run in f32 on f32 weights
// (cuBLAS SGEMM, no TF32); on f16/bf16 weights decode-sized passes (<= 8 tokens) use a GEMV with
// f32 activations, larger passes cuBLAS with activations rounded to the weight type and f32
// accumulation. AutoAWQ 4-bit layers (qweight/qzeros/scales) are repacked at load into Q4_Z128
// (group size a multiple of 128) or Q4_Z rows and stay 4-bit on the device and on the wire when
// streamed: decode passes read them with cuda::gemv_q4, larger ones dequantize one matrix to bf16
// for cuBLAS (cuda::matmul_q4). Tensor names come from the architecture tables (src/model/arch).
// Resident and streamed decoders run the same kernels on the same bytes: their
// logits are bit-identical. Not thread-safe; one Decoder per thread.
class Decoder {
 public:
  static std::unique_ptr<Decoder> create(const Model& model, const DecoderOptions& opt = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Runs tokens[0..n) at positions size() .. size() + n - 1, appends their K/V, and writes
  // logits: [n, vocab] when all_logits, else [vocab] of the last token. Error when the cache
  // lacks room or a token is outside the vocabulary.
  void forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits = false);
  int64_t size() const;   // tokens in the K/V cache
  void reset();           // empties the K/V cache
  const DecoderOptions& options() const;
  bool streamed() const;
  int64_t n_layers() const;
  size_t layer_bytes() const;          // one layer's packed weights (a slot's size)
  size_t device_weight_bytes() const;  // weight bytes on the device (slots + resident parts)
  const DecoderStats& stats() const;
  void reset_stats();
  // Streamed mode: copies every layer host -> device through the slots with no compute, `reps`
  // times, and returns the median milliseconds of one full pass of copies (the copy-only time
  // that overlap is measured against). Error in resident mode.
  double time_layer_copies(int reps = 3);

  struct Impl;

 private:
  explicit Decoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- layer-streaming plan (src/gpu/stream_plan.cpp; CPU-side logic, in every build) ----
// Which layers stay resident on the device under a VRAM budget and, for the rest, the copy /
// compute / event schedule over double-buffered (or more) device slots, so that layer i
// computes while layer i+1 copies. Plain data, planned once at load; the CUDA decoder executes
// it and tests/gpu checks it without a device.
struct StreamPlanInput {
  std::vector<uint64_t> layer_bytes;  // [n_layers] bytes of each layer's weights as copied (packed)
  uint64_t fixed_bytes = 0;   // always resident: embeddings, head, final norm, activations, K/V
  uint64_t vram_budget = 0;   // device bytes for all of it (--vram-budget)
  int64_t n_slots = 2;        // device slots for streamed layers (2 = double buffering)
};

enum class StreamOp : uint8_t {
  WaitFree,     // copy stream waits on event free[slot] (the compute that last used the slot)
  Copy,         // copy stream: layer's bytes, pinned host -> slot
  RecordFilled, // copy stream records filled[slot]
  WaitFilled,   // compute stream waits on filled[slot]
  Compute,      // compute stream runs the layer (slot -1: resident weights)
  RecordFree,   // compute stream records free[slot]
};
const char* stream_op_name(StreamOp op);

struct StreamStep {
  StreamOp op;
  int64_t layer;
  int64_t slot;  // -1 for a resident layer's Compute
};

struct StreamPlan {
  bool streaming = false;             // false: every layer resident (no slots, no copies)
  std::vector<bool> resident;         // [n_layers]
  std::vector<int64_t> streamed;      // the streamed layers in pass order
  int64_t n_slots = 0;                // 0 when not streaming
  uint64_t slot_bytes = 0;            // the largest streamed layer
  uint64_t resident_layer_bytes = 0;  // resident layers' bytes
  uint64_t device_bytes = 0;          // fixed + resident layers + slots (<= vram_budget)
  uint64_t bytes_per_pass = 0;        // host -> device bytes one forward pass copies
  // The calls the host issues, in order. Streamed item j (layer streamed[j]) lives in slot
  // j % n_slots. prologue (once, before the first pass): the copies of items 0 .. n_slots - 1.
  // steps (every pass): the layers' computes; right after item i's compute frees its slot, the
  // copy of item i + n_slots is issued into it -- of this pass, or (i + n_slots - m, m items) of
  // the next pass, so the next pass's first layers copy while this one finishes and samples.
  // With 2 slots, item i + 1 copies while item i computes.
  std::vector<StreamStep> prologue, steps;
};

// Error (naming the bytes) when the budget cannot hold fixed_bytes, or holds fewer than n_slots
// slots of the largest layer while not everything fits; n_slots < 2 is an Error.
StreamPlan plan_layer_stream(const StreamPlanInput& in);

// Predicted timeline of `passes` back-to-back passes of `plan` on two streams (copy, compute):
// copies at `h2d_bytes_per_s`, layer l computing for compute_s[l] seconds. Returns the steady
// state: seconds of the last pass and, per streamed item of it, the copy's [start, end) and the
// compute's [start, end), in seconds from that pass's start. What device runs are checked against
// (tokens/s of streamed decode vs bandwidth / bytes per pass).
struct StreamTimeline {
  double pass_s = 0;
  std::vector<double> copy_start, copy_end, compute_start, compute_end;  // per plan.streamed item
};
StreamTimeline simulate_layer_stream(const StreamPlan& plan, const std::vector<uint64_t>& layer_bytes,
                                     double h2d_bytes_per_s, const std::vector<double>& compute_s, int passes = 3);

// The plan as the runner issues it, layer by layer (src/gpu/stream_walk.cpp; every build): for
// each layer of one pass, the slot it reads and the copy-stream / compute-stream calls around
// its compute. A runner keeps two walks: `cold` for a pass with no copy of an earlier pass
// pending (the first one, or after a pass failed midway and both streams were synchronized),
// whose first layer issues the plan's prologue; the warm walk for every pass after a complete
// one, whose copies of its first streamed layers the previous pass's last computes issued.
struct StreamCopy {
  int64_t layer = 0, slot = 0;
  bool wait_free = false;  // the copy stream waits on free[slot] first (the slot's last compute)
};
struct LayerStreamActions {
  int64_t layer = 0;
  int64_t slot = -1;               // the slot the compute reads; -1: resident weights
  std::vector<StreamCopy> before;  // issued before the compute (the cold walk's first layer: the prologue)
  bool wait_filled = false;        // compute stream waits on filled[slot] before the compute
  bool record_free = false;        // compute stream records free[slot] after it
  std::vector<StreamCopy> after;   // issued after record_free: the copy into the slot it freed
};
// [n_layers] actions in layer order, each copy followed by a record of filled[slot]. Error when
// the plan's steps do not compute layers 0 .. n - 1 in order.
std::vector<LayerStreamActions> walk_layer_stream(const StreamPlan& plan, bool cold);

// ---- the engine's paged device runner (issue 29; docs/gpu.md "The engine on a CUDA device") ----
// The runtime's ModelRunner (src/runtime/runner.h) hands its passes here when the engine runs on
// a CUDA device. The device holds the weights (uploaded once: F32/F16/BF16 as stored, AWQ layers
// packed as Q4_Z / Q4_Z128) and one K pool and one V pool laid out as the CPU's
// (PoolLayout below), so the block ids the CPU KvCacheManager hands out index the device pools
// directly and nothing above the runner changes. The planning is plain host code in every build
// (src/gpu/pass_plan.cpp, tested without a device); the runner itself is CUDA-only
// (src/gpu/paged_runner.cpp) and answers "built without CUDA" otherwise.

// Where block b, row r of `layer` lives in a device pool: one allocation per K and per V of
// [n_layers][n_blocks][block_size][n_kv_heads][head_dim] f32 (the CPU pools' layout per layer,
// the layers back to back). Offsets are in floats.
struct PoolLayout {
  int64_t n_layers = 0, n_blocks = 0, block_size = 0, n_kv_heads = 0, head_dim = 0;
  int64_t row() const { return n_kv_heads * head_dim; }            // floats per position
  int64_t block_floats() const { return block_size * row(); }      // per layer, K or V
  int64_t layer_floats() const { return n_blocks * block_floats(); }
  uint64_t pool_bytes() const { return uint64_t(n_layers * layer_floats()) * sizeof(float); }  // K or V
  int64_t offset(int64_t layer, kv::BlockId b, int64_t r = 0) const {
    return layer * layer_floats() + (int64_t(b) * block_size + r) * row();
  }
};

// A run of positions [pos0 + t, pos0 + t + m) that lies in one block: pool row `slot`
// (block * block_size + first row) onward. What row copies and key rotations iterate over.
struct SlotRun {
  int64_t slot = 0, t = 0, m = 0;
  bool operator==(const SlotRun& o) const { return slot == o.slot && t == o.t && m == o.m; }
};
// The runs of positions [pos0, pos0 + n) under `table`. Error naming the position when the
// table is too short, an entry is a cold block (kv::kColdBlock: not resident on the device) or a
// block id outside [0, n_blocks).
std::vector<SlotRun> slot_runs(std::span<const kv::BlockId> table, int64_t block_size, int64_t n_blocks, int64_t pos0,
                               int64_t n);

// One sequence's share of a device pass: SeqBatch (kvboost/model.h) with the block table in
// place of the K/V view.
struct PagedSeq {
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n] increasing; nullptr: n_past, n_past + 1, ...
  int64_t n = 0;
  int64_t n_past = 0;                  // used only when positions == nullptr
  std::span<const kv::BlockId> block_table;  // the sequence's (KvCacheManager::block_table)
  float* logits = nullptr;             // [n_logits, vocab]: the last n_logits rows; nullptr: none
  int64_t n_logits = 1;
};

// Which attention kernel a run of n_q queries uses: the FlashAttention-2 prefill kernel, the
// split-K decode kernel (a few queries over many keys: the keys are split across CTAs), or a
// plain one-warp-per-(query, head) kernel for head dims the tiled kernels do not take (not a
// multiple of 32 in 32..256: stories260K's 8).
enum class AttnKernel : uint8_t { Flash, SplitK, Simple };
constexpr int64_t kSplitKMaxQueries = 8;
AttnKernel attention_kernel_for(int64_t n_q, int64_t head_dim);

// A contiguous run of positions of one sequence among the pass's rows: one attention call
// (queries pos0 .. pos0 + n - 1 over keys [0, pos0 + n) of the sequence's table at table_off).
struct PassRun {
  int64_t seq = 0, row0 = 0, n = 0, pos0 = 0, table_off = 0;
  AttnKernel kernel = AttnKernel::Flash;
};

// Everything one device pass uploads and launches, planned on the host (plan_pass).
struct PassPlan {
  int64_t n_rows = 0;
  std::vector<int32_t> tokens;      // [n_rows], the sequences' tokens back to back
  std::vector<int32_t> positions;   // [n_rows]
  std::vector<int64_t> slots;       // [n_rows] pool row of each row's K/V: block * block_size + p % block_size
  std::vector<int32_t> tables;      // each sequence's block table entries [0, ceil((last position + 1) / bs))
  std::vector<int64_t> table_off;   // [n_seqs] where each sequence's entries start in `tables`
  std::vector<PassRun> runs;
  std::vector<int64_t> logit_rows;  // rows whose logits are computed, sequence by sequence
  std::vector<int64_t> logit_count; // [n_seqs] of them per sequence (0: no logits)
  int64_t max_split_k_queries = 0;  // the largest SplitK run (its workspace)
  int64_t max_split_k_keys = 0;     // the longest key range of a SplitK run
};
// Errors name the sequence and index: no tokens, a token outside [0, vocab), positions not
// increasing, a position past the block table or on a cold or out-of-pool block.
PassPlan plan_pass(const PagedSeq* seqs, int64_t n_seqs, const PoolLayout& pool, int64_t vocab);

// The pinned staging buffer one pass uploads in a single copy: tokens (i32), slots (i64), block
// tables (i32), logit rows (i64), RoPE cos and sin [n_rows, head_dim / 2] (f32), each piece at a
// 256-byte aligned offset (the device copy keeps the offsets).
struct StagingLayout {
  size_t tokens = 0, slots = 0, tables = 0, logit_rows = 0, cos = 0, sin = 0, bytes = 0;
};
StagingLayout staging_layout(int64_t n_rows, int64_t n_table_entries, int64_t n_logit_rows, int64_t head_dim);

// Device scratch of a pass of n_rows rows (elements, f32 unless noted): the residual stream and
// norm output [n_rows, H], q / attention output [n_rows, n_heads * hd], k / v [n_rows, n_kv * hd],
// gate / up [n_rows, I], the 16-bit activation copy cuBLAS reads (2-byte elements,
// n_rows * max(H, I, n_heads * hd)), the gathered logit rows [n_logit_rows, H] and their logits
// [n_logit_rows, vocab].
struct PassScratch {
  int64_t x = 0, q = 0, kv = 0, gate = 0, xh = 0, logit_x = 0, logits = 0;
};
PassScratch scratch_for(const ModelConfig& c, int64_t n_rows, int64_t n_logit_rows);

struct PagedRunnerOptions {
  int device = 0;
  PoolLayout pool;           // n_blocks and block_size: the CPU KvCacheManager's
  int64_t rows_hint = 512;   // scratch is sized for this many rows first and grows as passes need
  // Device bytes for weights, pools and scratch (LoadOptions::vram_budget). 0: every layer
  // resident. Otherwise plan_layer_stream decides: the layers it does not keep resident live in
  // pinned host memory (AWQ ones packed, 4-bit) and are copied on a copy stream into two device
  // slots while the layer before them computes (src/gpu/paged_stream.cpp).
  uint64_t vram_budget = 0;
  // Tensor parallelism (docs/gpu.md "Tensor parallelism on a device"). Local, the default: the
  // whole model. A group of comm.world() > 1: this runner holds rank comm.rank()'s shard as
  // TpShard does on the CPU (tp_plan: its heads' Q/K/V rows and biases, O columns, its slice of
  // gate/up rows and down columns, the o_proj bias on rank 0 only; norms, embeddings and the head
  // whole), K/V pools of its K/V heads only (pool.n_kv_heads = tp_plan(...).config.n_kv_heads),
  // and completes the O and down projections' partial sums with comm.all_reduce_sum: on device
  // pointers when comm is NCCL (the runner then enqueues all its work on the comm's stream, and
  // the comm's device must be `device`; destroy the runner before nccl_destroy), through pinned
  // host memory (device -> host, the shared-memory sum, host -> device) when it is Shm, so that
  // several ranks may share one GPU. Every rank makes the same calls with the same arguments
  // (same tokens, tables, rows); every rank gets the whole logits. write_rows / read_rows /
  // snapshot_rows / block_pieces then move the rank's K/V heads only; forward_blend all-reduces
  // the rows' deviation sums over the ranks' heads, so every rank keeps the same rows. Not with
  // vram_budget (Error).
  dist::Comm comm = dist::Comm::local();
};

// Errors (at create): a tensor-parallel group the model does not split over (tp_plan's errors,
// checked first, in every build); built without CUDA; no device; an architecture or config the device pass
// does not run (gemma3: its sandwich norms, GELU gate, embedding scale and local RoPE base),
// head_dim above 256; weight dtypes other than F32/F16/BF16 and AutoAWQ 4-bit; not enough device
// memory for the weights plus both pools, or for the resident layers, the streaming slots and the
// pools under vram_budget (naming the bytes). Not thread-safe: the engine calls
// it under its lock.
class PagedRunner {
 public:
  static std::unique_ptr<PagedRunner> create(const Model& model, const PagedRunnerOptions& opt);
  ~PagedRunner();
  PagedRunner(const PagedRunner&) = delete;
  PagedRunner& operator=(const PagedRunner&) = delete;

  // As Model::forward_batch over the device pools: every row's K/V into its slot, attention per
  // run over its sequence's table, logits of the requested rows copied to the host.
  void forward_batch(const PagedSeq* seqs, int64_t n_seqs);
  // Copy-on-write of a block: all layers, K and V.
  void copy_block(kv::BlockId src, kv::BlockId dst);
  // Rows [pos0, pos0 + n) of `layer` under `table` from / to host k, v [n, row] f32 (either may
  // be null: that half is left alone).
  void write_rows(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n, const float* k,
                  const float* v);
  void read_rows(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n, float* k, float* v);
  // kv::KvLayout::rotate_keys on the device: the stored keys of rows [pos0, pos0 + n) of `layer`
  // re-rotated by delta positions with the model's RoPE frequencies (cos / sin of delta computed
  // on the host as kernels::rope_shift does).
  void rotate_keys(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n, int64_t delta);
  // Model::forward_blend (CacheBlend's selective recompute) over the device pools: tokens [n] at
  // positions n_past.. of the sequence under `table`, whose reused rows (opt.reused) hold cached
  // K/V; the same rows selected by the same BlendSchedule as the CPU, the last token's logits
  // [vocab] into `logits`. Errors as Model::forward_blend's (no tokens, a ratio outside [0, 1]).
  BlendStats forward_blend(const int32_t* tokens, int64_t n, int64_t n_past, std::span<const kv::BlockId> table,
                           const BlendOptions& opt, float* logits);
  // The K/V of `rows`, [row][layer][K row, V row] (ModelRunner::snapshot_rows' layout).
  std::vector<float> snapshot_rows(std::span<const kv::BlockId> table, std::span<const int64_t> rows);

  // KV spill (src/gpu/paged_spill.cpp; docs/gpu.md "KV spill"): block b's pieces in the device
  // pools, device pointers in PagedKvStorage::block_pieces' order (layer 0 K, layer 0 V, layer
  // 1 K, ...), each one layer's K or V of the block. Error for b outside the pool.
  std::vector<kv::IoPiece> block_pieces(kv::BlockId b);
  // What kv::HostColdStore moves those pieces with: cudaMemcpyAsync (cudaMemcpyDefault: UVA) on
  // the runner's stream, so spills and page-ins stay ordered with the passes and block copies;
  // wait = stream synchronization; host memory pinned (cudaHostAlloc). Valid while the runner is.
  kv::SlotCopy spill_copy();

  const PoolLayout& pool() const;
  size_t device_weight_bytes() const;
  int64_t passes() const;  // forward passes run
  // Layer streaming (PagedRunnerOptions::vram_budget): layers streamed from the host each pass
  // (0: every layer resident), and the layer bytes copied host -> device so far.
  int64_t streamed_layers() const;
  uint64_t bytes_h2d() const;

  struct Impl;

 private:
  explicit PagedRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The device pools as the kv manager's hot tier (kv::KvCacheManager::attach_cold_tier): the
// chain VRAM -> pinned host (kv::HostColdStore over runner.spill_copy()) -> disk
// (kv::FileColdStore). A block is the same bytes on the device as on the host (f32, all layers).
class DeviceHotTier final : public kv::HotTier {
 public:
  explicit DeviceHotTier(PagedRunner& runner) : r_(runner) {}
  int64_t n_blocks() const override { return r_.pool().n_blocks; }
  int64_t block_size() const override { return r_.pool().block_size; }
  size_t block_bytes() const override { return size_t(2 * r_.pool().n_layers * r_.pool().block_floats()) * sizeof(float); }
  std::vector<kv::IoPiece> block_pieces(kv::BlockId b) override { return r_.block_pieces(b); }

 private:
  PagedRunner& r_;
};

}  // namespace kvboost::gpu
