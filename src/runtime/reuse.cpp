// The engine's side of chunk-level K/V reuse (the reuse module, kvboost/reuse.h, decides): at
// admission the prompt's plan (reuse::plan_prompt) goes into the request and its chunk copy-ins
// go through the model runner; after a prefill with approximate K/V the guard checks the first
// token's lead and escalates along the ladder; after the prefill computed chunks are stored.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine_impl.h"
#include "request.h"
#include "runner.h"
#include "scheduler.h"

namespace kvboost {

using Src = Request::State::ChunkSrc;

namespace {
// One CacheBlend pass over [from, n) into the request (reuse::plan_blend).
void setup_blend(Request::State& r, reuse::BlendPlan b) {
  r.blend = true;
  r.blend_from = b.from;
  r.reused = std::move(b.reused);
  r.blend_ratio = b.ratio;
  r.blend_first_ratio = b.first_ratio;
  r.blend_forced = b.forced;
  r.todo.clear();
  r.todo_next = 0;
}
}  // namespace

reuse::PromptInput Engine::Impl::reuse_input(Request::State& r, int64_t n_cached) {
  reuse::PromptInput in;
  // A natural break before token p: the previous token's text ends a line or a sentence.
  const auto is_break = [this, &r](int64_t p) {
    const std::string t = tok_.decode({r.context[size_t(p - 1)]});
    return !t.empty() && (t.back() == '\n' || t.back() == '.' || t.back() == '?' || t.back() == '!' ||
                          (t.size() >= 2 && t[t.size() - 2] == '.' && t.back() == ' '));
  };
  in.context = r.context;
  in.segment_starts = r.opt.segment_starts;
  in.n_cached = n_cached;
  in.chunk_size = opt_.chunk_size;
  in.chunk_window = opt_.chunk_window;
  in.is_break = is_break;
  in.store = chunks_ && opt_.cold_dir.empty() && r.opt.prefix_cache ? chunks_.get() : nullptr;
  in.model_id = model_id_;
  in.ns = r.ns;
  in.policy = &r.opt.reuse;
  in.n_layers = model_->config().n_layers;
  in.guard = &guard_;
  return in;
}

void Engine::Impl::plan_reuse(Request::State& r, int64_t n_cached, StepPlan& plan) {
  reuse::PromptInput in = reuse_input(r, n_cached);
  // The remote tier's lookup is issued here and overlapped with the prefill (remote_poll);
  // KVBOOST_REMOTE_SYNC=1 waits for it before planning instead (the A/B of docs/chunk-remote.md).
  static const bool sync = [] {
    const char* e = std::getenv("KVBOOST_REMOTE_SYNC");
    return e && *e && *e != '0';
  }();
  in.remote_async = !sync;
  reuse::PromptPlan p = reuse::plan_prompt(in);
  r.remote.reset();
  r.remote_waited = false;
  r.remote_n_cached = n_cached;
  std::vector<kv::ChunkKeys> keys;
  std::vector<std::vector<int32_t>> toks;
  int64_t first = INT64_MAX;
  for (size_t i : p.remote_ask) {
    if (p.chunk_src[i] != Src::kComputed) continue;  // the local tiers had it
    const kv::ChunkSpan& ch = p.chunks[i];
    keys.push_back(p.chunk_keys[i]);
    toks.emplace_back(r.context.begin() + ch.begin, r.context.begin() + ch.end);
    first = std::min(first, std::max(ch.begin, n_cached));
  }
  if (!keys.empty()) {
    r.remote = chunks_->fetch_remote_async(r.ns, std::move(keys), std::move(toks), r.opt.reuse.mode != ReuseMode::kPrefixOnly);
    r.remote->first_token = first;
  }
  apply_reuse_plan(r, p, plan);
}

// A plan made again at `from` (remote_poll): positions before it are computed or copied in.
void Engine::Impl::replan_reuse(Request::State& r, int64_t from, StepPlan& plan) {
  reuse::PromptInput in = reuse_input(r, from);
  in.remote_lookup = false;
  reuse::PromptPlan p = reuse::plan_prompt(in);
  if (from > r.remote_n_cached) {
    // The first plan's part that ran stays as it was: where each chunk's K/V came from, and
    // which positions were reused (it was exact: plain plans only are made again mid-prefill).
    int64_t reused_below = 0;
    for (int64_t q = 0; q < from; ++q) {
      p.pos_state[size_t(q)] = r.pos_state[size_t(q)];
      reused_below += r.pos_state[size_t(q)] != reuse::kNew;
    }
    for (size_t i = 0; i < p.chunks.size() && p.chunks[i].end <= from; ++i) p.chunk_src[i] = r.chunk_src[i];
    int64_t n_cached0, n_recomputed0;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      n_cached0 = r.res.n_cached, n_recomputed0 = r.res.n_recomputed;
    }
    p.n_cached = n_cached0;  // the prompt's head that was not computed
    p.n_reused = reused_below + (p.n_reused - from);
    p.n_new += from - reused_below;
    p.n_recomputed += n_recomputed0;
  }
  apply_reuse_plan(r, p, plan);
}

