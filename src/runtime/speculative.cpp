// Speculative decoding (docs/speculative.md). Before a step's forward pass, each decoding request
// may draft tokens (prompt lookup or a draft model) and reserve KV slots for them; the pass then
// runs history.back() and the drafts as 1 + k rows of the request, whose logits verify the drafts
// left to right. Accepted tokens go through after_logits one by one exactly as plain decoding
// would emit them (stop strings, eos, length, block commits); the slots of rejected drafts are
// given back (KvCacheManager::truncate). Blocks are committed to the prefix cache only from the
// request's history, which never holds a rejected draft, so no rejected K/V can be found there.
//
// Exactness: greedy verification emits the argmax of each row, which is plain decoding's token
// when a row computed among k + 1 rows equals the row computed alone. On this engine it does:
// every matmul path accumulates each output over k in the same order whatever the number of
// rows (matmul_packed_avx2.cpp: "a token's result does not depend on the tile it lands in"),
// attention and norms are per row; test_speculative checks the logits bit for bit.
#include "speculative.h"

#include <algorithm>
#include <cmath>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "engine_impl.h"
#include "request.h"
#include "runner.h"

namespace kvboost {

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::kOff: return "off";
    case SpecMode::kLookup: return "lookup";
    case SpecMode::kDraft: return "draft";
  }
  return "?";
}

SpecMode parse_spec_mode(std::string_view s) {
  for (SpecMode m : {SpecMode::kOff, SpecMode::kLookup, SpecMode::kDraft})
    if (s == spec_mode_name(m)) return m;
  fail("speculative mode \"", s, "\" is not one of off, lookup, draft");
}

int lookup_draft(const std::vector<int32_t>& h, int ngram, int k, std::vector<int32_t>* out) {
  out->clear();
  const int64_t H = int64_t(h.size());
  if (k <= 0 || H < 2) return 0;
  for (int64_t n = std::min<int64_t>(ngram, H - 1); n >= 1; --n) {
    const int32_t* pat = h.data() + (H - n);
    // Latest first: the nearest earlier occurrence is the likeliest to continue the same way
    // (a quoted passage, an edited file's next line, a loop the output is in).
    for (int64_t s = H - n - 1; s >= 0; --s) {
      if (h[size_t(s)] != pat[0] || !std::equal(pat, pat + n, h.data() + s)) continue;
      const int64_t from = s + n, to = std::min<int64_t>(H, from + k);
      out->assign(h.begin() + from, h.begin() + to);
      return int(out->size());
    }
  }
  return 0;
}

int adaptive_draft_length(double a, int k_max, double row_cost) {
  return adaptive_draft_length(a, k_max, row_cost, nullptr, 0);
}

int adaptive_draft_length(double a, int k_max, double row_cost, const double* cost_k, int n_cost) {
  a = std::clamp(a, 0.0, 0.999);
  int best = 0;
  double best_v = 1.0, e = 1.0, ai = 1.0;
  for (int k = 1; k <= k_max; ++k) {
    ai *= a;
    e += ai;  // sum_{i=0..k} a^i
    const double c = cost_k && k < n_cost && cost_k[k] > 0 ? cost_k[k] : 1.0 + row_cost * k;
    const double v = e / c;
    if (v > best_v + 1e-9) best_v = v, best = k;
  }
  return best;
}

namespace {
double prob_of(const SpecDist& d, int32_t id) {
  for (const auto& [t, p] : d)
    if (t == id) return p;
  return 0.0;
}
// A draw from weights w (not necessarily normalized, total > 0).
int32_t draw(Sampler& s, const SpecDist& w, double total) {
  const double u = s.uniform() * total;
  double acc = 0;
  for (const auto& [t, p] : w) {
    acc += p;
    if (u < acc) return t;
  }
  for (auto it = w.rbegin(); it != w.rend(); ++it)
    if (it->second > 0) return it->first;
  return w.front().first;
}
}  // namespace

