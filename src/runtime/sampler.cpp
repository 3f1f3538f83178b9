// Sampling with Hugging Face's processors and warpers, in its order: repetition penalty,
// temperature, top-k, top-p, min-p; then a draw from the renormalised distribution.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "kvboost/kernels.h"
#include "kvboost/runtime.h"

namespace kvboost {

void validate_sampling(const SamplingParams& r) {
  const SamplingParams c = resolve_sampling(r);  // (already resolved: a no-op copy)
  const float temperature = *c.temperature, top_p = *c.top_p, min_p = *c.min_p;
  const float repetition_penalty = *c.repetition_penalty;
  const int top_k = *c.top_k;
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    fail("temperature = ", temperature, " is out of range (must be >= 0)");
  if (top_k < 0) fail("top_k = ", top_k, " is out of range (must be >= 0)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p = ", top_p, " is out of range (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p = ", min_p, " is out of range [0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    fail("repetition_penalty = ", repetition_penalty, " is out of range (must be > 0)");
  if (!(c.presence_penalty >= -2.0f && c.presence_penalty <= 2.0f))
    fail("presence_penalty = ", c.presence_penalty, " is out of range [-2, 2]");
  if (!(c.frequency_penalty >= -2.0f && c.frequency_penalty <= 2.0f))
    fail("frequency_penalty = ", c.frequency_penalty, " is out of range [-2, 2]");
  for (const auto& [id, b] : c.logit_bias) {
    if (id < 0) fail("logit_bias: token id ", id, " is negative");
    if (!(b >= -100.0f && b <= 100.0f)) fail("logit_bias[", id, "] = ", b, " is out of range [-100, 100]");
  }
}

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int top_n) {
  if (id < 0 || id >= vocab) fail("token_logprob: id ", id, " is outside the vocabulary of ", vocab);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - double(mx));
  const double lse = double(mx) + std::log(sum);
  TokenLogprob t;
  t.id = id;
  t.logprob = float(double(logits[id]) - lse);
  if (top_n > 0) {
    // Min-heap of the best top_n (worst on top): a better candidate has a larger logit, or the
    // same logit and a smaller id.
    auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::vector<std::pair<float, int32_t>> heap;
    heap.reserve(size_t(top_n) + 1);
    for (int64_t i = 0; i < vocab; ++i) {
      const std::pair<float, int32_t> c{logits[i], int32_t(i)};
      if (heap.size() < size_t(top_n)) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
    std::sort(heap.begin(), heap.end(), better);
    for (const auto& [l, i] : heap) t.top.emplace_back(i, float(double(l) - lse));
  }
  return t;
}

Sampler::Sampler(const SamplingParams& cfg) : cfg_(resolve_sampling(cfg)), rng_(cfg.seed) { validate_sampling(cfg_); }

void Sampler::apply_penalties(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt) {
  // logit_bias first (OpenAI adds it to the raw logits); -inf (a grammar's mask) stays -inf.
  for (const auto& [id, b] : cfg_.logit_bias)
    if (id < vocab && logits[id] != -std::numeric_limits<float>::infinity()) logits[id] += b;
  if ((*cfg_.repetition_penalty) != 1.0f) {
    // HF RepetitionPenaltyLogitsProcessor: each distinct seen id once; divide positive
    // logits, multiply negative ones.
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = logits[id];
      l = l < 0 ? l * (*cfg_.repetition_penalty) : l / (*cfg_.repetition_penalty);
    }
  }
  if ((cfg_.presence_penalty != 0.0f || cfg_.frequency_penalty != 0.0f) && history.size() > n_prompt) {
    // OpenAI / vLLM: over the generated tokens only, additive, after the repetition penalty.
    counts_.clear();
    for (size_t i = n_prompt; i < history.size(); ++i) counts_.emplace_back(history[i], 1);
    std::sort(counts_.begin(), counts_.end());
    for (size_t i = 0; i < counts_.size();) {
      size_t j = i;
      while (j < counts_.size() && counts_[j].first == counts_[i].first) ++j;
      const int32_t id = counts_[i].first;
      if (id >= 0 && id < vocab)
        logits[id] -= cfg_.presence_penalty + cfg_.frequency_penalty * float(j - i);
      i = j;
    }
  }
}

// Temperature, top-k, top-p, min-p over penalized logits: cand_[0 .. keep) with their
// (unnormalized within the kept set) probabilities in p_; returns keep. temperature > 0.
size_t Sampler::truncate_candidates(const float* logits, int64_t vocab) {
  cand_.clear();
  cand_.reserve(size_t(vocab));
  // -inf logits (a grammar's mask) are no candidates at all.
  for (int64_t i = 0; i < vocab; ++i)
    if (logits[i] != -std::numeric_limits<float>::infinity()) cand_.emplace_back(logits[i] / (*cfg_.temperature), int32_t(i));
  if (cand_.empty()) return int32_t(kernels::argmax(logits, vocab));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if ((*cfg_.top_k) > 0 && size_t((*cfg_.top_k)) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + (*cfg_.top_k), cand_.end(), by_logit);
    // HF keeps every token tied with the k-th logit.
    const float kth = cand_[size_t((*cfg_.top_k)) - 1].first;
    n = size_t((*cfg_.top_k));
    std::sort(cand_.begin() + long(n), cand_.end(), by_logit);
    while (n < cand_.size() && cand_[n].first == kth) ++n;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(n);
  // probabilities over the kept candidates
  const float mx = cand_[0].first;
  std::vector<double>& p = p_;
  p.assign(n, 0.0);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp(double(cand_[i].first - mx)));
  for (auto& v : p) v /= sum;
  size_t keep = n;
  if ((*cfg_.top_p) < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (always at least one token).
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += p[i];
      if (acc >= (*cfg_.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if ((*cfg_.min_p) > 0.0f) {
    const double thr = (*cfg_.min_p) * p[0];
    size_t k = 1;
    while (k < keep && p[k] >= thr) ++k;
    keep = k;
  }
  return keep;
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt) {
  apply_penalties(logits, vocab, history, n_prompt);
  if ((*cfg_.temperature) == 0.0f) return int32_t(kernels::argmax(logits, vocab));
  const size_t keep = truncate_candidates(logits, vocab);
  const std::vector<double>& p = p_;
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

void Sampler::distribution(float* logits, int64_t vocab, const std::vector<int32_t>& history, size_t n_prompt,
                           std::vector<std::pair<int32_t, double>>* out) {
  out->clear();
  apply_penalties(logits, vocab, history, n_prompt);
  if ((*cfg_.temperature) == 0.0f) {
    out->emplace_back(int32_t(kernels::argmax(logits, vocab)), 1.0);
    return;
  }
  const size_t keep = truncate_candidates(logits, vocab);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p_[i];
  for (size_t i = 0; i < keep; ++i) out->emplace_back(cand_[i].second, p_[i] / total);
}

double Sampler::uniform() { return double(rng_() >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace kvboost
