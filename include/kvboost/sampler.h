// kvboost/sampler.h — the output stage's parts, usable on their own: the sampler (Hugging
// Face's processors and warpers), token log-probabilities, stop-string matching over streamed
// text, and the agreement of two rows of logits. The engine's output stage
// (src/runtime/output.cpp) runs them per generated token. Settings: kvboost/sampling.h.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvboost/sampling.h"

namespace kvboost {

// Throws Error naming the parameter when a value of resolved settings is out of range.
void validate_sampling(const SamplingParams& resolved);

// Picks the next token from one row of logits. Stateful only through its RNG.
class Sampler {
 public:
  // cfg: unset fields take their neutral values (resolve_sampling with no model defaults).
  explicit Sampler(const SamplingParams& cfg);
  // logits: [vocab], modified in place. history: ids the repetition penalty applies to (prompt
  // and output); history[n_prompt..] are the generated ids the presence/frequency penalties count.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt = 0);
  // The distribution sample() draws from, as (id, probability) pairs summing to 1, most likely
  // first (greedy: the argmax with probability 1); logits modified in place as by sample().
  // Speculative decoding's acceptance rule compares these (src/runtime/speculative.cpp).
  void distribution(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt,
                    std::vector<std::pair<int32_t, double>>* out);
  double uniform();  // a draw from [0, 1) of this sampler's RNG
  const SamplingParams& config() const { return cfg_; }  // resolved: every field set

 private:
  void apply_penalties(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt);
  size_t truncate_candidates(const float* logits, int64_t vocab);
  SamplingParams cfg_;  // resolved
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> p_;
  std::vector<std::pair<int32_t, int32_t>> counts_;  // (id, count) scratch for the penalties
};

// A generated token's log-probability under the model: log-softmax of the raw logits (before
// penalties, temperature and truncation, as OpenAI and vLLM report them), with the most likely
// alternatives at that step.
struct TokenLogprob {
  int32_t id = 0;
  int32_t prev = -1;  // the id before it (the prompt's last or the previous output; -1: none):
                      // its text in context keeps a SentencePiece leading space
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};
// The TokenLogprob of `id` over one row of logits, with the top_n most likely tokens (ties: lower
// id first). Sums in double; one pass over the row plus a heap of top_n.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int top_n);

// Agreement of one row of logits with a reference row: cosine, KL(softmax(ref) || softmax(got))
// and whether the argmax agrees (quality of reuse vs a full prefill).
struct LogitAgreement {
  double cosine = 0, kl = 0;
  bool top1 = false;
};
LogitAgreement compare_logits(const float* ref, const float* got, int64_t vocab);

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