int32_t spec_choose(Sampler& s, const float* row, int64_t vocab, const std::vector<int32_t>& history,
                    size_t n_prompt, int32_t draft, const SpecDist* q, std::vector<float>* scratch,
                    SpecDist* p, bool* accepted, grammar::Matcher* matcher, const std::vector<int32_t>* eos) {
  scratch->assign(row, row + vocab);
  *accepted = false;
  static const std::vector<int32_t> kNoEos;
  if (matcher && matcher->apply(scratch->data(), vocab, eos ? *eos : kNoEos) == 0) return -1;
  if (s.config().temperature == 0.0f) {
    const int32_t t = s.sample(scratch->data(), vocab, history, n_prompt);
    *accepted = draft >= 0 && t == draft;
    return t;
  }
  s.distribution(scratch->data(), vocab, history, n_prompt, p);
  if (draft < 0) return draw(s, *p, 1.0);
  const double pd = prob_of(*p, draft), qd = q ? prob_of(*q, draft) : 1.0;
  if (qd > 0 && s.uniform() * qd < pd) {  // u < min(1, p/q)
    *accepted = true;
    return draft;
  }
  // Rejected: the residual max(0, p - q), renormalized. q a point mass: p without the draft.
  SpecDist res;
  res.reserve(p->size());
  double total = 0;
  for (const auto& [t, pt] : *p) {
    const double r = std::max(0.0, pt - (q ? prob_of(*q, t) : (t == draft ? 1.0 : 0.0)));
    if (r > 0) res.emplace_back(t, r), total += r;
  }
  if (res.empty() || !(total > 0)) return draw(s, *p, 1.0);  // p == q up to rounding
  return draw(s, res, total);
}

size_t grammar_filter_drafts(grammar::Matcher& m, const std::vector<int32_t>& eos, std::vector<int32_t>* drafts) {
  size_t n = 0;
  for (; n < drafts->size(); ++n) {
    // Past the grammar's end only EOS can follow: plain decoding ends there, so nothing is drafted.
    if (m.must_end() || !m.accept((*drafts)[n], eos)) break;
    if (std::find(eos.begin(), eos.end(), (*drafts)[n]) != eos.end()) {
      ++n;
      break;
    }
  }
  m.rollback(n);
  drafts->resize(n);
  return n;
}

// ---- the draft model ---------------------------------------------------------------------------


std::unique_ptr<SpecDraftModel> load_draft_model(const std::string& dir, const Model& target, const Tokenizer& tok,
                                                 const EngineOptions& opt) {
  auto d = std::make_unique<SpecDraftModel>();
  LoadOptions lo;
  lo.head_quant = opt.load.head_quant;
  lo.pack_weights = opt.load.pack_weights;
  d->model = Model::load(dir, lo);
  const ModelConfig& c = d->model->config();
  const std::string tj = path_join(dir, "tokenizer.json");
  if (file_exists(tj)) {
    const Tokenizer dt = Tokenizer::from_dir(dir);
    const std::string probe = "Once upon a time, the quick brown fox said: \"rename foo_bar to fooBar\" 12345.";
    if (dt.vocab_size() != tok.vocab_size() || dt.encode(probe, true) != tok.encode(probe, true))
      fail(dir, ": the draft model's tokenizer (", dt.vocab_size(), " tokens) is not the target's (", tok.vocab_size(),
           " tokens): speculative decoding needs a shared tokenizer");
  }
  if (c.vocab_size < tok.vocab_size())
    fail(dir, ": the draft model's vocab_size ", c.vocab_size, " is below the tokenizer's ", tok.vocab_size());
  d->block_size = opt.block_size;
  const size_t per_token = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  const size_t budget = std::min<size_t>(per_token * size_t(c.max_position_embeddings + d->block_size), size_t(1) << 30);
  const int64_t n_blocks = kv::BlockPool::blocks_for_budget(budget, d->block_size, c.n_layers, c.n_kv_heads, c.head_dim);
  if (n_blocks < 1) fail(dir, ": the draft model's KV budget holds no block");
  d->kv = std::make_unique<kv::KvCacheManager>(n_blocks, d->block_size);
  d->store = std::make_unique<kv::PagedKvStorage>(n_blocks, d->block_size, c.n_layers, c.n_kv_heads, c.head_dim);
  d->cost = double(d->model->decode_weight_bytes()) / double(std::max<size_t>(1, target.decode_weight_bytes()));
  d->logits.resize(size_t(c.vocab_size));
  return d;
}

