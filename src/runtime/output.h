// Internal: the output stage. One row of logits of a request in, one token out: the teacher-
// forced or speculatively chosen token, else the grammar's mask and the sampler's draw; its
// log-probability; the incremental detokenizer and the stop strings; the end conditions (eos,
// stop string, grammar complete, max_new_tokens, context). It changes only the request's own
// output state (history, result, sampler, matcher, decoder); the engine does the KV bookkeeping
// around it (Engine::after_logits, output.cpp).
#pragma once

#include <cstdint>

#include "request.h"

namespace kvboost {

struct TokenOutcome {
  int32_t token = -1;
  const char* end = nullptr;  // "stop" | "length": the request is complete
  bool cancelled = false;     // on_text returned false
  bool error = false;         // no token is allowed (res.error says why); nothing was emitted
};

struct OutputProcessor {
  int64_t vocab = 0;
  int64_t context_length = 0;
  kv::ChunkStore* chunks = nullptr;  // told the measured prefill rate at each first token
  // logits: [vocab], changed in place (mask, penalties). chosen >= 0: the token is already
  // decided (speculative verification).
  TokenOutcome process(Request::State& r, float* logits, int32_t chosen) const;
};

}  // namespace kvboost
