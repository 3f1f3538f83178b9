// Engine: continuous batching over paged KV memory. Requests are queued by submit(); each step()
// admits what fits, then runs one forward pass holding a decode token of every decoding request
// and a bounded chunk of prompt tokens of prefilling ones (so a long prompt never stalls running
// decodes), samples, and streams text that is final (whole UTF-8 characters, never the start of a
// stop string). KV exhaustion preempts the newest request; it resumes by recomputation, which the
// prefix cache makes cheap.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "request.h"

namespace kvboost {

// ---- Request -----------------------------------------------------------------------------------

Request::Request(std::unique_ptr<State> s) : st_(std::move(s)) {}
Request::~Request() = default;
bool Request::done() const { return st_->done_flag.load(); }
void Request::cancel() { st_->cancel_flag.store(true); }
GenerateResult Request::result() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->res;
}

// ---- Engine ------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Model> m, Tokenizer t, const EngineOptions& opt)
    : model_(std::move(m)), tok_(std::move(t)), opt_(opt), block_size_(opt.block_size) {
  const ModelConfig& c = model_->config();
  if (block_size_ <= 0) fail("block size ", block_size_, " must be positive");
  if (opt_.max_batch < 1) fail("max_batch ", opt_.max_batch, " must be at least 1");
  if (opt_.prefill_chunk < 1) fail("prefill_chunk ", opt_.prefill_chunk, " must be at least 1");
  size_t budget = opt.kv_budget_bytes;
  if (budget == 0) {
    const size_t per_token = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
    budget = std::min<size_t>(per_token * size_t(c.max_position_embeddings + block_size_), size_t(2) << 30);
  }
  const int64_t n_blocks = kv::BlockPool::blocks_for_budget(budget, block_size_, c.n_layers, c.n_kv_heads, c.head_dim);
  if (n_blocks < 1) fail("KV budget of ", budget, " bytes holds no block of ", block_size_, " tokens");
  kv_ = std::make_unique<kv::KvCacheManager>(n_blocks, block_size_);
  store_ = std::make_unique<kv::PagedKvStorage>(n_blocks, block_size_, c.n_layers, c.n_kv_heads, c.head_dim);
  if (!opt.cold_dir.empty()) {
    cold_ = std::make_unique<kv::FileColdStore>(opt.cold_dir, store_->block_bytes());
    kv_->attach_cold_tier(store_.get(), cold_.get());
  }
  // Model identity for chunk keys (model_identity, src/model/identity.cpp): a content hash of
  // the weights, architecture, vocabulary and the store's K/V encoding; stored chunks of one
  // model are never used by another. With a disk tier, per-file hashes are remembered beside it.
  model_id_ = opt_.chunk_store.model_id;
  if (model_id_.empty()) {
    const kv::ChunkStoreOptions& cs = opt_.shared_chunk_store ? opt_.shared_chunk_store->options() : opt_.chunk_store;
    if (!cs.disk_dir.empty()) ::mkdir(cs.disk_dir.c_str(), 0755);  // (the store would create it next)
    const std::string cache = cs.disk_dir.empty() ? "" : path_join(cs.disk_dir, "model-identity.cache");
    model_id_ = model_identity(*model_, tok_, kv::kv_quant_name(cs.quant), cache);
    opt_.chunk_store.model_id = model_id_;
  }
  {  // the adaptive guard's calibration, beside the chunk store (guard_file.cpp)
    const std::string& disk = opt_.shared_chunk_store ? opt_.shared_chunk_store->options().disk_dir : opt_.chunk_store.disk_dir;
    guard_file_ = !opt_.guard_file.empty() ? opt_.guard_file : disk.empty() ? "" : path_join(disk, "guard-" + model_id_ + ".txt");
    if (!guard_file_.empty() && file_exists(guard_file_)) {
      try {
        load_guard_calibration(guard_file_);
      } catch (const Error& e) {
        std::fprintf(stderr, "kvboost: warning: %s; ignored (the guard relearns)\n", e.what());
      }
    }
  }
  if (opt_.chunk_size < 1) fail("chunk size ", opt_.chunk_size, " must be positive");
  const kv::ChunkShape shape{c.n_layers, c.n_kv_heads, c.head_dim};
  if (opt_.shared_chunk_store) {
    const kv::ChunkShape& s = opt_.shared_chunk_store->shape();
    if (s.n_layers != shape.n_layers || s.n_kv_heads != shape.n_kv_heads || s.head_dim != shape.head_dim)
      fail("shared_chunk_store holds chunks of ", s.n_layers, " layers x ", s.n_kv_heads, " x ", s.head_dim,
           " but the model's K/V are ", shape.n_layers, " x ", shape.n_kv_heads, " x ", shape.head_dim);
    chunks_ = opt_.shared_chunk_store;
  } else if (opt_.chunk_store.ram_bytes > 0) {
    chunks_ = std::make_shared<kv::ChunkStore>(shape, opt_.chunk_store);
  }
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opt) {
  // A GGUF model: tokenizer files beside the .gguf win; without them, the tokenizer stored in it.
  const std::string gguf = gguf_model_file(dir);
  std::string tok_dir = dir;
  if (!gguf.empty()) {
    const size_t slash = gguf.find_last_of('/');
    tok_dir = slash == std::string::npos ? "." : gguf.substr(0, slash);
  }
  Tokenizer tok = [&] {
    if (gguf.empty() || file_exists(path_join(tok_dir, "tokenizer.json"))) return Tokenizer::from_dir(tok_dir);
    const GgufTokenizerFiles t = gguf_tokenizer_files(gguf);
    return Tokenizer::from_json(t.tokenizer_json, t.tokenizer_config_json, gguf + " (tokenizer.ggml.*)");
  }();
  auto model = Model::load(dir, opt.load);
  if (tok.vocab_size() > model->config().vocab_size)
    fail(dir, ": tokenizer.json has ", tok.vocab_size(), " tokens but config.json vocab_size is ",
         model->config().vocab_size);
  std::unique_ptr<Engine> e(new Engine(std::move(model), std::move(tok), opt));
  if (!opt.spec.draft_model.empty()) e->draft_ = load_draft_model(opt.spec.draft_model, *e->model_, e->tok_, opt);
  else if (opt.spec.mode == SpecMode::kDraft) fail("speculative mode \"draft\" needs a draft model (--draft-model DIR)");
  return e;
}