// The remote lookup issued at admission, before the request's next prefill rows: the number of
// rows it may compute now (INT64_MAX: no limit). Rows before the first chunk the lookup asks for
// are computed meanwhile; when the prefill reaches them the request waits for the lookup at most
// 4x its expected round trip + 5 ms (thread hand-offs on a loaded machine), and never more than
// half of what the cost model says recomputing what it asks for takes; past that it computes a chunk's worth per step and looks again. When
// the lookup brought chunks, the prompt is planned again from the first position not yet
// computed (copy-ins, repair, guard: as if they had been local at admission). A plan with
// approximate K/V is only planned again before it ran.
int64_t Engine::Impl::remote_poll(Request::State& r, StepPlan& plan) {
  kv::RemoteFetch& f = *r.remote;
  const bool fresh = r.todo_next == 0;      // nothing computed yet (a pending CacheBlend pass included)
  const bool plain = !r.approx && !r.blend;  // what is computed is an exact prefix of the prompt
  const int64_t next = r.todo_next < r.todo.size() ? r.todo[r.todo_next] : int64_t(r.context.size());
  const bool ahead = plain && next < f.first_token;  // still before anything the lookup may bring
  bool done = f.ready();
  double waited = 0;
  if (!done && !ahead && !r.remote_waited) {
    r.remote_waited = true;
    const double t0 = now_ms();
    done = f.wait_for(std::min(4 * f.expected_ms + 5.0, 0.5 * f.compute_ms));
    waited = now_ms() - t0;
  }
  if (waited > 0) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.remote_ms += waited;  // the part of TTFT the lookup cost
  }
  if (done) {
    const std::shared_ptr<kv::RemoteFetch> h = std::move(r.remote);
    r.remote.reset();
    if (h->n > 0 && (fresh || plain)) {
      const double ms = r.res.remote_ms;
      replan_reuse(r, fresh ? r.remote_n_cached : next, plan);
      std::lock_guard<std::mutex> lock(r.mu);
      r.res.remote_ms = ms;
    }
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.n_remote_chunks = h->n;
    return INT64_MAX;
  }
  if (ahead) return f.first_token - next;
  if (!plain) {  // computing would make the fetched chunks unusable for this request: go on without them
    r.remote.reset();
    return INT64_MAX;
  }
  return std::max<int64_t>(1, opt_.chunk_size);
}

void Engine::Impl::apply_reuse_plan(Request::State& r, reuse::PromptPlan& p, StepPlan& plan) {
  // The copy-ins, in the plan's order, then the probe of the rows selective will overwrite.
  for (reuse::CopyIn& ci : p.copy_ins) {
    runner_->copy_in(r.seq, ci, chunks_->shape());
    plan.copy_ins.push_back({r.seq, std::move(ci)});
  }
  r.probe_rows = std::move(p.probe_rows);
  r.probe_kv = r.probe_rows.empty() ? std::vector<float>{} : runner_->snapshot_rows(r.seq, r.probe_rows);
  r.chunks = std::move(p.chunks);
  r.chunk_keys = std::move(p.chunk_keys);
  r.chunk_src = std::move(p.chunk_src);
  r.exact_limit = p.exact_limit;
  r.context_limit = p.context_limit;
  r.approx = p.approximate();
  r.guard_from = p.frontier;
  r.first_approx = p.first_approx;
  r.run_starts = std::move(p.run_starts);
  r.rung = p.rung;
  r.blend = false;
  r.todo = std::move(p.todo);
  r.todo_next = 0;
  if (p.blend) setup_blend(r, std::move(p.blend_plan));
  r.pos_state = std::move(p.pos_state);
  std::lock_guard<std::mutex> lock(r.mu);
  if (p.n_remote_chunks || p.remote_ms > 0) r.res.n_remote_chunks = p.n_remote_chunks, r.res.remote_ms = p.remote_ms;
  r.res.n_cached = p.n_cached;
  r.res.n_reused = p.n_reused;
  r.res.n_recomputed = p.n_recomputed;
  r.res.n_new = p.n_new;
}

