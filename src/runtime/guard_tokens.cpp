// The multi-token guard (ReusePolicy::guard_tokens): the first K generated tokens of a prompt
// with approximate K/V are decoded with everything the caller would see of them held back
// (GuardHold, guard_tokens.h), and each one's lead is checked against the threshold the first
// token was held to. All K pass (or the request ends first): the held callbacks run in order and
// the request goes on. One fails: the held tokens are discarded (the output state goes back to
// before the first token, the sequence's K/V back to the prompt), and the request escalates as a
// close call at the first token does (Engine::Impl::guard_next_rung): the ladder's next rung, or the
// exact recompute of the approximate span; decoding then starts again on those K/V.
//
// Why: Gemma 3 writes a number as a space token and then digits, so the first token of a numeric
// answer is " " with a wide lead and the answer is decided at the second token, which a
// first-token guard never sees (docs/measurements/2026-12-01-reuse-quality.md, section 2).
#include "guard_tokens.h"

#include <cmath>

#include "engine_impl.h"
#include "request.h"

namespace kvboost {

namespace {
float lead_of(const float* logits, int64_t vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    if (x > a) b = a, a = x;
    else if (x > b) b = x;
  }
  return a - b;
}
}  // namespace

void hold_begin(Request::State& r, int64_t k, float limit) {
  GuardHold& h = r.hold;
  h.active = true;
  h.k = k;
  h.n_checked = 1;  // the first token's lead passed (guard_trips)
  h.limit = limit;
  h.held.clear();
  h.sampler.emplace(r.sampler);
  h.dec.emplace(r.dec);
  h.stop.emplace(r.stop);
  h.forced_next = r.forced_next;
}

// Back to the output state before the first token; the held tokens are gone.
void hold_restore(Request::State& r) {
  GuardHold& h = r.hold;
  if (!h.active) return;
  r.sampler = *h.sampler;
  r.dec = *h.dec;
  r.stop = *h.stop;
  r.forced_next = h.forced_next;
  if (r.matcher) r.matcher.emplace(r.opt.grammar);  // (no token was output before the hold)
  r.history.resize(r.context.size());
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.n_held_discarded += int64_t(r.res.output_ids.size());
    r.res.output_ids.clear();
    r.res.logprobs.clear();
    r.res.text.clear();
    r.res.ttft_ms = r.res.prefill_ms = 0;
  }
  h = GuardHold{};
}

// The held tokens passed: their callbacks run in order, and the first token's text reaches the
// caller now, so ttft_ms is taken here (the holding counts). Returns false when on_text asked to
// stop.
bool hold_release(Request::State& r) {
  GuardHold& h = r.hold;
  std::vector<GuardHold::Token> held = std::move(h.held);
  h = GuardHold{};
  r.approx = false;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.t_first = now_ms();
    r.res.ttft_ms = r.t_first - r.t_submit;
    r.res.prefill_ms = r.t_first - r.t_admit;
  }
  for (const GuardHold::Token& t : held) {
    if (r.opt.on_logits && !t.logits.empty()) r.opt.on_logits(t.logits.data(), int64_t(t.logits.size()));
    if (r.opt.on_logprob && t.lp) r.opt.on_logprob(*t.lp);
    if (r.opt.on_text && !t.text.empty() && !r.opt.on_text(t.text)) return false;
  }
  return true;
}

// A decode token's logits are in r.logits while the request holds: true when its lead is under
// the threshold and the request escalated (it is back in its prefill; nothing of the held tokens
// remains).
bool Engine::Impl::guard_hold_trips(Request::State& r) {
  GuardHold& h = r.hold;
  if (!h.active) return false;
  const float lead = lead_of(r.logits.data(), model_->config().vocab_size);
  const bool trip = lead < h.limit;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.res.reuse_steps.empty()) {
      auto& st = r.res.reuse_steps.back();
      st.checked_tokens = h.n_checked + 1;
      if (trip) st.kept = false;
    }
  }
  if (!trip) {
    ++h.n_checked;
    return false;
  }
  guard_.record_late_trip(r.rung);
  hold_restore(r);
  kv_->truncate(r.seq, int64_t(r.context.size()));  // the held tokens' K/V slots
  r.phase = Request::State::Phase::kPrefill;
  guard_escalate(r, guard_next_rung(r, r.rung));
  return true;
}

}  // namespace kvboost
