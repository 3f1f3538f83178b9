// kvboost/engine.h — the engine every interface shares: load a model directory once, then
// generate many times (prefill the prompt, decode token by token, sample, stream text), many
// requests at once (continuous batching over paged KV memory). Uses kvboost/model.h,
// kvboost/kv.h, kvboost/reuse.h, kvboost/tokenizer.h, kvboost/grammar.h; kvboost/runtime.h
// includes it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvboost/grammar.h"
#include "kvboost/kv.h"
#include "kvboost/model.h"
#include "kvboost/reuse.h"
#include "kvboost/sampler.h"
#include "kvboost/sampling.h"
#include "kvboost/tokenizer.h"

namespace kvboost {

// Speculative decoding (docs/speculative.md): tokens are drafted cheaply and verified k at a
// time in one forward pass of the model (k + 1 rows of the request in the decode batch).
// Greedy output is the same token for token as without it; sampled output keeps its
// distribution (the rejection rule of Leviathan et al. 2023 / Chen et al. 2023).
enum class SpecMode : uint8_t {
  kOff,
  kLookup,  // prompt lookup: the tokens that followed the latest earlier occurrence of the last
            // n-gram of prompt + output (a point-mass draft distribution)
  kDraft,   // a smaller model sharing the tokenizer (SpecOptions::draft_model), its own paged KV
};
const char* spec_mode_name(SpecMode m);
SpecMode parse_spec_mode(std::string_view s);  // off | lookup | draft; Error naming the value

// Per request (GenerateOptions::speculative); unset fields take EngineOptions::spec's.
struct SpecRequest {
  std::optional<SpecMode> mode;
  std::optional<int> draft_tokens;
  std::optional<int> ngram;
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SpecRequest speculative;             // speculative decoding overrides (EngineOptions::spec)
  SamplingParams sampling;
  std::vector<std::string> stop;       // stop strings; never part of the returned text
  bool add_special = true;             // BOS/EOS per the tokenizer's post-processor
  bool ignore_eos = false;             // keep going past eos_token_id (benchmarks)
  bool keep_special_tokens = false;    // special tokens stay in the text (tool-call markers)
  bool prefix_cache = true;            // reuse cached K/V of the prompt's longest cached prefix
  std::string cache_namespace;         // tenant: caches of different namespaces never mix
  ReusePolicy reuse;                   // chunk-level reuse beyond the exact prefix
  // Segment boundaries (token offsets into the prompt, increasing, each > 0 and < n): chunks
  // never straddle one (system prompt | document 1 | document 2 | question).
  std::vector<int64_t> segment_starts;
  // Teacher forcing (verify_correctness): when not empty, these tokens are output instead of
  // sampled ones, and on_logits sees the logits that preceded each.
  std::vector<int32_t> forced_output;
  std::function<void(const float* logits, int64_t vocab)> on_logits;
  // -1: off. k in [0, 20]: record each generated token's log-probability and its k most likely
  // alternatives in GenerateResult::logprobs, and pass each to on_logprob (before on_text).
  int logprobs = -1;
  std::function<void(const TokenLogprob&)> on_logprob;
  // Constrained decoding (kvboost/grammar.h): when set, every sampled token keeps the output a
  // prefix of the grammar's language (disallowed logits are set to -inf before the penalties,
  // temperature and truncation); EOS only where the grammar may end, and the request stops
  // ("stop") as soon as nothing but the end is possible. Each request has its own matcher.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Called with each piece of final text as it is produced; return false to stop early.
  // With Engine::submit it runs on the thread that calls Engine::step.
  std::function<bool(std::string_view)> on_text;
};

struct GenerateResult {
  std::string text;                    // generated text (prompt excluded, stop string excluded)
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;     // generated ids, the stop/eos id included if sampled
  std::vector<TokenLogprob> logprobs;  // one per output id when GenerateOptions::logprobs >= 0
  std::string finish_reason;           // "stop" (eos or stop string), "length", "cancelled", "error"
  std::string error;                   // finish_reason "error": why
  int64_t n_cached = 0;                // prompt tokens whose K/V came from the exact prefix cache
  int64_t n_reused = 0;                // prompt tokens whose K/V came from any cache (n_cached incl.)
  int64_t n_recomputed = 0;            // reused tokens recomputed anyway (seam repair)
  int64_t n_new = 0;                   // prompt tokens found in no cache
  int64_t n_preempted = 0;             // times the request lost its KV memory and was resumed
  int64_t n_pin_refused = 0;           // chunks a pin (warm) was refused for: over the pin budget
  bool guarded = false;                // ReusePolicy::guard_lead tripped: the approximate K/V were
                                       // recomputed exactly (n_recomputed counts them)
  // Approximate prompts: each repair the guard looked at, in order (ReuseMode::kAuto: the ladder's
  // steps; other modes: the mode, then "recompute" when the guard tripped). The last one stands.
  struct ReuseStep {
    std::string repair;   // "selective" | "cacheblend" | "none" | "prefix" (a lossy store) | "recompute"
    int64_t rows = 0;     // prompt positions this step computed through the last layer
    float lead = 0, limit = 0;  // the first token's lead after the step, the guard's threshold
    bool kept = false;    // the guard let it stand
    // selective: the mean relative squared distance of the repaired rows' cached K/V from the
    // fresh ones (||fresh - cached||² / ||fresh||², K and V, every layer); how much the new
    // context changed the chunks' K/V. NaN where not measured.
    float deviation = NAN;
    // Generated tokens whose leads the guard checked on this step's K/V (guard_tokens); when
    // the step was not kept, the last of them was the close call.
    int64_t checked_tokens = 1;
  };
  std::vector<ReuseStep> reuse_steps;
  float first_lead = 0;                // the first token's top logit minus the runner-up's, as
                                       // the guard saw it (approximate prompts only)
  float guard_lead = 0;                // the threshold the guard compared it with (adaptive)
  bool approximate = false;            // the prompt's K/V were partly approximate: the guard
                                       // looked at it (first_lead, guard_lead are set)
  int64_t n_held_discarded = 0;        // tokens decoded on approximate K/V, held back and discarded
                                       // when a later token's lead tripped the guard (guard_tokens)
  // Speculative decoding: tokens drafted and accepted, and the decode passes (verification
  // passes included) that produced the tokens after the first.
  int64_t spec_drafted = 0, spec_accepted = 0, decode_passes = 0;
  double acceptance_rate() const { return spec_drafted ? double(spec_accepted) / double(spec_drafted) : 0; }
  double tokens_per_pass() const {
    return decode_passes ? double(output_ids.size() > 0 ? output_ids.size() - 1 : 0) / double(decode_passes) : 0;
  }
  double ttft_ms = 0;                  // prompt in -> first token sampled
  double prefill_ms = 0;
  double decode_ms = 0;                // after the first token
  double total_ms = 0;
  double queue_ms = 0;                 // submitted -> admitted
  int64_t n_remote_chunks = 0;         // chunks fetched from the remote tier (--chunk-remote)
  double remote_ms = 0;                // time spent on that lookup (part of ttft_ms)
  int n_prompt() const { return int(prompt_ids.size()); }
  double reuse_ratio() const { return prompt_ids.empty() ? 0 : double(n_reused - n_recomputed) / double(prompt_ids.size()); }
  // prompt tokens computed (cached ones excluded) per second of prefill
  double prefill_tok_per_s() const { return prefill_ms > 0 ? double(prompt_ids.size() - size_t(n_cached)) * 1000.0 / prefill_ms : 0; }
  double decode_tok_per_s() const {
    return decode_ms > 0 && output_ids.size() > 1 ? (output_ids.size() - 1) * 1000.0 / decode_ms : 0;
  }
};

struct SpecOptions {
  SpecMode mode = SpecMode::kLookup;
  std::string draft_model;     // kDraft: the draft model's directory (loaded with the engine)
  int draft_tokens = 8;        // most tokens drafted per step (the adaptive length's ceiling)
  int lookup_ngram = 3;        // kLookup: longest n-gram matched (shorter ones down to 1 after)
  bool adaptive = true;        // draft length from the running acceptance rate
  // Sampled requests (temperature > 0) speculate only when this is set or the request names a
  // mode itself: their draws then depend on the draft length (which adapts to measured timings),
  // so a seed would no longer reproduce them. Greedy output is the same either way.
  bool sampled = false;
  // Continuous batching: no speculation in a step with more decoding requests than this (a
  // batch that large is no longer bandwidth-bound; docs/speculative.md has the measurement).
  int64_t max_batch = 4;
};

struct EngineOptions {
  LoadOptions load;
  SpecOptions spec;
  // Tensor parallelism (docs/gpu.md "Tensor parallelism under the engine"): tp ranks, each
  // holding its shard of the model (its attention heads and K/V heads, its slice of the MLP;
  // Megatron's split, TpShard) and the K/V of its heads, joined by all-reduces after the O and
  // down projections. On the CPU the ranks are threads of this process over shared-memory
  // collectives (the weights are then not packed); with a CUDA device, rank r runs on device
  // load.device.index + r over NCCL. The scheduler, prefix cache, chunk reuse (chunks are stored
  // whole) and batching are unchanged. 1: off. Errors: heads that do not split over tp, an
  // architecture other than llama / mistral / qwen2 / qwen3, and tp with layer streaming
  // (weight_budget, vram_budget) or a cold tier (cold_dir).
  int tp = 1;
  // Paged KV memory: blocks of block_size tokens, as many as fit in kv_budget_bytes (K and V,
  // all layers, f32). 0 = enough for the model's whole context, capped at 2 GiB. Memory is
  // reserved, not committed: untouched blocks cost nothing.
  int64_t block_size = kv::kDefaultBlockSize;
  size_t kv_budget_bytes = 0;
  // Keep the KV memory of this many tokens beyond the blocks used so far committed, in idle
  // time (Engine::idle_work; `kvboost serve` calls it): a fresh block's first write otherwise
  // faults its pages in one by one, which cost a third of a re-ordered RAG prompt's time to first
  // token (copy-ins of ~1,900 tokens on Gemma 3 270M). 0: off (memory committed only on use).
  int64_t kv_prefault_tokens = 8192;
  // Cold tier: when set, KV blocks that do not fit in kv_budget_bytes spill to a file under this
  // directory and are paged back, range by range, when attention needs them; a generation may
  // then outgrow the hot budget (its prompt must still fit). Steps then run one sequence at a time.
  // On a CUDA device the chain is device pool -> pinned host memory (cold_host_bytes) -> this
  // directory, and a pass needs each of its sequences' whole tables in the device pool: requests
  // run together while their tables fit and take turns when they do not (docs/gpu.md "KV spill").
  std::string cold_dir;
  // A CUDA device with cold_dir: pinned host memory for spilled blocks in front of the files
  // (allocated at the first spill; 0: straight to the files through a staging buffer). Unused on
  // the CPU, whose hot tier is host memory already.
  size_t cold_host_bytes = size_t(1) << 30;
  // Continuous batching: at most max_batch requests run at once; a step prefills at most
  // prefill_chunk prompt tokens (long prompts take several steps, so running decodes keep going).
  int64_t max_batch = 16;
  int64_t prefill_chunk = 512;
  // Chunk-level reuse (GenerateOptions::reuse): prompts are cut into chunks of chunk_size tokens
  // (within segments); computed chunks go to the chunk store. ram_bytes = 0 turns the store off.
  // model_id is filled from the model when empty.
  int64_t chunk_size = 128;
  // A cut may move up to this many tokens to a natural break (after a newline or a sentence's
  // end), so that chunks hold whole lines/sentences. 0 = fixed-size chunks.
  int64_t chunk_window = 16;
  kv::ChunkStoreOptions chunk_store;
  // One chunk store several engines use (same K/V shape), instead of a store of their own
  // (chunk_store's size and disk options are then the shared store's). Keys carry each
  // engine's model_id(), so entries of different models never mix.
  std::shared_ptr<kv::ChunkStore> shared_chunk_store;
  // The adaptive guard's calibration file (Engine::guard_file); empty: beside the chunk store's
  // disk tier when there is one.
  std::string guard_file;
};


// A request in flight (continuous batching). Engine::submit creates it; Engine::step advances it.
// done(), result() and cancel() may be called from any thread.
class Request {
 public:
  bool done() const;
  // The result so far (text, ids, timings); complete once done().
  GenerateResult result() const;
  // Asks the engine to stop it at the next step (finish_reason "cancelled"; its KV is freed).
  void cancel();
  struct State;  // src/runtime/request.h (opaque here)
  explicit Request(std::unique_ptr<State> s);
  ~Request();
  State& state() const { return *st_; }

