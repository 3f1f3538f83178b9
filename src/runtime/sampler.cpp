// Sampling with Hugging Face's processors and warpers, in its order: repetition penalty,
// temperature, top-k, top-p, min-p; then a draw from the renormalised distribution.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "kvboost/kernels.h"
#include "kvboost/runtime.h"

namespace kvboost {

SamplerConfig resolve_sampling(const SamplingParams& p, const GenerationDefaults& d) {
  SamplerConfig c;
  // The model's defaults apply only when it asks for sampling (do_sample); otherwise greedy.
  c.temperature = p.temperature.value_or(d.do_sample ? d.temperature : 0.0f);
  c.top_k = p.top_k.value_or(d.do_sample ? d.top_k : 0);
  c.top_p = p.top_p.value_or(d.do_sample ? d.top_p : 1.0f);
  c.min_p = p.min_p.value_or(0.0f);
  c.repetition_penalty = p.repetition_penalty.value_or(d.repetition_penalty);
  c.seed = p.seed;
  return c;
}

void validate_sampling(const SamplerConfig& c) {
  if (!(c.temperature >= 0.0f) || !std::isfinite(c.temperature))
    fail("temperature = ", c.temperature, " is out of range (must be >= 0)");
  if (c.top_k < 0) fail("top_k = ", c.top_k, " is out of range (must be >= 0)");
  if (!(c.top_p > 0.0f && c.top_p <= 1.0f)) fail("top_p = ", c.top_p, " is out of range (0, 1]");
  if (!(c.min_p >= 0.0f && c.min_p <= 1.0f)) fail("min_p = ", c.min_p, " is out of range [0, 1]");
  if (!(c.repetition_penalty > 0.0f) || !std::isfinite(c.repetition_penalty))
    fail("repetition_penalty = ", c.repetition_penalty, " is out of range (must be > 0)");
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { validate_sampling(cfg); }

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (cfg_.repetition_penalty != 1.0f) {
    // HF RepetitionPenaltyLogitsProcessor: each distinct seen id once; divide positive
    // logits, multiply negative ones.
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = logits[id];
      l = l < 0 ? l * cfg_.repetition_penalty : l / cfg_.repetition_penalty;
    }
  }
  if (cfg_.temperature == 0.0f) return int32_t(kernels::argmax(logits, vocab));

  cand_.clear();
  cand_.reserve(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_.emplace_back(logits[i] / cfg_.temperature, int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + cfg_.top_k, cand_.end(), by_logit);
    // HF keeps every token tied with the k-th logit.
    const float kth = cand_[size_t(cfg_.top_k) - 1].first;
    n = size_t(cfg_.top_k);
    std::sort(cand_.begin() + long(n), cand_.end(), by_logit);
    while (n < cand_.size() && cand_[n].first == kth) ++n;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(n);
  // probabilities over the kept candidates
  const float mx = cand_[0].first;
  std::vector<double> p(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp(double(cand_[i].first - mx)));
  for (auto& v : p) v /= sum;
  size_t keep = n;
  if (cfg_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (always at least one token).
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += p[i];
      if (acc >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (cfg_.min_p > 0.0f) {
    const double thr = cfg_.min_p * p[0];
    size_t k = 1;
    while (k < keep && p[k] >= thr) ++k;
    keep = k;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i];
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace kvboost