// The selective step's repaired rows, after its prefill: the mean over rows and layers of
// ||fresh - cached||² / ||fresh||² for K plus the same for V (CacheBlend's deviation measure).
// The rows that selective leaves reused moved by as much as these, roughly, when the new
// context matters to them; so a large value says the approximation is poor. NaN: no probe.
float Engine::Impl::repaired_deviation(Request::State& r) const {
  if (r.probe_rows.empty()) return NAN;
  const float d = runner_->deviation(r.seq, r.probe_rows, r.probe_kv);
  r.probe_rows.clear();
  r.probe_kv.clear();
  return d;
}

// The prefill of a prompt with approximate K/V is done and its logits are in r.logits. When the
// first token is a close call (top-1 lead under the guard's threshold for the repair that ran),
// the request escalates and true is returned (it stays in its prefill): ReuseMode::kAuto after
// selective runs a CacheBlend pass over the approximate span, whose candidates keep the K/V the
// selective pass left unless their deviation picks them; otherwise the approximate span
// [first_approx, n) is planned again as an ordinary prefill, which overwrites every approximate
// K/V with the full prefill's (positions before it are exact already: the exact prefix and new
// tokens that attended only to it), giving the full prefill's logits up to float rounding. Its
// chunks are then stored under prefix keys. When that prefill is done, the next call learns how
// far each tripped step's lead was from the full prefill's (the adaptive guard's error samples).
bool Engine::Impl::guard_trips(Request::State& r) {
  auto top_two = [&](int32_t* ia, int32_t* ib) {
    float a = -INFINITY, b = -INFINITY;
    *ia = *ib = 0;
    for (size_t i = 0; i < r.logits.size(); ++i) {
      const float x = r.logits[i];
      if (x > a) b = a, *ib = *ia, a = x, *ia = int32_t(i);
      else if (x > b) b = x, *ib = int32_t(i);
    }
    return a - b;
  };
  if (r.guard_pending) {  // the exact recompute is done
    r.guard_pending = false;
    int32_t ia, ib;
    const float lead = top_two(&ia, &ib);
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (!r.res.reuse_steps.empty()) r.res.reuse_steps.back().lead = lead;
    }
    if (r.opt.reuse.guard_risk > 0) guard_learn(r);
    r.guard_checks.clear();
    return false;
  }
  if (!r.approx || !r.res.output_ids.empty()) return false;
  int32_t ia, ib;
  const float lead = top_two(&ia, &ib);
  const float deviation = repaired_deviation(r);
  const ReusePolicy& p = r.opt.reuse;
  const ReuseMode rung = r.rung;
  const float limit = guard_.threshold(rung, p);
  const bool trip = lead < limit;  // (0: off)
  if (limit > 0) guard_.record_check(rung, trip);
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.first_lead = lead;
    r.res.guard_lead = limit;
    r.res.approximate = true;
    r.res.reuse_steps.push_back({reuse_mode_name(rung), r.blend ? r.blend_rows : int64_t(r.todo.size()), lead, limit, !trip, deviation});
  }
  if (!trip) {
    // guard_tokens > 1: the next tokens are checked too, held back until they pass (guard_tokens.cpp)
    if (p.guard_tokens > 1 && limit > 0) hold_begin(r, p.guard_tokens, limit);
    else r.approx = false;
    return false;
  }
  r.guard_checks.push_back({rung, {ia, ib}, lead});
  guard_escalate(r, guard_next_rung(r, rung));
  return true;
}

ReuseMode Engine::Impl::guard_next_rung(Request::State& r, ReuseMode rung) {
  const ReusePolicy& p = r.opt.reuse;
  // auto after selective: the CacheBlend step only when it is worth its cost, c_blend + p_blend
  // c_full < c_full (p_blend: how often that step has tripped). A guard strict enough that
  // CacheBlend rarely stands would otherwise pay for it on top of the recompute on every
  // close call (2026-12-01: needle prompts whose first tokens are near ties).
  ReuseMode to = ReuseMode::kPrefixOnly;
  if (p.mode == ReuseMode::kAuto && rung == ReuseMode::kSelective) {
    const int64_t n = int64_t(r.context.size());
    int64_t n_new = 0, n_approx = 0;
    for (int64_t q = r.first_approx; q < n; ++q) n_new += r.pos_state[size_t(q)] == 0, n_approx += r.pos_state[size_t(q)] == 2;
    if (reuse::blend_step_pays(model_->config().n_layers, n - r.first_approx, n_new, n_approx,
                               guard_.trip_rate(ReuseMode::kCacheBlend)))
      to = ReuseMode::kCacheBlend;
  }
  return to;
}