 private:
  std::unique_ptr<State> st_;
};

struct StepStats {
  int64_t n_running = 0, n_waiting = 0;   // after the step
  int64_t n_decode = 0, n_prefill_tokens = 0;  // work done in the step
  int64_t n_drafted = 0;                  // draft tokens verified in the step (speculation)
  double forward_ms = 0;                  // of which in the model's forward passes (wall clock)
};

class Engine {
 public:
  // Loads DIR (config, weights, tokenizer). A directory with tokenizer files only is not enough.
  static std::unique_ptr<Engine> load(const std::string& dir, const EngineOptions& opt = {});
  ~Engine();

  const Model& model() const;
  const Tokenizer& tokenizer() const;
  const EngineOptions& options() const;
  // Context length: max_position_embeddings.
  int64_t context_length() const;

  // Blocking generation (submit, then step until done). Each request reuses the K/V of the
  // longest cached prefix of its prompt and leaves its own full blocks cached for later
  // requests. Safe to call from several threads: their steps interleave into shared batches.
  // Bad input (empty prompt, too long, bad sampling values) throws Error.
  GenerateResult generate(std::string_view prompt, const GenerateOptions& opt);
  GenerateResult generate_ids(const std::vector<int32_t>& prompt_ids, const GenerateOptions& opt);
  // RAG form: segments (system prompt, documents, question) tokenized one by one and joined,
  // each chunked on its own (sets opt.segment_starts). Special tokens only before the first.
  GenerateResult generate_segments(const std::vector<std::string>& segments, const GenerateOptions& opt);
  std::vector<int32_t> encode_segments(const std::vector<std::string>& segments, bool add_special,
                                       std::vector<int64_t>* segment_starts) const;

