// kvboost/sampling.h — the sampling settings: one struct for a model's generation_config.json
// defaults (ModelConfig::generation), a request's settings (GenerateOptions::sampling, the
// server's JSON fields, the CLI's flags) and what the sampler runs with once resolved.
// Header-only data (no module below it is needed); the sampler itself is kvboost/sampler.h.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace kvboost {

// Sampling, in Hugging Face's order: repetition penalty, temperature, top-k, top-p, min-p.
// temperature == 0 means greedy. An unset field takes the model's generation_config.json value
// (resolve_sampling), and where the model sets none either, the neutral value in brackets.
struct SamplingParams {
  // generation_config.json's do_sample: the model's temperature/top-k/top-p apply only when it
  // is true; otherwise decoding is greedy unless the request sets a temperature. [false]
  std::optional<bool> do_sample;
  std::optional<float> temperature;         // [do_sample ? 1 : 0]
  std::optional<int> top_k;                 // 0 = off [0]
  std::optional<float> top_p;               // 1 = off [1]
  std::optional<float> min_p;               // 0 = off [0]; never taken from the model
  std::optional<float> repetition_penalty;  // 1 = off [1]
  // OpenAI's penalties over the tokens generated so far (not the prompt), in [-2, 2]:
  // logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]. 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;                 // same seed, same prompt, same options: same output
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logits before sampling
  // (after a grammar's mask: a masked token stays masked).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// The request's settings over the model's defaults: every optional field set. The model's
// temperature, top-k and top-p apply only when it samples (do_sample); its repetition penalty
// always. The sampler (Sampler) runs with the result.
inline SamplingParams resolve_sampling(const SamplingParams& p, const SamplingParams& model = {}) {
  SamplingParams c = p;
  const bool sample = p.do_sample.value_or(model.do_sample.value_or(false));
  c.do_sample = sample;
  c.temperature = p.temperature.value_or(sample ? model.temperature.value_or(1.0f) : 0.0f);
  c.top_k = p.top_k.value_or(sample ? model.top_k.value_or(0) : 0);
  c.top_p = p.top_p.value_or(sample ? model.top_p.value_or(1.0f) : 1.0f);
  c.min_p = p.min_p.value_or(0.0f);
  c.repetition_penalty = p.repetition_penalty.value_or(model.repetition_penalty.value_or(1.0f));
  return c;
}

}  // namespace kvboost
