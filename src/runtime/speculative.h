// Internal: speculative decoding's per-request state, drafting and the acceptance rule, shared
// by engine.cpp (one hook before the pass, one after) and speculative.cpp. docs/speculative.md.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kvboost/grammar.h"
#include "kvboost/kv.h"
#include "kvboost/runtime.h"

namespace kvboost {

using SpecDist = std::vector<std::pair<int32_t, double>>;  // (id, probability), sums to 1

// A request's speculation: its resolved knobs, the rows of the next verification pass and the
// running acceptance estimate that sets the draft length.
struct SpecState {
  SpecMode mode = SpecMode::kOff;
  int k_max = 0;    // most drafts per pass
  int ngram = 3;    // lookup: longest n-gram matched
  bool adaptive = true;
  // The verification pass's tokens: history.back() then the drafts (empty: a plain decode).
  std::vector<int32_t> rows;
  std::vector<SpecDist> q;  // draft model, sampling: the distribution each draft was drawn from
  // Acceptance estimate: discounted accepted drafts over accept/reject trials (each verified
  // draft up to and including the first rejected one is a trial; later ones were not tried).
  double hits = 2.0, trials = 3.0;
  // Draft model: this request's sequence in the draft's KV and the history tokens it holds.
  uint64_t draft_seq = 0;
  int64_t draft_done = 0;
  std::optional<Sampler> draft_sampler;  // draws the drafts when sampling (its own RNG)
  std::vector<float> scratch;            // [vocab] a row's copy for the sampler
  SpecDist p;                            // the target's distribution of the row in hand
  double rate() const { return trials > 0 ? hits / trials : 0; }
};

// Prompt lookup: the tokens that followed the latest earlier occurrence of the longest suffix
// n-gram of `h` (n from `ngram` down to 1), at most k of them, into out. Returns their count.
int lookup_draft(const std::vector<int32_t>& h, int ngram, int k, std::vector<int32_t>* out);

// The draft length that maximizes expected tokens per unit of cost: with per-draft acceptance
// a, k drafts yield (1 - a^(k+1)) / (1 - a) tokens for a pass costing 1 + row_cost * k.
int adaptive_draft_length(double a, int k_max, double row_cost);
// The same with a measured cost per k: cost[k] (k = 1 .. k_max, relative to a plain pass) where
// positive, else 1 + row_cost * k.
int adaptive_draft_length(double a, int k_max, double row_cost, const double* cost_k, int n_cost);

// One verified row: the token the request emits there, and whether it is the draft's.
// Greedy: the argmax (penalties applied) as plain decoding picks it; accepted when it equals the
// draft. Sampling: the draft d (from q, or a point mass when q is null) is accepted with
// probability min(1, p(d) / q(d)); otherwise a token is drawn from norm(max(0, p - q)). No draft
// (draft < 0, the row after the last accepted draft): a plain draw from p. The emitted tokens
// are then distributed exactly as plain sampling's (Leviathan et al. 2023, Theorem 1).
// matcher (a grammar-constrained request, in the state before this row's token): its mask is
// applied to the row's copy first, as plain decoding applies it, so a draft the grammar rejects
// has p = 0 and is never accepted. Returns -1 when the mask allows nothing (the caller lets the
// output stage report it).
int32_t spec_choose(Sampler& s, const float* row, int64_t vocab, const std::vector<int32_t>& history,
                    size_t n_prompt, int32_t draft, const SpecDist* q, std::vector<float>* scratch,
                    SpecDist* p, bool* accepted, grammar::Matcher* matcher = nullptr,
                    const std::vector<int32_t>* eos = nullptr);
// The leading drafts the grammar accepts from the matcher's state (the first rejected one, and
// everything after it, is dropped; nothing is drafted past the grammar's end). The matcher is
// advanced over them and rolled back: it leaves in the state it came in. Returns the count kept.
size_t grammar_filter_drafts(grammar::Matcher& m, const std::vector<int32_t>& eos, std::vector<int32_t>* drafts);

// The draft model (SpecOptions::draft_model): its own Model and paged KV; one sequence per
// request, holding the K/V of the request's history (drafts' K/V are dropped after drafting).
struct SpecDraftModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<kv::PagedKvStorage> store;
  int64_t block_size = 0;
  kv::SeqId next_seq = 1;
  double cost = 0;
  std::vector<float> logits;
  KvView view(kv::SeqId seq, int64_t n_past) {
    KvView v;
    static_cast<kv::KvLayout&>(v) = store->layout(kv->block_table(seq).data());
    v.n_past = n_past;
    return v;
  }
};
std::unique_ptr<SpecDraftModel> load_draft_model(const std::string& dir, const Model& target, const Tokenizer& tok,
                                                 const EngineOptions& opt);
// Drafts up to k tokens continuing `history` for `sp`; q filled when `sampler` is given.
int draft_model_tokens(SpecDraftModel& d, SpecState& sp, const std::vector<int32_t>& history, int k,
                       int64_t target_vocab, std::vector<int32_t>* out);
void draft_model_release(SpecDraftModel& d, SpecState& sp);
// Draft pass cost relative to the target's (bytes of weights one token reads).
double draft_model_cost(const SpecDraftModel& d);

}  // namespace kvboost