int64_t Engine::context_length() const { return model_->config().max_position_embeddings; }

kv::KvStats Engine::kv_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_->stats();
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiting_.empty() || !running_.empty();
}

GenerateResult Engine::generate(std::string_view prompt, const GenerateOptions& opt) {
  return generate_ids(tok_.encode(prompt, opt.add_special), opt);
}

GenerateResult Engine::generate_ids(const std::vector<int32_t>& ids, const GenerateOptions& opt) {
  std::shared_ptr<Request> req = submit(ids, opt);
  while (!req->done()) step();
  GenerateResult r = req->result();
  if (r.finish_reason == "error") fail(r.error);
  return r;
}

std::shared_ptr<Request> Engine::submit(std::vector<int32_t> ids, GenerateOptions opt) {
  if (ids.empty()) fail("the prompt is empty (no tokens)");
  if (opt.max_new_tokens < 0) fail("max_new_tokens = ", opt.max_new_tokens, " must be >= 0");
  const int64_t ctx = context_length();
  if (int64_t(ids.size()) >= ctx)
    fail("the prompt has ", ids.size(), " tokens but the model's context is ", ctx,
         " (max_position_embeddings): no room to generate");
  const ModelConfig& cfg = model_->config();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
      fail("prompt token ", i, " has id ", ids[i], ", outside the vocabulary [0, ", cfg.vocab_size, ")");
  for (size_t i = 0; i < opt.segment_starts.size(); ++i) {
    const int64_t s = opt.segment_starts[i];
    if (s <= 0 || s >= int64_t(ids.size()) || (i > 0 && s <= opt.segment_starts[i - 1]))
      fail("segment start ", s, " (index ", i, ") must be increasing and inside (0, ", ids.size(), ")");
  }
  if (opt.logprobs < -1 || opt.logprobs > 20) fail("logprobs = ", opt.logprobs, " is out of range (-1 = off, or 0..20)");
  const SamplerConfig sc = resolve_sampling(opt.sampling, cfg.generation);
  validate_sampling(sc);
  auto st = std::make_unique<Request::State>(std::move(ids), std::move(opt), sc, tok_);
  Request::State& r = *st;
  r.eos = cfg.eos_token_ids;
  if (r.eos.empty() && tok_.eos_id()) r.eos.push_back(*tok_.eos_id());
  r.res.prompt_ids = r.prompt;
  r.res.finish_reason = "length";
  r.history = r.prompt;
  r.context = r.prompt;
  r.logits.resize(size_t(cfg.vocab_size));
  spec_setup(r);  // speculative decoding: may enlarge logits to [1 + k, vocab]
  // Without prefix caching no block is ever registered under this namespace, so nothing is hit.
  r.ns = r.opt.prefix_cache ? "u:" + r.opt.cache_namespace : std::string("\x01uncached");
  r.t_submit = now_ms();
  auto req = std::make_shared<Request>(std::move(st));
  std::lock_guard<std::mutex> lock(mu_);
  if (r.opt.max_new_tokens == 0) {
    r.phase = Request::State::Phase::kDone;
    r.done_flag = true;
    return req;
  }
  waiting_.push_back(req);
  return req;
}

