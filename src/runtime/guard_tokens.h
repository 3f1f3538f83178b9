// Internal: the multi-token guard's state (ReusePolicy::guard_tokens). While a request's first
// generated tokens are decoded on approximate K/V, everything the caller would see of them (the
// on_logits / on_logprob / on_text calls) is held here, and the output state as it was before the
// first token is kept, so that a close call at a later token can discard them without a trace.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kvboost/runtime.h"
#include "kvboost/sampler.h"
#include "kvboost/tokenizer.h"

namespace kvboost {

struct GuardHold {
  bool active = false;
  int64_t k = 1;          // tokens to check (ReusePolicy::guard_tokens)
  int64_t n_checked = 0;  // tokens whose leads passed so far (the first token's included)
  float limit = 0;        // the threshold the first token was held to (the rung's)
  // One held token: the caller's callbacks it would have had, in order.
  struct Token {
    std::vector<float> logits;        // on_logits (only when set)
    std::optional<TokenLogprob> lp;   // on_logprob (only when set)
    std::string text;                 // on_text ("" when the decoder held it back)
  };
  std::vector<Token> held;
  // The output state before the first token (restored when the held tokens are discarded).
  std::optional<Sampler> sampler;
  std::optional<StreamDecoder> dec;
  std::optional<StopMatcher> stop;
  size_t forced_next = 0;
};

// Starts holding after the first token's lead passed `limit` (before that token is output).
void hold_begin(Request::State& r, int64_t k, float limit);
// Discards the held tokens: the output state as at hold_begin (the caller truncates the K/V).
void hold_restore(Request::State& r);
// Runs the held callbacks in order and stops holding; ttft_ms is taken now. False: on_text
// asked to stop.
bool hold_release(Request::State& r);

}  // namespace kvboost