double draft_model_cost(const SpecDraftModel& d) { return d.cost; }

void draft_model_release(SpecDraftModel& d, SpecState& sp) {
  if (sp.draft_seq && d.kv->has_seq(sp.draft_seq)) d.kv->free(sp.draft_seq);
  sp.draft_seq = 0;
  sp.draft_done = 0;
}

int draft_model_tokens(SpecDraftModel& d, SpecState& sp, const std::vector<int32_t>& history, int k,
                       int64_t target_vocab, std::vector<int32_t>* out) {
  out->clear();
  sp.q.clear();
  const int64_t H = int64_t(history.size());
  const ModelConfig& c = d.model->config();
  if (k <= 0 || H + k > c.max_position_embeddings) return 0;
  // Catch up: the history tokens the draft has not seen (the whole prompt the first time).
  if (sp.draft_seq == 0) {
    const kv::SeqId seq = d.next_seq++;
    // A namespace nothing is committed under: the draft's blocks are never shared.
    if (!d.kv->allocate_for_prompt(seq, history, "\x01draft")) return 0;
    sp.draft_seq = seq;
    sp.draft_done = 0;
  } else {
    for (int64_t i = sp.draft_done; i < H; ++i)
      if (!d.kv->append_slot(sp.draft_seq)) {
        draft_model_release(d, sp);  // out of draft KV: start over next time
        return 0;
      }
  }
  SeqBatch b;
  b.tokens = history.data() + sp.draft_done;
  b.n = H - sp.draft_done;
  b.kv = d.view(sp.draft_seq, sp.draft_done);
  b.logits = d.logits.data();
  d.model->forward_batch(&b, 1);
  sp.draft_done = H;
  const int64_t V = c.vocab_size;
  for (int j = 0; j < k; ++j) {
    int32_t t;
    if (sp.draft_sampler) {
      // The draft's own distribution, with the target's sampling settings (any q keeps the
      // output exact; a q close to p is accepted more often).
      sp.q.emplace_back();
      sp.draft_sampler->distribution(d.logits.data(), V, history, 0, &sp.q.back());
      t = draw(*sp.draft_sampler, sp.q.back(), 1.0);
    } else {
      t = int32_t(kernels::argmax(d.logits.data(), V));
    }
    if (t >= target_vocab) {
      if (sp.draft_sampler) sp.q.pop_back();
      break;
    }
    out->push_back(t);
    if (j + 1 == k) break;
    if (!d.kv->append_slot(sp.draft_seq)) break;
    SeqBatch s;
    s.tokens = &out->back();
    s.n = 1;
    s.kv = d.view(sp.draft_seq, H + j);
    s.logits = d.logits.data();
    d.model->forward_batch(&s, 1);
  }
  d.kv->truncate(sp.draft_seq, H);  // the drafts' K/V: recomputed if accepted
  return int(out->size());
}

// ---- the engine's hooks ------------------------------------------------------------------------

Engine::SpecStats Engine::Impl::spec_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_totals_;
}