// to: kCacheBlend (the ladder's middle step) or kPrefixOnly (the exact recompute of the span).
void Engine::Impl::guard_escalate(Request::State& r, ReuseMode to) {
  const int64_t n = int64_t(r.context.size());
  if (to == ReuseMode::kCacheBlend) {
    // Run starts are not forced again: the selective pass recomputed them.
    setup_blend(r, reuse::plan_blend(r.opt.reuse, r.pos_state, r.first_approx, {}));
    r.rung = ReuseMode::kCacheBlend;
    return;
  }
  r.approx = false;
  r.guard_pending = true;
  r.blend = false;
  r.todo.clear();
  r.todo_next = 0;
  int64_t n_recomputed = 0;
  for (int64_t q = r.first_approx; q < n; ++q) {
    r.todo.push_back(int32_t(q));
    n_recomputed += r.pos_state[size_t(q)] != 0;
  }
  r.exact_limit = r.context_limit = INT64_MAX;
  for (size_t i = 0; i < r.chunks.size(); ++i)
    if (r.chunks[i].end > r.first_approx && (r.chunk_src[i] == Src::kStoreContent || r.chunk_src[i] == Src::kStorePrefix))
      r.chunk_src[i] = Src::kComputed;
  std::lock_guard<std::mutex> lock(r.mu);
  r.res.guarded = true;
  r.res.n_recomputed = n_recomputed;
  r.res.reuse_steps.push_back({"recompute", n - r.first_approx, 0, 0, true});
}

// r.logits are the full prefill's now: the error of each tripped step's lead of its own top two
// tokens (approximate minus full; positive: the reuse overstated the lead).
void Engine::Impl::guard_learn(Request::State& r) {
  for (const auto& g : r.guard_checks) {
    const float exact = r.logits[size_t(g.top[0])] - r.logits[size_t(g.top[1])];
    guard_.observe(g.mode, g.lead - exact);
  }
  if (!guard_file_.empty()) {
    try {
      save_guard_calibration(guard_file_);
    } catch (const Error& e) {
      std::fprintf(stderr, "kvboost: warning: guard calibration not saved: %s\n", e.what());
    }
  }
}

Engine::GuardCalibration Engine::Impl::guard_calibration() const { return guard_.calibration(); }
void Engine::Impl::guard_observe(ReuseMode mode, float error) { guard_.observe(mode, error); }
void Engine::Impl::save_guard_calibration(const std::string& path) const { guard_.save(path, model_id_); }
void Engine::Impl::load_guard_calibration(const std::string& path) { guard_.load(path, model_id_); }

void Engine::Impl::store_chunks(Request::State& r) {
  if (!chunks_ || !r.opt.reuse.store || !r.opt.prefix_cache || !opt_.cold_dir.empty() || !kv_->has_seq(r.seq)) return;
  const kv::ChunkShape& shape = chunks_->shape();
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const auto& ch = r.chunks[i];
    if (r.chunk_src[i] == Src::kStoreContent || r.chunk_src[i] == Src::kStorePrefix) continue;
    const bool exact = ch.end <= r.context_limit;
    kv::ChunkKeys keys = r.chunk_keys[i];
    if (!exact) {  // computed after K/V of another context: content only, under this request's repair settings
      keys.prefix = keys.check = 0;
      keys.content = reuse::dirty_content_key(model_id_, r.opt.reuse, r.ns, std::span<const int32_t>(r.context.data() + ch.begin, size_t(ch.end - ch.begin)));
    }
    if (exact ? chunks_->contains_prefix(keys.prefix) : chunks_->contains_content(keys.content)) {
      if (!r.opt.reuse.pin) continue;
    }
    auto chunk = std::make_shared<kv::Chunk>();
    const int64_t len = ch.end - ch.begin;
    chunk->tokens.assign(r.context.begin() + ch.begin, r.context.begin() + ch.end);
    chunk->pos0 = ch.begin;
    chunk->keys = keys;
    chunk->parent_prefix = i > 0 ? r.chunk_keys[i - 1].prefix : 0;
    kv::chunk_init(*chunk, shape, chunks_->options().quant, len);
    runner_->read_chunk(r.seq, ch.begin, len, shape, *chunk);
    if (!chunks_->put(std::move(chunk), r.opt.reuse.pin, r.ns, r.opt.reuse.pin_owner)) ++r.res.n_pin_refused;
  }
}

}  // namespace kvboost