bool Engine::admit(Request::State& r) {
  r.seq = next_seq_++;
  auto alloc = kv_->allocate_for_prompt(r.seq, r.context, r.ns);
  if (!alloc) return false;
  for (const auto& c : alloc->copies) store_->copy_block(c.src, c.dst);
  r.todo.clear();
  r.todo_next = 0;
  for (int64_t p = alloc->n_cached; p < int64_t(r.context.size()); ++p) r.todo.push_back(int32_t(p));
  if (!r.admitted_once) plan_reuse(r, alloc->n_cached);
  if (!r.admitted_once) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.t_admit = now_ms();
    r.res.queue_ms = r.t_admit - r.t_submit;
  }
  r.admitted_once = true;
  r.phase = Request::State::Phase::kPrefill;
  return true;
}

void Engine::release(Request::State& r) {
  spec_release(r);
  if (r.seq && kv_->has_seq(r.seq)) kv_->free(r.seq);
  r.seq = 0;
}

void Engine::finish(Request::State& r, const char* reason) {
  release(r);
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.finish_reason = reason;
    const double t = now_ms();
    r.res.total_ms = t - r.t_submit;
    r.res.decode_ms = r.res.output_ids.empty() ? 0 : t - r.t_first;
  }
  r.phase = Request::State::Phase::kDone;
  r.done_flag = true;
}

void Engine::preempt(Request::State& r) {
  release(r);
  r.context = r.history;  // the pending sampled token included: its prefill logits give the next
  r.todo.clear();
  r.todo_next = 0;
  r.blend = false;
  r.approx = false;  // resumed from the exact block cache: recomputed exactly, nothing to guard
  r.phase = Request::State::Phase::kWaiting;
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.res.n_preempted;
}

KvView Engine::view_of(Request::State& r, int64_t n_past) {
  KvView v;
  static_cast<kv::KvLayout&>(v) = store_->layout(kv_->block_table(r.seq).data());
  v.n_past = n_past;
  // Half the hot pool per attention range leaves room for the blocks being written.
  if (cold_) v.pager = kv::Pager(*kv_, r.seq, std::max<int64_t>(1, store_->n_blocks() / 2));
  return v;
}

// The request's logits are ready (end of its prefill, or a decode token): sample, stream, and
// decide whether it goes on.
// chosen >= 0: the token speculative verification picked from these logits (spec_accept).
void Engine::after_logits(Request::State& r, float* logits, int32_t chosen) {
  const ModelConfig& cfg = model_->config();
  const int64_t n_kv = int64_t(r.history.size());  // tokens whose K/V are now stored
  if (r.opt.prefix_cache && r.opt.reuse.store) {
    const size_t n = size_t(std::min<int64_t>(n_kv, r.exact_limit));
    kv_->commit_full_blocks(r.seq, std::span<const int32_t>(r.history.data(), n));
  }
  if (r.opt.on_logits) r.opt.on_logits(logits, cfg.vocab_size);
  // The sampler's penalties change logits in place; log-probabilities are of the raw ones.
  if (r.opt.logprobs >= 0) r.raw_logits.assign(logits, logits + cfg.vocab_size);
  const bool forced = chosen < 0 && r.forced_next < r.opt.forced_output.size();
  // (Speculation is off for requests with a grammar: spec_plan drafts nothing for them.)
  if (r.matcher && chosen < 0 && !forced && r.matcher->apply(logits, cfg.vocab_size, r.eos) == 0) {
    {  // cannot happen with a vocabulary that has every byte; never sample outside the grammar
      std::lock_guard<std::mutex> lock(r.mu);
      r.res.error = "grammar: no token of the vocabulary continues the output";
    }
    finish(r, "error");
    return;
  }
  const int32_t tok = chosen >= 0 ? chosen
                      : forced    ? r.opt.forced_output[r.forced_next++]
                                  : r.sampler.sample(logits, cfg.vocab_size, r.history, r.prompt.size());
  if (r.matcher) r.matcher->accept(tok, r.eos);
  if (r.opt.logprobs >= 0) {
    TokenLogprob lp = token_logprob(r.raw_logits.data(), cfg.vocab_size, tok, r.opt.logprobs);
    lp.prev = r.history.empty() ? -1 : r.history.back();  // (tok joins the history below)
    if (r.opt.on_logprob) r.opt.on_logprob(lp);
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.logprobs.push_back(std::move(lp));
  }
  std::string text;
  const char* end = nullptr;
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.res.output_ids.empty()) {
      r.t_first = now_ms();
      r.res.ttft_ms = r.t_first - r.t_submit;
      r.res.prefill_ms = r.t_first - r.t_admit;
      // the remote tier's cost model compares fetching with this measured prefill rate
      if (chunks_ && !r.approx) chunks_->note_prefill(r.res.n_prompt() - r.res.n_cached, r.res.prefill_ms);
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
  if (!end && (out >= r.opt.max_new_tokens || int64_t(r.history.size()) >= context_length())) end = "length";
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
    if (r.opt.on_text && !r.opt.on_text(text)) cancelled = true;
  }
  if (end || cancelled) {
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
  if (end) {
    finish(r, end);
  } else if (cancelled) {
    finish(r, "cancelled");
  } else {
    r.phase = Request::State::Phase::kDecode;
  }
}