  // Continuous batching: validates (throws Error on bad input) and queues the request.
  std::shared_ptr<Request> submit(std::vector<int32_t> prompt_ids, GenerateOptions opt);
  // One iteration over every live request: finish cancelled ones, admit waiting ones while KV
  // memory and max_batch allow, then one forward pass: a decode token for every decoding request
  // and up to prefill_chunk prompt tokens of prefilling ones. KV exhaustion preempts the newest
  // request (its KV is freed; it resumes later by recomputing, mostly from the prefix cache).
  StepStats step();
  bool has_work() const;  // any request waiting or running
  // Work for an idle engine (call it from the thread that calls step(), when has_work() is
  // false): commits the KV memory the next requests will write (EngineOptions::
  // kv_prefault_tokens), one bounded slice per call. True when it did something, so the caller
  // may call again; false when there is nothing left to do.
  bool idle_work();

  kv::KvStats kv_stats() const;
  int64_t kv_block_size() const;
  // Forward passes the CUDA device runner has run since load (0 on the CPU backend): lets a
  // caller (and the device tests) check that work ran on the device.
  int64_t device_passes() const;
  // Speculative decoding totals since load (for metrics).
  struct SpecStats {
    int64_t drafted = 0, accepted = 0, passes = 0, tokens = 0;  // passes: verification passes
  };
  SpecStats spec_stats() const;
  bool has_draft_model() const;
  // The model identity chunk keys are derived from (kvb1-<32 hex>, model_identity in
  // kvboost/model.h, or EngineOptions::chunk_store.model_id when that was set): the key prefix
  // for any tier that stores this engine's K/V.
  const std::string& model_id() const;
  // The chunk store (nullptr when disabled).
  kv::ChunkStore* chunk_store() const;

