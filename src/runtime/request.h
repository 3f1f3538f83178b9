// Internal: the state of one request in flight (Request::State), shared by engine.cpp (the
// scheduler loop) and reuse.cpp (the prefill plan).
#pragma once

#include <atomic>
#include <mutex>
#include <optional>

#include "kvboost/runtime.h"
#include "guard_tokens.h"
#include "speculative.h"

namespace kvboost {

struct Request::State {
  enum class Phase { kWaiting, kPrefill, kDecode, kDone };
  State(std::vector<int32_t> ids, GenerateOptions o, const SamplingParams& sc, const Tokenizer& tok)
      : prompt(std::move(ids)), opt(std::move(o)), sampler(sc), dec(tok, !opt.keep_special_tokens), stop(opt.stop) {
    dec.set_context(prompt);  // the output is a continuation: "Once upon a" + " time"
    if (opt.grammar) matcher.emplace(opt.grammar);
  }

  std::vector<int32_t> prompt;
  GenerateOptions opt;
  Sampler sampler;
  std::vector<int32_t> eos;
  StreamDecoder dec;
  StopMatcher stop;
  std::optional<grammar::Matcher> matcher;  // GenerateOptions::grammar's state

  std::atomic<bool> cancel_flag{false}, done_flag{false};
  mutable std::mutex mu;  // guards res against readers on other threads
  GenerateResult res;

  Phase phase = Phase::kWaiting;
  kv::SeqId seq = 0;
  bool admitted_once = false;
  std::string ns;                  // prefix-cache namespace
  std::vector<int32_t> history;    // prompt + sampled tokens
  std::vector<int32_t> context;    // tokens the next admission prefills (prompt, or history)
  // Prefill plan: positions of `context` still to compute, in increasing order.
  std::vector<int32_t> todo;
  size_t todo_next = 0;
  bool blend = false;              // prefill in one CacheBlend pass
  std::vector<uint8_t> reused;     // blend: per context token from n_cached on, 1 = reused K/V
  int64_t blend_from = 0;          // blend: first position of the pass
  float blend_ratio = 0;           // blend: share of the remaining candidates to recompute
  float blend_first_ratio = 0;     // blend: ... selected at the check layer (gradual filtering)
  int64_t blend_forced = 0;        // blend: run-start tokens recomputed ahead of the selection
  // Positions below exact_limit hold exactly the K/V a full prefill computes; only those blocks
  // may become prefix-cache entries.
  int64_t exact_limit = INT64_MAX;
  // Positions below context_limit hold K/V computed after the same tokens at the same positions:
  // exact, or read from stored chunks that were (a quantized store's prefix hits: lossy, but in
  // their own context). Chunks computed below it are stored under prefix keys; beyond the first
  // content hit (K/V from another context) only under content keys. Equal to exact_limit when
  // the store keeps f32.
  int64_t context_limit = INT64_MAX;
  // Guard (ReusePolicy::guard_lead): the prompt's K/V are partly approximate from guard_from on;
  // when the first token is a close call, [guard_from, n) is recomputed in an ordinary prefill.
  bool approx = false;
  int64_t guard_from = 0;
  // Set when the guard tripped: the approximate top two tokens and their lead, compared with the
  // full prefill's logits once it is done (the adaptive guard's error sample).
  bool guard_pending = false;
  struct GuardCheck {
    ReuseMode mode;
    int32_t top[2];
    float lead;
  };
  std::vector<GuardCheck> guard_checks;  // the steps that tripped, learned once the exact logits are in
  // The repair the current prefill pass applies (ReuseMode::kAuto: the ladder's step), the
  // per-position state of the plan (0 new, 1 exact, 2 approximate), its first approximate
  // position, and the starts of reused runs.
  ReuseMode rung = ReuseMode::kPrefixOnly;
  std::vector<uint8_t> pos_state;
  int64_t first_approx = 0;
  std::vector<int64_t> run_starts;
  int64_t blend_rows = 0;  // rows the last CacheBlend pass computed in its last layer
  // The selective step's probe: the reused K/V of the approximate rows it recomputes, copied
  // before they are overwritten ([row][layer][K nkv, V nkv]), so that the guard can measure how
  // far the cached K/V of repaired rows were from fresh ones (Engine::repaired_deviation).
  std::vector<int64_t> probe_rows;
  std::vector<float> probe_kv;
  std::vector<float> logits;       // [vocab]
  std::vector<float> raw_logits;   // [vocab] copy before sampling (GenerateOptions::logprobs)
  // Chunk plan of the prompt (reuse.cpp): spans, keys, and where each chunk's K/V came from.
  using ChunkSrc = reuse::ChunkSrc;
  std::vector<kv::ChunkSpan> chunks;
  std::vector<kv::ChunkKeys> chunk_keys;
  std::vector<ChunkSrc> chunk_src;
  // The remote tier's lookup issued at admission, while it is in flight (reuse.cpp remote_poll).
  std::shared_ptr<kv::RemoteFetch> remote;
  int64_t remote_n_cached = 0;     // the block cache's prefix at admission
  bool remote_waited = false;
  SpecState spec;                  // speculative decoding (speculative.cpp)
  GuardHold hold;                  // the multi-token guard's held tokens (guard_tokens.cpp)
  size_t forced_next = 0;          // next token of opt.forced_output
  double t_submit = 0, t_admit = 0, t_first = 0;
};

}  // namespace kvboost