StepStats Engine::step() {
  using Phase = Request::State::Phase;
  std::lock_guard<std::mutex> lock(mu_);
  auto st = [](const std::shared_ptr<Request>& q) -> Request::State& { return *q->st_; };
  auto fail_request = [&](Request::State& r, const std::string& why) {
    {
      std::lock_guard<std::mutex> l(r.mu);
      r.res.error = why;
    }
    finish(r, "error");
  };
  // 1. Cancelled requests leave, their KV freed.
  for (auto* list : {&running_, &waiting_}) {
    for (auto& q : *list)
      if (st(q).cancel_flag && st(q).phase != Phase::kDone) finish(st(q), "cancelled");
    std::erase_if(*list, [&](const auto& q) { return st(q).phase == Phase::kDone; });
  }
  // 2. Admission, first come first served. With a cold tier, one sequence at a time (paging in
  // for one sequence may spill another's blocks mid-pass). Requests sharing at least a block of
  // prompt prefix with one still in its prefill are grouped behind it: they wait until its blocks
  // are committed and then reuse them instead of computing the same prefix twice.
  const size_t max_running = cold_ ? 1 : size_t(opt_.max_batch);
  auto shares_prefill = [&](const Request::State& r) {
    if (!r.opt.prefix_cache) return false;
    for (const auto& q : running_) {
      const Request::State& o = st(q);
      if (o.phase != Phase::kPrefill || o.ns != r.ns || !o.opt.prefix_cache) continue;
      const size_t n = std::min(o.context.size(), r.context.size());
      size_t k = 0;
      while (k < n && o.context[k] == r.context[k]) ++k;
      if (int64_t(k) >= block_size_) return true;
    }
    return false;
  };
  for (size_t i = 0; i < waiting_.size() && running_.size() < max_running;) {
    Request::State& r = st(waiting_[i]);
    if (shares_prefill(r)) {
      ++i;
      continue;
    }
    bool ok = false;
    try {
      ok = admit(r);
    } catch (const std::exception& e) {
      release(r);
      fail_request(r, e.what());
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      continue;
    }
    if (!ok) {
      if (running_.empty()) {  // nothing will ever free memory for it
        fail_request(r, "KV memory exhausted: the prompt needs " + std::to_string((r.context.size() + block_size_ - 1) / block_size_) +
                            " blocks of " + std::to_string(block_size_) + " tokens but the pool has " +
                            std::to_string(kv_->stats().n_blocks) + " (raise the KV budget)");
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        continue;
      }
      break;
    }
    running_.push_back(waiting_[i]);
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
  }
  // 3. Slots for decode tokens, oldest first; exhaustion preempts the newest request.
  StepStats ss;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request::State& r = st(running_[i]);
    if (r.phase != Phase::kDecode) continue;
    for (;;) {
      auto slot = kv_->append_slot(r.seq);
      if (slot) {
        if (slot->copy) store_->copy_block(slot->copy->src, slot->copy->dst);
        break;
      }
      if (running_.size() == 1) {
        fail_request(r, "KV memory exhausted after " + std::to_string(r.history.size() - 1) +
                            " tokens (raise the KV budget or set a cold tier)");
        break;
      }
      Request::State& victim = st(running_.back());
      preempt(victim);
      waiting_.insert(waiting_.begin(), running_.back());
      running_.pop_back();
      if (&victim == &r) break;
    }
  }
  std::erase_if(running_, [&](const auto& q) { return st(q).phase == Phase::kDone || st(q).phase == Phase::kWaiting; });
  // 3b. Speculative decoding (speculative.cpp): drafts for decoding requests, their slots reserved.
  {
    int64_t n_decoding = 0;
    for (auto& q : running_) n_decoding += st(q).phase == Phase::kDecode;
    for (auto& q : running_)
      if (st(q).phase == Phase::kDecode) ss.n_drafted += spec_plan(st(q), n_decoding);
  }

  // 4. One forward pass: decode tokens, then prompt chunks within the prefill budget.
  std::vector<SeqBatch> batch;
  std::vector<Request::State*> owners;
  std::vector<Request::State*> blends;
  int64_t budget = opt_.prefill_chunk;
  for (auto& q : running_) {
    Request::State& r = st(q);
    SeqBatch b;
    if (r.phase == Phase::kDecode) {
      b.tokens = &r.history.back();
      b.n = 1;
      b.kv = view_of(r, int64_t(r.history.size()) - 1);
      b.logits = r.logits.data();
      if (r.spec.rows.size() > 1) {  // speculation: history.back() and the drafts, all verified
        b.tokens = r.spec.rows.data();
        b.n = b.n_logits = int64_t(r.spec.rows.size());
      }
      ++ss.n_decode;
    } else if (r.phase == Phase::kPrefill) {
      if (r.blend) {
        blends.push_back(&r);
        continue;
      }
      const int64_t left = int64_t(r.todo.size() - r.todo_next);
      if (budget <= 0 && left > 0) continue;
      const int64_t take = std::min(left, budget);
      budget -= take;
      if (take == 0) {  // nothing to compute (cannot happen: the last token is always computed)
        continue;
      }
      b.positions = &r.todo[r.todo_next];
      // tokens at those positions: gather (positions may be scattered after a reuse plan)
      b.n = take;
      b.kv = view_of(r, 0);
      const bool last = r.todo_next + size_t(take) == r.todo.size();
      b.logits = last ? r.logits.data() : nullptr;
      ss.n_prefill_tokens += take;
    } else {
      continue;
    }
    batch.push_back(b);
    owners.push_back(&r);
  }
  // Prefill tokens are gathered from the context by position.
  std::vector<std::vector<int32_t>> gathered(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].positions) continue;
    Request::State& r = *owners[i];
    for (int64_t j = 0; j < batch[i].n; ++j) gathered[i].push_back(r.context[size_t(batch[i].positions[j])]);
    batch[i].tokens = gathered[i].data();
  }
  try {
    if (!batch.empty()) {
      const double t0 = now_ms();
      model_->forward_batch(batch.data(), int64_t(batch.size()));
      ss.forward_ms += now_ms() - t0;
      if (blends.empty()) spec_observe(ss);
    }
  } catch (const std::exception& e) {
    for (auto* r : owners) fail_request(*r, e.what());
    owners.clear();
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    Request::State& r = *owners[i];
    if (r.phase == Phase::kPrefill) {
      r.todo_next += size_t(batch[i].n);
      if (r.todo_next < r.todo.size() || guard_trips(r)) continue;
      r.history = r.context;  // (a resumed request's context is its history)
      if (r.res.output_ids.empty()) store_chunks(r);
    } else if (spec_accept(r)) {  // speculation: the drafts verified (decode)
      continue;
    }
    after_logits(r, r.logits.data());
  }
  for (Request::State* r : blends) {
    try {
      BlendOptions bo;
      bo.ratio = r->blend_ratio;
      bo.check_layer = r->opt.reuse.blend_check_layer;
      bo.first_ratio = r->blend_first_ratio;
      bo.taper_layers = r->opt.reuse.blend_taper_layers;
      bo.reused = r->reused.data();
      const int64_t n = int64_t(r->context.size()) - r->blend_from;
      const double t0 = now_ms();
      const BlendStats bs = model_->forward_blend(r->context.data() + r->blend_from, n, view_of(*r, r->blend_from), bo,
                                                  r->logits.data());
      ss.forward_ms += now_ms() - t0;
      ss.n_prefill_tokens += n;
      {
        std::lock_guard<std::mutex> l(r->mu);
        r->res.n_recomputed = bs.n_selected + r->blend_forced;
      }
      r->blend_rows = bs.n_rows_late;
      if (guard_trips(*r)) continue;
      r->history = r->context;
      store_chunks(*r);
      after_logits(*r, r->logits.data());
    } catch (const std::exception& e) {
      fail_request(*r, e.what());
    }
  }
  std::erase_if(running_, [&](const auto& q) { return st(q).phase == Phase::kDone; });
  ss.n_running = int64_t(running_.size());
  ss.n_waiting = int64_t(waiting_.size());
  return ss;
}

}  // namespace kvboost
