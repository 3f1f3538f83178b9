// kvboost/runtime.h — the runtime module's umbrella header: kvboost/engine.h (Engine,
// GenerateOptions, GenerateResult, Request), kvboost/sampler.h (Sampler, logprobs, stop
// strings), kvboost/sampling.h (SamplingParams); and, declared here, chunk-level reuse's
// policy and the adaptive guard's statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvboost {

// How a prompt reuses cached K/V beyond its exact cached prefix (chunk-level reuse).
enum class ReuseMode {
  kPrefixOnly,  // exact prefix hits only (paged block cache, chunk store prefix keys)
  kNone,        // chunks found at other positions are reused as they are (re-positioned keys)
  kSelective,   // ... and the first repair_tokens tokens of each reused run are recomputed (EPIC)
  kCacheBlend,  // ... and the most deviated blend_ratio of reused tokens is recomputed (CacheBlend)
  // The default: exact prefix first; for chunks found at other positions a ladder of repairs,
  // each step kept only when the guard's per-mode error model allows it: selective (or
  // cacheblend first, when the learned trip rates make selective the costlier start), then
  // cacheblend over the rows selective left as they were, then an exact recompute of only the
  // approximate span [first approximate token, n). Each step reuses the K/V the previous one
  // left (docs/chunk-reuse.md, "auto").
  kAuto,
};
const char* reuse_mode_name(ReuseMode m);
ReuseMode parse_reuse_mode(std::string_view s);  // auto | prefix | none | selective | cacheblend

struct ReusePolicy {
  ReuseMode mode = ReuseMode::kAuto;
  int64_t repair_tokens = 16;   // selective: tokens recomputed at the start of each reused run
  int64_t overlap_tokens = 0;   // selective: also recompute this many tokens before the run
  int64_t sink_tokens = 0;      // tokens at the start of the prompt that are always computed
  float blend_ratio = 0.15f;    // cacheblend: fraction of reused tokens recomputed
  int64_t blend_check_layer = 1;
  // cacheblend: the first this many tokens of each reused run are recomputed first, out of the
  // same budget (blend_ratio of the reused tokens); the deviation picks the rest. A run's first
  // tokens are where its K/V missed the most context (EPIC); 0: deviation alone (CacheBlend).
  int64_t blend_run_starts = 0;
  // cacheblend gradual filtering: select this fraction at the check layer, then narrow to
  // blend_ratio over the next blend_taper_layers layers, each ranking the survivors by its own
  // K/V deviation. <= blend_ratio: one selection at the check layer. Reused tokens whose K/V
  // drift only in later layers are invisible at the check layer; a wider first selection lets
  // the next layer find them (measured: docs/chunk-reuse.md).
  float blend_first_ratio = 0.5f;
  int64_t blend_taper_layers = 1;
  // Guard (none, selective, cacheblend): when the prompt's K/V were partly approximate (chunks
  // computed in another context, or read back from a quantized store) and the first token's top
  // logit leads the runner-up by less than a threshold, the approximate part is recomputed
  // exactly before that token is sampled: a near-tie the approximation could flip gets the full
  // prefill's answer (and K/V), at the cost of that prefill. The first tokens a repair changed
  // were close calls as the reuse saw them, which is why a lead threshold catches them.
  // guard_lead: the threshold until the guard has learned one (below), or always with
  // guard_risk 0; 0: off. The starting value is chosen for a model whose reuse errs by tenths
  // of a logit, so that the first prompts, before any error has been observed, are safe;
  // `kvboost bench reuse --guard-lead 0` estimates the curve for a model (docs/chunk-reuse.md).
  float guard_lead = 0.3f;
  // Adaptive guard: every prompt the guard recomputed shows how far the approximate lead of its
  // top two tokens was from the full prefill's (the error). Where that error hardly depends on
  // the lead (as measured on Gemma 3 270M, docs/chunk-reuse.md), the close calls the guard
  // recomputes stand for the prompts that pass.
  // Once the engine has seen kGuardMinErrors errors for a repair mode, the threshold is the
  // lead that an error drawn like them exceeds with probability guard_risk (guard_threshold):
  // a prompt passes only if its first token changes with at most that chance. A model whose
  // reuse errs by hundredths of a logit, or only ever shrinks leads, stops paying for near-ties
  // after a few prompts; one that errs by tenths either way recomputes more.
  // 0: the fixed guard_lead.
  float guard_risk = 0.05f;
  bool store = true;            // store computed chunks and blocks for later requests (false:
                                // the request leaves no trace in any cache)
  bool pin = false;             // stored chunks stay in RAM (Engine::warm)
  std::string pin_owner;        // whose pin budget they count against (the server's tenant)
  // Multi-token guard (src/runtime/guard_tokens.cpp): the guard checks the lead of each of the
  // first guard_tokens generated tokens while the prompt's K/V are approximate, not only the
  // first one's. The tokens are decoded on the approximate K/V with their text, logprobs and
  // logits held back from the caller; when one of them is a close call the request escalates as
  // at the first token (the ladder's next rung, else the exact recompute of the approximate
  // span), the held tokens are discarded and decoding starts again on the new K/V. Nothing the
  // caller has seen is ever taken back; the holding counts in ttft_ms (the first token's text
  // reaches the caller when the K tokens have passed). A model that writes a number as a space
  // token then digits decides the answer at the second token, which a first-token guard never
  // sees (docs/measurements/2026-12-01-reuse-quality.md). 1: the first token only.
  int guard_tokens = 1;
};

// The adaptive guard's threshold (ReusePolicy::guard_risk): the lead L that the error of a new
// prompt exceeds with probability `risk` (its first token can change only if the error of its
// top-two lead, approximate minus the full prefill's lead of the same two tokens, exceeds its
// lead). The errors are taken as draws from a normal distribution of unknown mean and spread:
// a new one then follows Student's t with n-1 degrees of freedom around their median, scaled
// by their standard deviation (about the median) times sqrt(1 + 1/n), the prediction interval,
// so a few samples give a wide threshold and a long run a tight one. A model whose reuse only
// shrinks leads (errors consistently negative) gets 0. Returns `fallback` with fewer than
// kGuardMinErrors errors; clamped to [0, kGuardMaxLead].
inline constexpr size_t kGuardMinErrors = 4;
inline constexpr float kGuardMaxLead = 4.0f;
inline constexpr size_t kGuardWindow = 64;  // errors remembered per repair mode
float guard_threshold(std::span<const float> errors, float risk, float fallback);
// The p-quantile of Student's t distribution with nu > 0 degrees of freedom (0 < p < 1).
double student_t_quantile(double p, double nu);

}  // namespace kvboost

// (After the declarations above: engine.h uses ReusePolicy.)
#include "kvboost/engine.h"
#include "kvboost/sampler.h"
#include "kvboost/sampling.h"
