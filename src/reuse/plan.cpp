// The plan of a prompt (reuse::plan_prompt): the exact prefix comes from the paged block cache
// (zero copy) and then from chunk-store prefix keys (exact K/V, copied in). The first chunk
// that misses breaks the prefix chain; from there, chunks found by content key are copied in
// with their keys re-rotated to the new position (approximate: their K/V attended to a
// different context), the rest is computed. Repair then picks what to recompute among reused
// tokens: nothing (none), the first R tokens of each reused run (selective, EPIC), or the most
// deviated fraction (cacheblend, in one pass). Positions from the first approximate token on
// are never registered as exact prefix K/V.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kvboost/common.h"
#include "kvboost/reuse.h"

namespace kvboost {

const char* reuse_mode_name(ReuseMode m) {
  switch (m) {
    case ReuseMode::kPrefixOnly: return "prefix";
    case ReuseMode::kNone: return "none";
    case ReuseMode::kSelective: return "selective";
    case ReuseMode::kCacheBlend: return "cacheblend";
    case ReuseMode::kAuto: return "auto";
  }
  return "?";
}

ReuseMode parse_reuse_mode(std::string_view s) {
  if (s == "auto") return ReuseMode::kAuto;
  if (s == "prefix") return ReuseMode::kPrefixOnly;
  if (s == "none") return ReuseMode::kNone;
  if (s == "selective" || s == "epic") return ReuseMode::kSelective;
  if (s == "cacheblend" || s == "blend") return ReuseMode::kCacheBlend;
  fail("unknown reuse strategy \"", s, "\" (expected auto, prefix, none, selective or cacheblend)");
}

namespace reuse {

std::string repair_tag(const ReusePolicy& p) {
  char b[256];
  std::snprintf(b, sizeof b, "\x01repair:%s/%lld/%lld/%lld/%.9g/%lld/%lld/%.9g/%lld", reuse_mode_name(p.mode),
                (long long)p.repair_tokens, (long long)p.overlap_tokens, (long long)p.sink_tokens, double(p.blend_ratio),
                (long long)p.blend_check_layer, (long long)p.blend_run_starts, double(p.blend_first_ratio),
                (long long)p.blend_taper_layers);
  return b;
}

uint64_t dirty_content_key(const std::string& model_id, const ReusePolicy& p, std::string_view ns,
                           std::span<const int32_t> tokens) {
  const uint64_t root = kv::chunk_root(model_id + repair_tag(p), ns);
  return kv::chunk_keys(kv::chunk_first_keys(root), root, tokens).content;
}

BlendPlan plan_blend(const ReusePolicy& pol, std::span<const uint8_t> pos_state, int64_t from,
                     std::span<const int64_t> starts) {
  const int64_t n = int64_t(pos_state.size());
  BlendPlan b;
  b.from = from;
  b.reused.assign(size_t(std::max<int64_t>(0, n - from)), 0);
  for (int64_t p = from; p < n; ++p) b.reused[size_t(p - from)] = pos_state[size_t(p)] == kApprox && p >= pol.sink_tokens;
  int64_t n_cand = 0, n_forced = 0;
  for (uint8_t x : b.reused) n_cand += x;
  const double budget = std::ceil(double(pol.blend_ratio) * double(n_cand));
  for (int64_t s : starts)
    for (int64_t p = std::max(s, from); p < std::min(s + pol.blend_run_starts, n) && n_forced < budget; ++p)
      if (b.reused[size_t(p - from)]) b.reused[size_t(p - from)] = 0, ++n_forced;
  const int64_t left = n_cand - n_forced;
  b.forced = n_forced;
  auto share = [&](double x) { return left > 0 ? float(std::clamp((x - double(n_forced)) / double(left), 0.0, 1.0)) : 0.0f; };
  b.ratio = share(budget);
  b.first_ratio = share(std::ceil(double(pol.blend_first_ratio) * double(n_cand)));
  return b;
}

PromptPlan plan_prompt(const PromptInput& in) {
  if (!in.policy) fail("reuse::plan_prompt: no policy");
  const ReusePolicy& pol = *in.policy;
  const int64_t n = int64_t(in.context.size()), n_cached = in.n_cached;
  PromptPlan out;
  out.chunks = kv::cut_chunks(n, in.segment_starts, in.chunk_size, in.chunk_window, in.is_break);
  out.chunk_src.assign(out.chunks.size(), ChunkSrc::kComputed);
  const uint64_t root = kv::chunk_root(in.model_id, in.ns);
  kv::ChunkKeys prev = kv::chunk_first_keys(root);
  auto tokens_of = [&](const kv::ChunkSpan& ch) {
    return std::span<const int32_t>(in.context.data() + ch.begin, size_t(ch.end - ch.begin));
  };
  for (const auto& ch : out.chunks) {
    prev = kv::chunk_keys(prev, root, tokens_of(ch));
    out.chunk_keys.push_back(prev);
  }
  std::vector<uint8_t> state(size_t(n), kNew);
  std::fill(state.begin(), state.begin() + n_cached, kExact);
  std::vector<int64_t> run_starts;
  kv::ChunkStore* store = in.store;
  bool exact = true;
  int64_t frontier = n_cached;
  if (store && store->has_remote() && in.remote_lookup) {  // the remote tier: one round trip for the whole prompt
    std::vector<kv::ChunkQuery> q;
    for (size_t i = 0; i < out.chunks.size(); ++i)
      if (out.chunks[i].end > n_cached) {
        if (in.remote_async) out.remote_ask.push_back(i);
        else q.push_back({out.chunk_keys[i], tokens_of(out.chunks[i])});
      }
    if (!in.remote_async) {
      const double t0 = now_ms();
      out.n_remote_chunks = store->fetch_remote(in.ns, q, pol.mode != ReuseMode::kPrefixOnly);
      out.remote_ms = now_ms() - t0;
    }
  }
  const std::string model_id(in.model_id);
  const kv::Chunk* last_hit = nullptr;  // previous chunk, when it was a content hit
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const auto& ch = out.chunks[i];
    const std::span<const int32_t> toks = tokens_of(ch);
    if (ch.end <= n_cached) {
      out.chunk_src[i] = ChunkSrc::kBlockCache;
      continue;
    }
    if (!store) break;
    const kv::Chunk* hit_now = nullptr;
    std::shared_ptr<const kv::Chunk> hit;
    if (exact && (hit = store->find_prefix(out.chunk_keys[i], toks))) {
      out.copy_ins.push_back({hit, ch.begin, n_cached});
      // Quantized K/V are at the right position and context but not bit-exact: approximate.
      const bool lossless = hit->quant == kv::KvQuant::kF32;
      std::fill(state.begin() + std::max(ch.begin, n_cached), state.begin() + ch.end, lossless ? kExact : kApprox);
      if (lossless && frontier == std::max(ch.begin, n_cached)) frontier = ch.end;
      out.chunk_src[i] = ChunkSrc::kStorePrefix;
      continue;
    }
    exact = false;
    if (pol.mode != ReuseMode::kPrefixOnly &&
        ((hit = store->find_content(out.chunk_keys[i].content, toks)) ||
         (hit = store->find_content(dirty_content_key(model_id, pol, in.ns, toks), toks)))) {
      out.copy_ins.push_back({hit, ch.begin, n_cached});
      std::fill(state.begin() + std::max(ch.begin, n_cached), state.begin() + ch.end, kApprox);
      out.chunk_src[i] = ChunkSrc::kStoreContent;
      // A run continues when this chunk followed the previous hit when it was computed, at the
      // same offset: their mutual attention is still right; only the run's start needs repair.
      const bool continues = last_hit && hit->parent_prefix == last_hit->keys.prefix &&
                             hit->pos0 - last_hit->pos0 == ch.begin - out.chunks[i - 1].begin;
      if (!continues) run_starts.push_back(std::max(ch.begin, n_cached));
      hit_now = hit.get();
    }
    last_hit = hit_now;
  }
  // The last token always runs: it produces the logits.
  int64_t first_approx = n;
  for (int64_t p = 0; p < n; ++p)
    if (state[size_t(p)] == kApprox) {
      first_approx = p;
      break;
    }
  // Without approximate positions everything computed after the prompt (the generated tokens)
  // is exact too, and may become prefix-cache entries: the next chat turn reuses the answer.
  out.exact_limit = first_approx < n ? first_approx : INT64_MAX;
  out.frontier = frontier;
  out.context_limit = INT64_MAX;
  for (size_t i = 0; i < out.chunks.size(); ++i)
    if (out.chunk_src[i] == ChunkSrc::kStoreContent) {
      out.context_limit = std::max(out.chunks[i].begin, n_cached);
      break;
    }
  std::vector<uint8_t> compute(size_t(n), 0);
  for (int64_t p = frontier; p < n; ++p) compute[size_t(p)] = state[size_t(p)] == kNew;  // new tokens
  if (n > 0) compute[size_t(n - 1)] = 1;
  int64_t n_exact = 0, n_approx = 0;
  for (int64_t p = 0; p < n; ++p) n_exact += state[size_t(p)] == kExact, n_approx += state[size_t(p)] == kApprox;
  // The selective repair's rows: the run starts (and overlap, sink) among the approximate ones.
  std::vector<uint8_t> sel = compute;
  auto mark = [&](int64_t a, int64_t b) {
    for (int64_t p = std::max<int64_t>(a, 0); p < std::min(b, n); ++p)
      if (state[size_t(p)] == kApprox) sel[size_t(p)] = 1;
  };
  for (int64_t s : run_starts) mark(s - pol.overlap_tokens, s + pol.repair_tokens);
  mark(0, pol.sink_tokens);
  ReuseMode mode = pol.mode;
  if (mode == ReuseMode::kAuto) {
    int64_t sel_rows = 0, n_new_after = 0;
    for (int64_t p = first_approx; p < n; ++p) sel_rows += sel[size_t(p)], n_new_after += state[size_t(p)] == kNew;
    const double p_sel = in.guard ? in.guard->trip_rate(ReuseMode::kSelective) : 0.5;
    const double p_blend = in.guard ? in.guard->trip_rate(ReuseMode::kCacheBlend) : 0.5;
    mode = n_approx > 0 ? first_rung(in.n_layers, sel_rows, n - first_approx, n_new_after, n_approx, p_sel, p_blend)
                        : ReuseMode::kPrefixOnly;
  }
  out.rung = mode;
  if (n_approx > 0 && mode == ReuseMode::kSelective) {
    compute = sel;
    // The probe: the reused K/V of the approximate rows selective recomputes, kept before the
    // prefill overwrites them (the engine compares them with the fresh ones).
    for (int64_t p = first_approx; p < n; ++p)
      if (sel[size_t(p)] && state[size_t(p)] == kApprox && p != n - 1) out.probe_rows.push_back(p);
  }
  if (n_approx > 0 && mode == ReuseMode::kCacheBlend) {
    out.blend = true;
    out.blend_plan = plan_blend(pol, state, frontier, run_starts);
  }
  int64_t n_recomputed = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (!compute[size_t(p)]) continue;
    out.todo.push_back(int32_t(p));
    if (state[size_t(p)] != kNew) ++n_recomputed;
  }
  if (out.blend) out.todo.clear();
  out.n_cached = std::min(frontier, n - 1);  // the last token is always computed
  out.n_reused = n_exact + n_approx;
  out.n_recomputed = out.blend ? 0 : n_recomputed;
  out.n_new = n - n_exact - n_approx;
  out.pos_state = std::move(state);
  out.first_approx = first_approx;
  out.run_starts = std::move(run_starts);
  return out;
}

}  // namespace reuse
}  // namespace kvboost