void Engine::Impl::spec_setup(Request::State& r) {
  SpecState& sp = r.spec;
  const SpecOptions& so = opt_.spec;
  sp.mode = r.opt.speculative.mode.value_or(so.mode);
  sp.k_max = r.opt.speculative.draft_tokens.value_or(so.draft_tokens);
  sp.ngram = r.opt.speculative.ngram.value_or(so.lookup_ngram);
  sp.adaptive = so.adaptive;
  if (sp.k_max < 0 || sp.k_max > 32) fail("draft_tokens = ", sp.k_max, " is out of range [0, 32]");
  if (sp.ngram < 1 || sp.ngram > 16) fail("lookup ngram = ", sp.ngram, " is out of range [1, 16]");
  if (sp.mode == SpecMode::kDraft && !draft_)
    fail("speculative mode \"draft\" needs a draft model (EngineOptions::spec.draft_model, --draft-model DIR)");
  // Teacher forcing and the cold tier (one sequence, pages moving mid-pass) decode plainly.
  if (sp.k_max == 0 || !r.opt.forced_output.empty() || cold_) sp.mode = SpecMode::kOff;
  // A seeded sampled request must reproduce: by default only greedy requests speculate.
  if (*r.sampler.config().temperature > 0 && !r.opt.speculative.mode && !so.sampled) sp.mode = SpecMode::kOff;
  if (sp.mode == SpecMode::kOff) return;
  if (sp.mode == SpecMode::kDraft && *r.sampler.config().temperature > 0) {
    SamplingParams dc = r.sampler.config();
    dc.seed = dc.seed * 0x9E3779B97F4A7C15ull + 1;  // its own stream of draws
    dc.repetition_penalty = 1.0f, dc.presence_penalty = 0.0f, dc.frequency_penalty = 0.0f;
    sp.draft_sampler.emplace(dc);
  }
  r.logits.resize(size_t(sp.k_max + 1) * size_t(model_->config().vocab_size));
}

int64_t Engine::Impl::spec_plan(Request::State& r, int64_t n_decoding) {
  SpecState& sp = r.spec;
  sp.rows.clear();
  // A request whose first tokens the guard holds does not speculate (guard_tokens.cpp: one token
  // per check). A grammar-constrained one does: drafts the grammar rejects are cut here, and
  // each verified row is masked in the matcher's state after the tokens before it (spec_accept).
  if (sp.mode == SpecMode::kOff || r.hold.active || n_decoding > opt_.spec.max_batch) return 0;
  // Drafts never run past max_new_tokens or the context: k drafts emit up to k + 1 tokens.
  const int64_t left = std::min<int64_t>(int64_t(r.opt.max_new_tokens) - int64_t(r.res.output_ids.size()) - 1,
                                         context_length() - int64_t(r.history.size()));
  const double row_cost = spec_row_cost_ + (sp.mode == SpecMode::kDraft ? draft_model_cost(*draft_) : 0.0);
  // Alone in the step: the cost of each draft length as measured (plus the draft model's passes).
  double cost_k[33];
  const int n_cost = n_decoding == 1 ? int(spec_k_cost_.size()) : 0;
  const double extra = sp.mode == SpecMode::kDraft ? draft_model_cost(*draft_) : 0.0;
  for (int i = 0; i < n_cost; ++i) cost_k[i] = spec_k_cost_[size_t(i)] > 0 ? spec_k_cost_[size_t(i)] + extra * i : 0.0;
  int k = sp.adaptive ? adaptive_draft_length(sp.rate(), sp.k_max, row_cost, cost_k, n_cost) : sp.k_max;
  k = int(std::min<int64_t>(k, left));
  if (k <= 0) {
    // Not speculating: the estimate drifts back to its prior so that speculation is retried.
    sp.hits += 0.02 * (2.0 - sp.hits);
    sp.trials += 0.02 * (3.0 - sp.trials);
    return 0;
  }
  std::vector<int32_t> d;
  if (sp.mode == SpecMode::kLookup) {
    lookup_draft(r.history, sp.ngram, k, &d);
  } else {
    try {
      draft_model_tokens(*draft_, sp, r.history, k, model_->config().vocab_size, &d);
    } catch (const std::exception&) {  // the draft failing never fails the request
      draft_model_release(*draft_, sp);
      d.clear();
    }
  }
  if (r.matcher && !d.empty()) grammar_filter_drafts(*r.matcher, r.eos, &d);
  // Slots for the drafts; as many as the pool gives (speculation never preempts anyone).
  size_t n = 0;
  for (; n < d.size(); ++n) {
    auto slot = kv_->append_slot(r.seq);
    if (!slot) break;
    if (slot->copy) runner_->copy_block(*slot->copy);
  }
  if (n == 0) return 0;
  d.resize(n);
  if (sp.q.size() > n) sp.q.resize(n);
  sp.rows.reserve(n + 1);
  sp.rows.push_back(r.history.back());
  sp.rows.insert(sp.rows.end(), d.begin(), d.end());
  return int64_t(n);
}