  // The adaptive guard's calibration (per repair mode: the last kGuardWindow lead errors, prompts
  // checked and tripped). guard_observe adds one error sample (e.g. from a benchmark that ran
  // the full prefill beside the reuse: `kvboost bench reuse --calibrate`).
  using GuardCalibration = kvboost::GuardCalibration;  // kvboost/reuse.h
  GuardCalibration guard_calibration() const;
  void guard_observe(ReuseMode mode, float error);
  // Persistence beside the chunk store (guard_file.cpp): a text file keyed by model_id(). save
  // writes to a temporary name and renames. load throws Error naming the file and the line for a
  // corrupt, truncated or other model's file, and leaves the calibration as it was.
  void save_guard_calibration(const std::string& path) const;
  void load_guard_calibration(const std::string& path);
  // Where this engine keeps it: EngineOptions::guard_file, else DIR/guard-<model_id>.txt beside
  // the chunk store's disk tier (--chunk-store DIR), else "" (not persisted). Loaded at
  // Engine::load (a bad file: a warning on stderr, ignored), saved after each learned sample.
  const std::string& guard_file() const;

  // Computes and stores the chunks of a prompt (or of segments) ahead of time, pinned in RAM.
  // Returns the number of prompt tokens that were already cached.
  int64_t warm(const std::vector<int32_t>& ids, const std::vector<int64_t>& segment_starts = {},
               const std::string& cache_namespace = "");

  // Runs each prompt with and without reuse (teacher-forced on the full prefill's greedy output
  // for n_tokens steps) and compares the logits per position.
  struct Agreement {
    std::vector<double> cosine, kl, top1;  // per generated position: cosine, KL(full || reuse), 0/1
    double mean_cosine() const, mean_kl() const, top1_rate() const;
    double ttft_full_ms = 0, ttft_reuse_ms = 0;
    int64_t n_reused = 0, n_recomputed = 0, n_prompt = 0;
    bool guarded = false;  // the reuse run's guard recomputed the prompt (ReusePolicy::guard_lead)
  };
  Agreement verify_correctness(const std::vector<int32_t>& ids, const GenerateOptions& reuse_opt, int n_tokens = 8);
  std::vector<Agreement> verify_correctness(const std::vector<std::vector<int32_t>>& prompts,
                                            const GenerateOptions& reuse_opt, int n_tokens = 8);

 // The engine's state and its step (src/runtime/engine_impl.h): an opaque handle here.
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvboost
