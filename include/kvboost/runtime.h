// kvboost/runtime.h — the engine every interface shares: load a model directory once, then
// generate many times (prefill the prompt, decode token by token, sample, stream text).
// Uses kvboost/model.h and kvboost/tokenizer.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

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
  // Called with each piece of final text as it is produced; return false to stop early.
  std::function<bool(std::string_view)> on_text;
};

struct GenerateResult {
  std::string text;                    // generated text (prompt excluded, stop string excluded)
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;     // generated ids, the stop/eos id included if sampled
  std::string finish_reason;           // "stop" (eos or stop string), "length", "cancelled"
  double ttft_ms = 0;                  // prompt in -> first token sampled
  double prefill_ms = 0;
  double decode_ms = 0;                // after the first token
  int n_prompt() const { return int(prompt_ids.size()); }
  double prefill_tok_per_s() const { return prefill_ms > 0 ? prompt_ids.size() * 1000.0 / prefill_ms : 0; }
  double decode_tok_per_s() const {
    return decode_ms > 0 && output_ids.size() > 1 ? (output_ids.size() - 1) * 1000.0 / decode_ms : 0;
  }
};

class Engine {
 public:
  // Loads DIR (config, weights, tokenizer). A directory with tokenizer files only is not enough.
  static std::unique_ptr<Engine> load(const std::string& dir, const LoadOptions& opt = {});

  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return tok_; }
  // Context length: max_position_embeddings.
  int64_t context_length() const;

  GenerateResult generate(std::string_view prompt, const GenerateOptions& opt) const;
  GenerateResult generate_ids(const std::vector<int32_t>& prompt_ids, const GenerateOptions& opt) const;

 private:
  Engine(std::unique_ptr<Model> m, Tokenizer t);
  std::unique_ptr<Model> model_;
  Tokenizer tok_;
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
