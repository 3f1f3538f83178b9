// Chunk-level KV reuse at admission (plan_reuse) and after the prefill (store_chunks).
//
// Plan: the exact prefix comes from the paged block cache (zero copy) and then from chunk-store
// prefix keys (exact K/V, copied in). The first chunk that misses breaks the prefix chain; from
// there, chunks found by content key are copied in with their keys re-rotated to the new
// position (approximate: their K/V attended to a different context), the rest is computed.
// Repair then picks what to recompute among reused tokens: nothing (none), the first R tokens of
// each reused run (selective, EPIC), or the most deviated fraction (cacheblend, in one pass).
// Positions from the first approximate token on are never registered as exact prefix K/V.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "request.h"

namespace kvboost {

using Src = Request::State::ChunkSrc;

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

namespace {
// The repair settings that decide which tokens a request recomputes. A chunk computed after
// approximate K/V (a content entry stored by store_chunks past the first content hit) holds
// bytes that depend on them, so such entries are keyed with them too (dirty_content_key): a
// request finds them only under its own settings, and clean content entries (computed in an
// exact context) under any.
std::string repair_tag(const ReusePolicy& p) {
  char b[256];
  std::snprintf(b, sizeof b, "\x01repair:%s/%lld/%lld/%lld/%.9g/%lld/%lld/%.9g/%lld", reuse_mode_name(p.mode),
                (long long)p.repair_tokens, (long long)p.overlap_tokens, (long long)p.sink_tokens, double(p.blend_ratio),
                (long long)p.blend_check_layer, (long long)p.blend_run_starts, double(p.blend_first_ratio),
                (long long)p.blend_taper_layers);
  return b;
}
uint64_t dirty_content_key(const std::string& model_id, const Request::State& r, std::span<const int32_t> toks) {
  const uint64_t root = kv::chunk_root(model_id + repair_tag(r.opt.reuse), r.ns);
  return kv::chunk_keys(kv::chunk_first_keys(root), root, toks).content;
}
// One CacheBlend pass over [from, n): approximate positions past the sink tokens are candidates,
// the rest are computed in every layer. The first blend_run_starts tokens of each run in
// `starts` leave the candidates first, out of the same budget (the ratio over the remaining
// candidates shrinks so that the total stays the same).
void setup_blend(Request::State& r, int64_t from, const std::vector<int64_t>& starts) {
  const ReusePolicy& pol = r.opt.reuse;
  const int64_t n = int64_t(r.context.size());
  r.blend = true;
  r.blend_from = from;
  r.reused.assign(size_t(n - from), 0);
  for (int64_t p = from; p < n; ++p) r.reused[size_t(p - from)] = r.pos_state[size_t(p)] == 2 && p >= pol.sink_tokens;
  int64_t n_cand = 0, n_forced = 0;
  for (uint8_t x : r.reused) n_cand += x;
  const double budget = std::ceil(double(pol.blend_ratio) * double(n_cand));
  for (int64_t s : starts)
    for (int64_t p = std::max(s, from); p < std::min(s + pol.blend_run_starts, n) && n_forced < budget; ++p)
      if (r.reused[size_t(p - from)]) r.reused[size_t(p - from)] = 0, ++n_forced;
  const int64_t left = n_cand - n_forced;
  r.blend_forced = n_forced;
  auto share = [&](double b) { return left > 0 ? float(std::clamp((b - double(n_forced)) / double(left), 0.0, 1.0)) : 0.0f; };
  r.blend_ratio = share(budget);
  r.blend_first_ratio = share(std::ceil(double(pol.blend_first_ratio) * double(n_cand)));
  r.todo.clear();
  r.todo_next = 0;
}
}  // namespace

// ReuseMode::kAuto's first step: the rung whose expected cost, escalations included, is the
// least. Costs are in rows (one token through every layer): selective computes sel_rows;
// CacheBlend computes the span through the layers up to its check layer, then the new tokens
// plus its budget; the exact recompute computes the span. The chance that a step trips the
// guard is estimated from the steps checked so far (Laplace's rule: (tripped + 1) / (checked + 2)),
// so a model whose selective repair keeps tripping starts at CacheBlend.
namespace {
// CacheBlend's cost in rows over an approximate span of `span` positions, n_new of them new and
// n_approx reused (the default settings: the span to the check layer, then the new tokens and
// the budgets).
double blend_cost(int64_t n_layers, int64_t span, int64_t n_new, int64_t n_approx) {
  const ReusePolicy def;
  const double L = double(std::max<int64_t>(1, n_layers)), check = double(std::min<int64_t>(def.blend_check_layer, n_layers));
  return (double(span) * check + double(n_new) * (L - check) +
          std::max(def.blend_first_ratio, def.blend_ratio) * double(n_approx) * double(def.blend_taper_layers) +
          def.blend_ratio * double(n_approx) * std::max(0.0, L - check - double(def.blend_taper_layers))) / L;
}
}  // namespace

double Engine::guard_trip_rate(ReuseMode m) const {
  std::lock_guard<std::mutex> lock(guard_mu_);
  return double(guard_.n_tripped[size_t(m)] + 1) / double(guard_.n_checked[size_t(m)] + 2);
}

ReuseMode Engine::auto_first_rung(int64_t sel_rows, int64_t span, int64_t n_new, int64_t n_approx) const {
  const double c_blend = blend_cost(model_->config().n_layers, span, n_new, n_approx);
  const double c_full = double(span);
  const double p_sel = guard_trip_rate(ReuseMode::kSelective), p_blend = guard_trip_rate(ReuseMode::kCacheBlend);
  const double e_sel = double(sel_rows) + p_sel * (c_blend + p_blend * c_full);
  const double e_blend = c_blend + p_blend * c_full;
  return e_sel <= e_blend ? ReuseMode::kSelective : ReuseMode::kCacheBlend;
}

void Engine::plan_reuse(Request::State& r, int64_t n_cached) {
  const ModelConfig& c = model_->config();
  const ReusePolicy& pol = r.opt.reuse;
  const int64_t n = int64_t(r.context.size());
  const int64_t nkv = c.n_kv_heads * c.head_dim;
  // A natural break before token p: the previous token's text ends a line or a sentence.
  auto is_break = [&](int64_t p) {
    const std::string t = tok_.decode({r.context[size_t(p - 1)]});
    return !t.empty() && (t.back() == '\n' || t.back() == '.' || t.back() == '?' || t.back() == '!' ||
                          (t.size() >= 2 && t[t.size() - 2] == '.' && t.back() == ' '));
  };
  r.chunks = kv::cut_chunks(n, r.opt.segment_starts, opt_.chunk_size, opt_.chunk_window, is_break);
  r.chunk_keys.clear();
  r.chunk_src.assign(r.chunks.size(), Src::kComputed);
  const uint64_t root = kv::chunk_root(model_id_, r.ns);
  kv::ChunkKeys prev = kv::chunk_first_keys(root);
  for (const auto& ch : r.chunks) {
    prev = kv::chunk_keys(prev, root, std::span<const int32_t>(r.context.data() + ch.begin, size_t(ch.end - ch.begin)));
    r.chunk_keys.push_back(prev);
  }
  // state per position: 0 new, 1 exact (cached), 2 reused at another position (approximate)
  std::vector<uint8_t> state(size_t(n), 0);
  std::fill(state.begin(), state.begin() + n_cached, 1);
  std::vector<int64_t> run_starts;  // first positions of runs of approximate reused chunks
  const bool lookups = chunks_ && opt_.cold_dir.empty() && r.opt.prefix_cache;
  bool exact = true;
  int64_t frontier = n_cached;
  const kv::ChunkShape& shape = chunks_ ? chunks_->shape() : kv::ChunkShape{};
  std::vector<float> kbuf, vbuf;
  const kv::KvLayout kvl = store_->layout(kv_->block_table(r.seq).data());
  // Rows [from, begin + len) of a stored chunk into the sequence's slots, keys re-rotated from
  // the chunk's position to `begin`.
  auto copy_in = [&](const kv::Chunk& ch, int64_t begin, int64_t from) {
    const int64_t len = int64_t(ch.tokens.size()), delta = begin - ch.pos0, t0 = std::max<int64_t>(0, from - begin);
    kbuf.resize(size_t(len * nkv)), vbuf.resize(size_t(len * nkv));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      kv::chunk_get_layer(ch, shape, l, kbuf.data(), vbuf.data());
      kvl.write_rows(l, begin + t0, len - t0, kbuf.data() + t0 * nkv, vbuf.data() + t0 * nkv);
      kvl.rotate_keys(l, begin + t0, len - t0, model_->rope_inv_freq(l).data(), delta);
    }
  };
  if (lookups && chunks_->has_remote()) {  // the remote tier: one round trip for the whole prompt
    std::vector<kv::ChunkQuery> q;
    for (size_t i = 0; i < r.chunks.size(); ++i)
      if (r.chunks[i].end > n_cached)
        q.push_back({r.chunk_keys[i], std::span<const int32_t>(r.context.data() + r.chunks[i].begin,
                                                               size_t(r.chunks[i].end - r.chunks[i].begin))});
    const double t0 = now_ms();
    const int64_t got = chunks_->fetch_remote(r.ns, q, pol.mode != ReuseMode::kPrefixOnly);
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.n_remote_chunks = got;
    r.res.remote_ms = now_ms() - t0;
  }
  const kv::Chunk* last_hit = nullptr;  // previous chunk, when it was a content hit
  std::vector<std::shared_ptr<const kv::Chunk>> keep;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const auto& ch = r.chunks[i];
    const std::span<const int32_t> toks(r.context.data() + ch.begin, size_t(ch.end - ch.begin));
    if (ch.end <= n_cached) {
      r.chunk_src[i] = Src::kBlockCache;
      continue;
    }
    if (!lookups) break;
    const kv::Chunk* hit_now = nullptr;
    std::shared_ptr<const kv::Chunk> hit;
    if (exact && (hit = chunks_->find_prefix(r.chunk_keys[i], toks))) {
      copy_in(*hit, ch.begin, n_cached);
      // Quantized K/V are at the right position and context but not bit-exact: approximate.
      const bool lossless = hit->quant == kv::KvQuant::kF32;
      std::fill(state.begin() + std::max(ch.begin, n_cached), state.begin() + ch.end, lossless ? 1 : 2);
      if (lossless && frontier == std::max(ch.begin, n_cached)) frontier = ch.end;
      r.chunk_src[i] = Src::kStorePrefix;
      continue;
    }
    exact = false;
    if (pol.mode != ReuseMode::kPrefixOnly &&
        ((hit = chunks_->find_content(r.chunk_keys[i].content, toks)) ||
         (hit = chunks_->find_content(dirty_content_key(model_id_, r, toks), toks)))) {
      copy_in(*hit, ch.begin, n_cached);
      std::fill(state.begin() + std::max(ch.begin, n_cached), state.begin() + ch.end, 2);
      r.chunk_src[i] = Src::kStoreContent;
      // A run continues when this chunk followed the previous hit when it was computed, at the
      // same offset: their mutual attention is still right; only the run's start needs repair.
      const bool continues = last_hit && hit->parent_prefix == last_hit->keys.prefix &&
                             hit->pos0 - last_hit->pos0 == ch.begin - r.chunks[i - 1].begin;
      if (!continues) run_starts.push_back(std::max(ch.begin, n_cached));
      hit_now = hit.get();
      keep.push_back(hit);
    }
    last_hit = hit_now;
  }
  // The last token always runs: it produces the logits.
  int64_t first_approx = n;
  for (int64_t p = 0; p < n; ++p)
    if (state[size_t(p)] == 2) {
      first_approx = p;
      break;
    }
  // Without approximate positions everything computed after the prompt (the generated tokens)
  // is exact too, and may become prefix-cache entries: the next chat turn reuses the answer.
  r.exact_limit = first_approx < n ? first_approx : INT64_MAX;
  r.approx = first_approx < n;
  r.guard_from = frontier;
  r.context_limit = INT64_MAX;
  for (size_t i = 0; i < r.chunks.size(); ++i)
    if (r.chunk_src[i] == Src::kStoreContent) {
      r.context_limit = std::max(r.chunks[i].begin, n_cached);
      break;
    }
  std::vector<uint8_t> compute(size_t(n), 0);
  for (int64_t p = frontier; p < n; ++p) compute[size_t(p)] = state[size_t(p)] == 0;  // new tokens
  compute[size_t(n - 1)] = 1;
  int64_t n_exact = 0, n_approx = 0;
  for (int64_t p = 0; p < n; ++p) n_exact += state[size_t(p)] == 1, n_approx += state[size_t(p)] == 2;
  int64_t n_recomputed = 0;
  r.pos_state = state;
  r.first_approx = first_approx;
  r.run_starts = run_starts;
  // The selective repair's rows: the run starts (and overlap, sink) among the approximate ones.
  std::vector<uint8_t> sel = compute;
  auto mark = [&](int64_t a, int64_t b) {
    for (int64_t p = std::max<int64_t>(a, 0); p < std::min(b, n); ++p)
      if (state[size_t(p)] == 2) sel[size_t(p)] = 1;
  };
  for (int64_t s : run_starts) mark(s - pol.overlap_tokens, s + pol.repair_tokens);
  mark(0, pol.sink_tokens);
  ReuseMode mode = pol.mode;
  if (mode == ReuseMode::kAuto) {
    int64_t sel_rows = 0, n_new_after = 0;
    for (int64_t p = first_approx; p < n; ++p) sel_rows += sel[size_t(p)], n_new_after += state[size_t(p)] == 0;
    mode = n_approx > 0 ? auto_first_rung(sel_rows, n - first_approx, n_new_after, n_approx) : ReuseMode::kPrefixOnly;
  }
  r.rung = mode;
  if (n_approx > 0 && mode == ReuseMode::kSelective) {
    compute = sel;
    // The probe: the reused K/V of the approximate rows selective recomputes, before the
    // prefill overwrites them (repaired_deviation compares them with the fresh ones).
    r.probe_rows.clear();
    for (int64_t p = first_approx; p < n; ++p)
      if (sel[size_t(p)] && state[size_t(p)] == 2 && p != n - 1) r.probe_rows.push_back(p);
    r.probe_kv.resize(r.probe_rows.size() * size_t(c.n_layers) * size_t(2 * nkv));
    float* out = r.probe_kv.data();
    const kv::KvLayout lay = store_->layout(kv_->block_table(r.seq).data());
    for (int64_t p : r.probe_rows) {
      for (int64_t l = 0; l < c.n_layers; ++l, out += 2 * nkv) {
        std::memcpy(out, lay.k_row(l, p), size_t(nkv) * sizeof(float));
        std::memcpy(out + nkv, lay.v_row(l, p), size_t(nkv) * sizeof(float));
      }
    }
  }
  if (n_approx > 0 && mode == ReuseMode::kCacheBlend) setup_blend(r, frontier, run_starts);
  r.todo.clear();
  r.todo_next = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (!compute[size_t(p)]) continue;
    r.todo.push_back(int32_t(p));
    if (state[size_t(p)] != 0) ++n_recomputed;
  }
  if (r.blend) r.todo.clear();
  std::lock_guard<std::mutex> lock(r.mu);
  r.res.n_cached = std::min(frontier, n - 1);  // the last token is always computed
  r.res.n_reused = n_exact + n_approx;
  r.res.n_recomputed = r.blend ? 0 : n_recomputed;
  r.res.n_new = n - n_exact - n_approx;
}