bool Engine::Impl::spec_accept(Request::State& r) {
  using Phase = Request::State::Phase;
  SpecState& sp = r.spec;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    ++r.res.decode_passes;
  }
  if (sp.rows.size() <= 1) return false;
  const int64_t V = model_->config().vocab_size;
  const size_t k = sp.rows.size() - 1;
  const size_t out0 = r.res.output_ids.size();
  size_t accepted = 0, tried = 0;
  for (size_t i = 0; i <= k; ++i) {
    float* row = r.logits.data() + i * size_t(V);
    const int32_t draft = i < k ? sp.rows[i + 1] : -1;
    const SpecDist* q = draft >= 0 && i < sp.q.size() ? &sp.q[i] : nullptr;
    bool ok = false;
    // The matcher is in the state after the tokens emitted so far (after_logits advances it over
    // each one), exactly the state plain decoding masks this row in; the row itself goes to the
    // output stage unmasked (callbacks and log-probabilities see raw logits, as without drafts).
    const int32_t tok = spec_choose(r.sampler, row, V, r.history, r.prompt.size(), draft, q, &sp.scratch, &sp.p, &ok,
                                    r.matcher ? &*r.matcher : nullptr, &r.eos);
    if (tok < 0) {  // the grammar allows nothing: the output stage reports it (and masks again)
      after_logits(r, row, -1);
      break;
    }
    tried += draft >= 0;
    accepted += ok;
    after_logits(r, row, tok);
    if (!ok || r.phase == Phase::kDone) break;
  }
  // Rollback: the slots past the last emitted token's K/V (rejected drafts) go back.
  if (r.phase != Phase::kDone && r.seq && kv_->has_seq(r.seq)) kv_->truncate(r.seq, int64_t(r.history.size()) - 1);
  sp.hits = 0.9 * sp.hits + double(accepted);
  sp.trials = 0.9 * sp.trials + double(tried);
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.spec_drafted += int64_t(k);
    r.res.spec_accepted += int64_t(accepted);
  }
  spec_totals_.drafted += int64_t(k);
  spec_totals_.accepted += int64_t(accepted);
  spec_totals_.passes += 1;
  spec_totals_.tokens += int64_t(r.res.output_ids.size() - out0);
  sp.rows.clear();
  sp.q.clear();
  return true;
}

void Engine::Impl::spec_observe(const StepStats& ss) {
  if (ss.n_prefill_tokens > 0 || ss.n_decode == 0) return;
  const size_t n = size_t(std::min<int64_t>(ss.n_decode, int64_t(spec_plain_ms_.size()) - 1));
  double& plain = spec_plain_ms_[n];
  if (ss.n_drafted == 0) {
    plain = plain > 0 ? 0.8 * plain + 0.2 * ss.forward_ms : ss.forward_ms;
  } else if (plain > 0) {
    const double r = std::clamp((ss.forward_ms / plain - 1.0) / double(ss.n_drafted), 0.005, 2.0);
    spec_row_cost_ = 0.8 * spec_row_cost_ + 0.2 * r;
    if (ss.n_decode == 1 && ss.n_drafted < int64_t(spec_k_cost_.size())) {
      double& c = spec_k_cost_[size_t(ss.n_drafted)];
      const double m = std::clamp(ss.forward_ms / plain, 1.0, 1.0 + 2.0 * double(ss.n_drafted));
      c = c > 0 ? 0.8 * c + 0.2 * m : m;
    }
  }
}

void Engine::Impl::spec_release(Request::State& r) {
  if (draft_) draft_model_release(*draft_, r.spec);
}

}  // namespace kvboost
