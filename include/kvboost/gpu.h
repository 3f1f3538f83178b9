// kvboost/gpu.h — the optional CUDA backend: a GPU decoder for the Llama family (llama, mistral,
// qwen2, qwen3) with its weights either all resident on the device or streamed layer by layer
// from pinned host memory through a few device slots (models larger than the device's weight
// budget). Uses kvboost/model.h.
//
// The API exists in every build. A build without -DKVBOOST_CUDA=ON answers every call that needs
// the device with Error "built without CUDA (-DKVBOOST_CUDA=ON)"; built_with_cuda() and
// device_count() never throw, so callers test for a device without any #ifdef.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

}  // namespace kvboost::gpu