namespace {
// Regularized incomplete beta I_x(a, b) by its continued fraction (modified Lentz), the form
// of Numerical Recipes' betai: the series for x < (a + 1) / (a + b + 2), the symmetry otherwise.
double beta_cf(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
  double h = d;
  auto step = [&](double aa) {  // one term of the fraction; returns the factor it applied
    d = 1 + aa * d;
    d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    h *= d * c;
    return d * c;
  };
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    step(m * (b - m) * x / ((qam + m2) * (a + m2)));
    if (std::fabs(step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))) - 1) < kEps) break;
  }
  return h;
}
// y = 1 - x, passed separately so that x near 1 keeps its precision.
double beta_inc(double a, double b, double x, double y) {
  if (x <= 0) return 0;
  if (y <= 0) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log(y));
  return x < (a + 1) / (a + b + 2) ? front * beta_cf(a, b, x) / a : 1 - front * beta_cf(b, a, y) / b;
}
// P(T <= t) for Student's t with nu degrees of freedom.
double student_t_cdf(double t, double nu) {
  const double tail = 0.5 * beta_inc(nu / 2, 0.5, nu / (nu + t * t), t * t / (nu + t * t));
  return t > 0 ? 1 - tail : tail;
}
}  // namespace

double student_t_quantile(double p, double nu) {
  if (!(p > 0 && p < 1) || !(nu > 0)) fail("student_t_quantile: p ", p, " must be in (0, 1) and nu ", nu, " positive");
  double lo = -1, hi = 1;  // bracket, then bisect: the CDF is monotone
  while (student_t_cdf(lo, nu) > p) lo *= 2;
  while (student_t_cdf(hi, nu) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, nu) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

float guard_threshold(std::span<const float> errors, float risk, float fallback) {
  const size_t n = errors.size();
  if (n < kGuardMinErrors) return fallback;
  if (risk >= 1) return 0;
  std::vector<float> e(errors.begin(), errors.end());
  std::nth_element(e.begin(), e.begin() + ptrdiff_t(n / 2), e.end());
  const double m = n % 2 ? e[n / 2] : 0.5 * (double(e[n / 2]) + double(*std::max_element(e.begin(), e.begin() + ptrdiff_t(n / 2))));
  double ss = 0;
  for (float x : errors) ss += (double(x) - m) * (double(x) - m);
  const double spread = std::sqrt(ss / double(n - 1)) * std::sqrt(1 + 1.0 / double(n));
  const double L = m + spread * student_t_quantile(1 - double(risk), double(n - 1));
  return float(std::clamp(L, 0.0, double(kGuardMaxLead)));
}

namespace {
void remember(std::vector<float>& v, float x) {
  if (v.size() >= kGuardWindow) v.erase(v.begin());
  v.push_back(x);
}
}  // namespace

// The selective step's repaired rows, after its prefill: the mean over rows and layers of
// ||fresh - cached||² / ||fresh||² for K plus the same for V (CacheBlend's deviation measure).
// The rows that selective leaves reused moved by as much as these, roughly, when the new
// context matters to them; so a large value says the approximation is poor. NaN: no probe.
float Engine::repaired_deviation(Request::State& r) const {
  if (r.probe_rows.empty()) return NAN;
  const ModelConfig& c = model_->config();
  const int64_t nkv = c.n_kv_heads * c.head_dim;
  const kv::KvLayout lay = store_->layout(kv_->block_table(r.seq).data());
  const float* cached = r.probe_kv.data();
  double sum = 0;
  int64_t n_terms = 0;
  for (int64_t p : r.probe_rows) {
    for (int64_t l = 0; l < c.n_layers; ++l, cached += 2 * nkv) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* fresh = kv ? lay.v_row(l, p) : lay.k_row(l, p);
        const float* old = cached + kv * nkv;
        double d = 0, f = 0;
        for (int64_t j = 0; j < nkv; ++j) d += double(fresh[j] - old[j]) * double(fresh[j] - old[j]), f += double(fresh[j]) * double(fresh[j]);
        sum += f > 0 ? d / f : 0;
      }
      ++n_terms;
    }
  }
  r.probe_rows.clear();
  r.probe_kv.clear();
  return float(sum / double(std::max<int64_t>(1, n_terms)));
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
bool Engine::guard_trips(Request::State& r) {
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
  float limit = p.guard_lead;
  if (limit > 0 && p.guard_risk > 0) {
    std::lock_guard<std::mutex> lock(guard_mu_);
    limit = guard_threshold(guard_.errors[size_t(rung)], p.guard_risk, limit);
  }
  const bool trip = lead < limit;  // (0: off)
  if (limit > 0) {
    std::lock_guard<std::mutex> lock(guard_mu_);
    ++guard_.n_checked[size_t(rung)];
    guard_.n_tripped[size_t(rung)] += trip;
  }
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

ReuseMode Engine::guard_next_rung(Request::State& r, ReuseMode rung) {
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
    const double c_full = double(n - r.first_approx);
    const double c_blend = blend_cost(model_->config().n_layers, n - r.first_approx, n_new, n_approx);
    if (c_blend + guard_trip_rate(ReuseMode::kCacheBlend) * c_full < c_full) to = ReuseMode::kCacheBlend;
  }
  return to;
}

