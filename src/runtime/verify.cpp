// Engine::warm and Engine::verify_correctness.
#include <cmath>

#include "engine_impl.h"
#include "request.h"

namespace kvboost {

int64_t Engine::Impl::warm(const std::vector<int32_t>& ids, const std::vector<int64_t>& segment_starts,
                     const std::string& cache_namespace) {
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.ignore_eos = true;
  o.sampling.temperature = 0.0f;
  o.cache_namespace = cache_namespace;
  o.segment_starts = segment_starts;
  o.reuse.mode = ReuseMode::kPrefixOnly;
  o.reuse.pin = true;
  const GenerateResult r = generate_ids(ids, o);
  if (chunks_) chunks_->flush();
  return r.n_cached;
}

std::vector<int32_t> Engine::Impl::encode_segments(const std::vector<std::string>& segments, bool add_special,
                                             std::vector<int64_t>* starts) const {
  std::vector<int32_t> ids;
  starts->clear();
  for (size_t i = 0; i < segments.size(); ++i) {
    if (i > 0 && !ids.empty()) starts->push_back(int64_t(ids.size()));
    const std::vector<int32_t> x = tok_.encode(segments[i], add_special && i == 0);
    ids.insert(ids.end(), x.begin(), x.end());
  }
  // an empty segment would repeat a start (or end at the prompt's end): drop those
  std::vector<int64_t> ok;
  for (int64_t s : *starts)
    if ((ok.empty() || s > ok.back()) && s < int64_t(ids.size())) ok.push_back(s);
  *starts = ok;
  return ids;
}

GenerateResult Engine::Impl::generate_segments(const std::vector<std::string>& segments, const GenerateOptions& opt) {
  GenerateOptions o = opt;
  const std::vector<int32_t> ids = encode_segments(segments, opt.add_special, &o.segment_starts);
  return generate_ids(ids, o);
}

std::vector<Engine::Agreement> Engine::Impl::verify_correctness(const std::vector<std::vector<int32_t>>& prompts,
                                                          const GenerateOptions& reuse_opt, int n_tokens) {
  std::vector<Agreement> out;
  for (const auto& p : prompts) out.push_back(verify_correctness(p, reuse_opt, n_tokens));
  return out;
}

LogitAgreement compare_logits(const float* p, const float* q, int64_t vocab) {
  double dot = 0, np = 0, nq = 0, mp = -INFINITY, mq = -INFINITY;
  int64_t ap = 0, aq = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    dot += double(p[j]) * q[j], np += double(p[j]) * p[j], nq += double(q[j]) * q[j];
    if (p[j] > mp) mp = p[j], ap = j;
    if (q[j] > mq) mq = q[j], aq = j;
  }
  double zp = 0, zq = 0;
  for (int64_t j = 0; j < vocab; ++j) zp += std::exp(double(p[j]) - mp), zq += std::exp(double(q[j]) - mq);
  const double lzp = mp + std::log(zp), lzq = mq + std::log(zq);
  double kl = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    const double lp = double(p[j]) - lzp, lq = double(q[j]) - lzq;
    kl += std::exp(lp) * (lp - lq);
  }
  return LogitAgreement{dot / std::sqrt(np * nq + 1e-300), std::max(0.0, kl), ap == aq};
}

double Engine::Agreement::mean_cosine() const {
  double s = 0;
  for (double v : cosine) s += v;
  return cosine.empty() ? 0 : s / double(cosine.size());
}
double Engine::Agreement::mean_kl() const {
  double s = 0;
  for (double v : kl) s += v;
  return kl.empty() ? 0 : s / double(kl.size());
}
double Engine::Agreement::top1_rate() const {
  double s = 0;
  for (double v : top1) s += v;
  return top1.empty() ? 0 : s / double(top1.size());
}

Engine::Agreement Engine::Impl::verify_correctness(const std::vector<int32_t>& ids, const GenerateOptions& reuse_opt,
                                             int n_tokens) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<std::vector<float>> ref, got;
  GenerateOptions full = reuse_opt;
  full.max_new_tokens = n_tokens;
  full.ignore_eos = true;
  full.sampling = SamplingParams{};
  full.sampling.temperature = 0.0f;
  full.prefix_cache = false;  // no cache at all: a full prefill
  full.reuse = ReusePolicy{};
  full.forced_output.clear();
  full.on_text = nullptr;
  full.on_logits = [&](const float* l, int64_t v) { ref.emplace_back(l, l + v); };
  const GenerateResult fr = generate_ids(ids, full);

  GenerateOptions reuse = reuse_opt;
  reuse.max_new_tokens = n_tokens;
  reuse.ignore_eos = true;
  reuse.forced_output = fr.output_ids;
  reuse.on_text = nullptr;
  reuse.on_logits = [&](const float* l, int64_t v) { got.emplace_back(l, l + v); };
  const GenerateResult rr = generate_ids(ids, reuse);

  Agreement a;
  a.ttft_full_ms = fr.ttft_ms;
  a.ttft_reuse_ms = rr.ttft_ms;
  a.n_reused = rr.n_reused;
  a.n_recomputed = rr.n_recomputed;
  a.guarded = rr.guarded;
  a.n_prompt = int64_t(ids.size());
  for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i) {
    const LogitAgreement g = compare_logits(ref[i].data(), got[i].data(), vocab);
    a.cosine.push_back(g.cosine);
    a.kl.push_back(g.kl);
    a.top1.push_back(g.top1 ? 1.0 : 0.0);
  }
  return a;
}

}  // namespace kvboost
