// The output stage (output.h) and the engine's bookkeeping around it.
#include "output.h"

#include "engine_impl.h"

#include <algorithm>

namespace kvboost {

TokenOutcome OutputProcessor::process(Request::State& r, float* logits, int32_t chosen) const {
  TokenOutcome o;
  // The multi-token guard holds what the caller would see until the token is final (guard_tokens.cpp).
  GuardHold::Token* held = r.hold.active ? &r.hold.held.emplace_back() : nullptr;
  if (r.opt.on_logits) {
    if (held) held->logits.assign(logits, logits + vocab);
    else r.opt.on_logits(logits, vocab);
  }
  // The sampler's penalties change logits in place; log-probabilities are of the raw ones.
  if (r.opt.logprobs >= 0) r.raw_logits.assign(logits, logits + vocab);
  const bool forced = chosen < 0 && r.forced_next < r.opt.forced_output.size();
  // A speculatively chosen token was already chosen under the grammar's mask (spec_choose).
  if (r.matcher && chosen < 0 && !forced && r.matcher->apply(logits, vocab, r.eos) == 0) {
    // cannot happen with a vocabulary that has every byte; never sample outside the grammar
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.error = "grammar: no token of the vocabulary continues the output";
    o.error = true;
    return o;
  }
  const int32_t tok = chosen >= 0 ? chosen
                      : forced    ? r.opt.forced_output[r.forced_next++]
                                  : r.sampler.sample(logits, vocab, r.history, r.prompt.size());
  o.token = tok;
  if (r.matcher) r.matcher->accept(tok, r.eos);
  if (r.opt.logprobs >= 0) {
    TokenLogprob lp = token_logprob(r.raw_logits.data(), vocab, tok, r.opt.logprobs);
    lp.prev = r.history.empty() ? -1 : r.history.back();  // (tok joins the history below)
    if (r.opt.on_logprob) {
      if (held) held->lp = lp;
      else r.opt.on_logprob(lp);
    }
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.logprobs.push_back(std::move(lp));
  }
  std::string text;
  const char* end = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.res.output_ids.empty()) {
      r.t_first = now_ms();
      r.res.ttft_ms = r.t_first - r.t_submit;
      r.res.prefill_ms = r.t_first - r.t_admit;
      // the remote tier's cost model compares fetching with this measured prefill rate
      if (chunks && !r.approx) chunks->note_prefill(r.res.n_prompt() - r.res.n_cached, r.res.prefill_ms);
    }
    r.res.output_ids.push_back(tok);
  }
  r.history.push_back(tok);
  if (!r.opt.ignore_eos && std::find(r.eos.begin(), r.eos.end(), tok) != r.eos.end()) {
    end = "stop";
  } else {
    text = r.stop.push(r.dec.push(tok));
    if (r.stop.stopped()) end = "stop";
  }
  const int out = int(r.res.output_ids.size());
  if (!end && r.matcher && r.matcher->must_end()) end = "stop";  // the grammar's output is complete
  if (!end && (out >= r.opt.max_new_tokens || int64_t(r.history.size()) >= context_length)) end = "length";
  if (end && !r.stop.stopped()) {  // a normal end: release what was held back
    text += r.stop.push(r.dec.finish());
    if (r.stop.stopped()) end = "stop";
    text += r.stop.flush();
  }
  if (!text.empty()) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.res.text += text;
    }
    if (held) held->text = text;
    else if (r.opt.on_text && !r.opt.on_text(text)) o.cancelled = true;
  }
  o.end = end;
  return o;
}

// The request's logits are ready (end of its prefill, or a decode token): register the blocks
// whose K/V are stored, let the output stage pick and stream the token, and decide whether the
// request goes on. chosen >= 0: the token speculative verification picked (spec_accept).
void Engine::Impl::after_logits(Request::State& r, float* logits, int32_t chosen) {
  const int64_t n_kv = int64_t(r.history.size());  // tokens whose K/V are now stored
  if (r.opt.prefix_cache && r.opt.reuse.store) {
    const size_t n = size_t(std::min<int64_t>(n_kv, r.exact_limit));
    kv_->commit_full_blocks(r.seq, std::span<const int32_t>(r.history.data(), n));
  }
  const OutputProcessor out{model_->config().vocab_size, context_length(), chunks_.get()};
  TokenOutcome o = out.process(r, logits, chosen);
  if (r.hold.active && !o.error && (o.end || r.hold.n_checked >= r.hold.k)) {  // the held tokens passed
    if (!hold_release(r)) o.cancelled = true;
    store_chunks(r);  // (not stored while they might still be discarded)
  }
  if (o.error) {
    finish(r, "error");
    return;
  }
  if (o.end || o.cancelled) {
    // Every token but the one just sampled has its K/V stored: register the last full blocks
    // and the partly filled one, so a prompt continuing this text (the next chat turn) reuses
    // them to the token.
    if (r.opt.prefix_cache && r.opt.reuse.store && r.seq && kv_->has_seq(r.seq)) {
      const size_t n = size_t(std::min<int64_t>(int64_t(r.history.size()) - 1, r.exact_limit));
      const std::span<const int32_t> done(r.history.data(), n);
      kv_->commit_full_blocks(r.seq, done);
      kv_->commit_tail(r.seq, done);
    }
  }
  if (o.end) {
    finish(r, o.end);
  } else if (o.cancelled) {
    finish(r, "cancelled");
  } else {
    r.phase = Request::State::Phase::kDecode;
  }
}

}  // namespace kvboost