// to: kCacheBlend (the ladder's middle step) or kPrefixOnly (the exact recompute of the span).
void Engine::guard_escalate(Request::State& r, ReuseMode to) {
  const int64_t n = int64_t(r.context.size());
  if (to == ReuseMode::kCacheBlend) {
    // Run starts are not forced again: the selective pass recomputed them.
    setup_blend(r, r.first_approx, {});
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
void Engine::guard_learn(Request::State& r) {
  {
    std::lock_guard<std::mutex> lock(guard_mu_);
    for (const auto& g : r.guard_checks) {
      const float exact = r.logits[size_t(g.top[0])] - r.logits[size_t(g.top[1])];
      remember(guard_.errors[size_t(g.mode)], g.lead - exact);
    }
  }
  if (!guard_file_.empty()) {
    try {
      save_guard_calibration(guard_file_);
    } catch (const Error& e) {
      std::fprintf(stderr, "kvboost: warning: guard calibration not saved: %s\n", e.what());
    }
  }
}

Engine::GuardCalibration Engine::guard_calibration() const {
  std::lock_guard<std::mutex> lock(guard_mu_);
  return guard_;
}

void Engine::guard_observe(ReuseMode mode, float error) {
  if (mode == ReuseMode::kAuto) fail("guard_observe: an error sample belongs to one repair (not auto)");
  std::lock_guard<std::mutex> lock(guard_mu_);
  remember(guard_.errors[size_t(mode)], error);
}

void Engine::store_chunks(Request::State& r) {
  if (!chunks_ || !r.opt.reuse.store || !r.opt.prefix_cache || !opt_.cold_dir.empty() || !kv_->has_seq(r.seq)) return;
  const ModelConfig& c = model_->config();
  const int64_t nkv = c.n_kv_heads * c.head_dim;
  const kv::KvLayout kvl = store_->layout(kv_->block_table(r.seq).data());
  const kv::ChunkShape& shape = chunks_->shape();
  std::vector<float> kbuf, vbuf;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const auto& ch = r.chunks[i];
    if (r.chunk_src[i] == Src::kStoreContent || r.chunk_src[i] == Src::kStorePrefix) continue;
    const bool exact = ch.end <= r.context_limit;
    kv::ChunkKeys keys = r.chunk_keys[i];
    if (!exact) {  // computed after K/V of another context: content only, under this request's repair settings
      keys.prefix = keys.check = 0;
      keys.content = dirty_content_key(model_id_, r, std::span<const int32_t>(r.context.data() + ch.begin, size_t(ch.end - ch.begin)));
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
    kbuf.resize(size_t(len * nkv)), vbuf.resize(size_t(len * nkv));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      kvl.read_rows(l, ch.begin, len, kbuf.data(), vbuf.data());
      kv::chunk_put_layer(*chunk, shape, l, kbuf.data(), vbuf.data());
    }
    if (!chunks_->put(std::move(chunk), r.opt.reuse.pin, r.ns, r.opt.reuse.pin_owner)) ++r.res.n_pin_refused;
  }
}

}  // namespace kvboost
