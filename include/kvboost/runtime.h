// kvboost/runtime.h — the engine every interface shares: load a model directory once, then
// generate many times (prefill the prompt, decode token by token, sample, stream text).
// Uses kvboost/model.h and kvboost/tokenizer.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kvboost/kv.h"
#include "kvboost/model.h"
#include "kvboost/tokenizer.h"

namespace kvboost {

// Sampling, in Hugging Face's order: repetition penalty, temperature, top-k, top-p, min-p.
// temperature == 0 means greedy. Unset fields take the model's generation_config.json values.
struct SamplingParams {
  std::optional<float> temperature;
  std::optional<int> top_k;          // 0 = off
  std::optional<float> top_p;        // 1 = off
  std::optional<float> min_p;        // 0 = off
  std::optional<float> repetition_penalty;  // 1 = off
  uint64_t seed = 0;                 // same seed, same prompt, same options: same output
};

// Fully resolved sampling settings (what the sampler runs with).
struct SamplerConfig {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
};
SamplerConfig resolve_sampling(const SamplingParams& p, const GenerationDefaults& d);
// Throws Error naming the parameter when a value is out of range.
void validate_sampling(const SamplerConfig& c);

// Picks the next token from one row of logits. Stateful only through its RNG.
class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // logits: [vocab], modified in place. history: ids the repetition penalty applies to.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;       // stop strings; never part of the returned text
  bool add_special = true;             // BOS/EOS per the tokenizer's post-processor
  bool ignore_eos = false;             // keep going past eos_token_id (benchmarks)
  bool prefix_cache = true;            // reuse cached K/V of the prompt's longest cached prefix
  std::string cache_namespace;         // tenant: caches of different namespaces never mix
  // Called with each piece of final text as it is produced; return false to stop early.
  std::function<bool(std::string_view)> on_text;
};

struct GenerateResult {
  std::string text;                    // generated text (prompt excluded, stop string excluded)
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;     // generated ids, the stop/eos id included if sampled
  std::string finish_reason;           // "stop" (eos or stop string), "length", "cancelled"
  int64_t n_cached = 0;                // prompt tokens whose K/V came from the prefix cache
  double ttft_ms = 0;                  // prompt in -> first token sampled
  double prefill_ms = 0;
  double decode_ms = 0;                // after the first token
  int n_prompt() const { return int(prompt_ids.size()); }
  // prompt tokens computed (cached ones excluded) per second of prefill
  double prefill_tok_per_s() const { return prefill_ms > 0 ? double(prompt_ids.size() - size_t(n_cached)) * 1000.0 / prefill_ms : 0; }
  double decode_tok_per_s() const {
    return decode_ms > 0 && output_ids.size() > 1 ? (output_ids.size() - 1) * 1000.0 / decode_ms : 0;
  }
};

struct EngineOptions {
  LoadOptions load;
  // Paged KV memory: blocks of block_size tokens, as many as fit in kv_budget_bytes (K and V,
  // all layers, f32). 0 = enough for the model's whole context, capped at 2 GiB. Memory is
  // reserved, not committed: untouched blocks cost nothing.
  int64_t block_size = kv::kDefaultBlockSize;
  size_t kv_budget_bytes = 0;
  // Cold tier: when set, KV blocks that do not fit in kv_budget_bytes spill to a file under this
  // directory and are paged back, range by range, when attention needs them; a generation may
  // then outgrow the hot budget (its prompt must still fit).
  std::string cold_dir;
};

class Engine {
 public:
  // Loads DIR (config, weights, tokenizer). A directory with tokenizer files only is not enough.
  static std::unique_ptr<Engine> load(const std::string& dir, const EngineOptions& opt = {});
  ~Engine();

  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return tok_; }
  // Context length: max_position_embeddings.
  int64_t context_length() const;

  // Requests run one at a time (a mutex serialises them); each reuses the K/V of the longest
  // cached prefix of its prompt, and leaves its own full blocks cached for later requests.
  GenerateResult generate(std::string_view prompt, const GenerateOptions& opt);
  GenerateResult generate_ids(const std::vector<int32_t>& prompt_ids, const GenerateOptions& opt);

  kv::KvStats kv_stats() const;
  int64_t kv_block_size() const { return block_size_; }

 private:
  Engine(std::unique_ptr<Model> m, Tokenizer t, const EngineOptions& opt);
  GenerateResult run(const std::vector<int32_t>& ids, const GenerateOptions& opt, kv::SeqId seq);
  std::unique_ptr<Model> model_;
  Tokenizer tok_;
  int64_t block_size_;
  mutable std::mutex mu_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<kv::PagedKvStorage> store_;
  std::unique_ptr<kv::FileColdStore> cold_;
  std::vector<float*> k_pools_, v_pools_;
  kv::SeqId next_seq_ = 1;
};

// Stop-string matching over streamed text: text is released only once it cannot be the start
// of a stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Adds text; returns the part that is now safe to emit. Sets stopped() when a stop string
  // appears (the text before it is returned, the rest dropped).
  std::string push(std::string_view text);
  std::string flush();  // at the end: everything held back
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kvboost
