// The multi-token guard (ReusePolicy::guard_tokens, src/runtime/guard_tokens.cpp): the first K
// generated tokens of a prompt with approximate K/V are held back from the caller until each
// one's lead clears the guard; a close call at a later token discards them and escalates.
// Catches: held text, logprobs or logits reaching the caller before the K tokens passed (or
// twice, or from the discarded run); a stale token of the approximate run kept after an
// escalation at token 2 or later; K/V slots of the discarded tokens left in the sequence.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

// segments joined: each one's tokens, segment starts between them
std::vector<int32_t> join(const Engine& e, const std::vector<std::string>& parts, std::vector<int64_t>* segs) {
  return e.encode_segments(parts, true, segs);
}

struct Seen {  // everything the caller was shown, in order
  GenerateResult res;
  std::string text;
  std::vector<std::vector<float>> logits;
  int n_logprobs = 0;
};
Seen run(Engine& e, const std::vector<int32_t>& ids, GenerateOptions o) {
  Seen s;
  o.on_logits = [&](const float* l, int64_t v) { s.logits.emplace_back(l, l + v); };
  o.on_text = [&](std::string_view t) {
    s.text += t;
    return true;
  };
  o.logprobs = 1;
  o.on_logprob = [&](const TokenLogprob&) { ++s.n_logprobs; };
  s.res = e.generate_ids(ids, o);
  return s;
}

float lead_of(const std::vector<float>& l) {
  std::vector<float> c = l;
  std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
  return c[0] - c[1];
}

float worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float w = 0;
  for (size_t j = 0; j < a.size(); ++j) w = std::max(w, std::fabs(a[j] - b[j]));
  return w;
}

GenerateOptions greedy(const std::vector<int64_t>& segs, int n) {
  GenerateOptions o;
  o.segment_starts = segs;
  o.max_new_tokens = n;
  o.sampling.temperature = 0.0f;
  o.reuse.store = false;
  o.reuse.mode = ReuseMode::kSelective;
  o.reuse.repair_tokens = 4;
  o.reuse.guard_risk = 0;  // the fixed threshold guard_lead
  return o;
}

// The approximate run's per-token leads (guard off); the first token j >= 2 (1-based) whose
// lead is under every lead before it, and a threshold between them: tokens 1..j-1 pass, j trips.
struct LateTrip {
  int j = 0;
  float limit = 0;
};
LateTrip find_late_trip(Engine& e, const std::vector<int32_t>& ids, const std::vector<int64_t>& segs, int k) {
  GenerateOptions off = greedy(segs, k);
  off.reuse.guard_lead = 0;
  const Seen a = run(e, ids, off);
  std::vector<float> l;
  std::string shown;
  for (const auto& x : a.logits) l.push_back(lead_of(x)), shown += " " + std::to_string(l.back());
  std::printf("approximate run's leads:%s\n", shown.c_str());
  auto first_from = [&](size_t start) {
    LateTrip t;
    if (l.size() <= start) return t;
    float lo = *std::min_element(l.begin(), l.begin() + ptrdiff_t(start));
    for (size_t i = start; i < l.size(); lo = std::min(lo, l[i]), ++i)
      if (l[i] < 0.9f * lo) return LateTrip{int(i) + 1, 0.5f * (l[i] + lo)};
    return t;
  };
  LateTrip t = first_from(2);  // after token 2 if there is one
  if (t.j == 0) t = first_from(1);
  return t;
}

// A later token trips: what the caller saw is exactly the run of a first-token trip (the exact
// recompute of the approximate span: same tokens, same logits to float rounding, same text, one
// logprob per token) and the full prefill's tokens, and the result says which token tripped and
// how many were discarded.
// tol: the logits' distance from the full prefill's (f32 stories: rounding; a quantized model's
// recompute of a span runs other kernel shapes than a whole-prompt prefill), which must also be
// well under the approximate run's distance.
void expect_late_trip_is_the_full_prefill(Engine& e, const std::vector<int32_t>& ids, const std::vector<int64_t>& segs, int k,
                                          float tol = 1e-4f) {
  const LateTrip t = find_late_trip(e, ids, segs, k);
  ASSERT_GE(t.j, 2) << "no prompt whose later token is a closer call than the ones before";
  std::printf("trip at token %d, threshold %.4f\n", t.j, double(t.limit));
  GenerateOptions full = greedy(segs, k + 2);
  full.prefix_cache = false;
  const Seen f = run(e, ids, full);
  GenerateOptions o = greedy(segs, k + 2);
  o.reuse.guard_lead = t.limit;
  o.reuse.guard_tokens = k;
  const Seen g = run(e, ids, o);
  ASSERT_EQ(g.res.reuse_steps.size(), 2u);
  EXPECT_EQ(g.res.reuse_steps[0].repair, "selective");
  EXPECT_FALSE(g.res.reuse_steps[0].kept);
  EXPECT_EQ(g.res.reuse_steps[0].checked_tokens, t.j);
  EXPECT_EQ(g.res.reuse_steps[1].repair, "recompute");
  EXPECT_TRUE(g.res.guarded);
  EXPECT_EQ(g.res.n_held_discarded, t.j - 1);
  EXPECT_EQ(g.res.output_ids, f.res.output_ids);
  EXPECT_EQ(g.text, f.text) << "streamed";
  EXPECT_EQ(g.res.text, f.res.text);
  EXPECT_EQ(g.text, g.res.text) << "what was streamed is the result, nothing taken back";
  EXPECT_EQ(g.n_logprobs, int(f.res.output_ids.size()));
  EXPECT_EQ(g.res.logprobs.size(), f.res.output_ids.size());
  // The reference: the same exact recompute of the approximate span, tripped at the first token
  // (guard_tokens 1, a threshold nothing clears). Each shown token's logits are its logits
  // (f32 stories: also the full prefill's to rounding; a quantized model's recompute of a span
  // runs other kernel shapes than a whole-prompt prefill, measured 0.5-0.7 apart on Gemma), and
  // the approximate run's (guard off) are farther from them than tol (else this proves nothing).
  GenerateOptions first = greedy(segs, k + 2);
  first.reuse.guard_lead = 1e9f;
  const Seen ref = run(e, ids, first);
  ASSERT_TRUE(ref.res.guarded);
  EXPECT_EQ(g.res.output_ids, ref.res.output_ids);
  EXPECT_EQ(g.text, ref.text);
  GenerateOptions off = greedy(segs, k + 2);
  off.reuse.guard_lead = 0;
  const Seen a = run(e, ids, off);
  ASSERT_EQ(g.logits.size(), f.logits.size()) << "held logits leaked or were lost";
  ASSERT_EQ(ref.logits.size(), f.logits.size());
  for (size_t i = 0; i < f.logits.size(); ++i) {
    const float d = worst_diff(g.logits[i], ref.logits[i]), da = i < a.logits.size() ? worst_diff(a.logits[i], ref.logits[i]) : NAN;
    std::printf("token %zu: |shown - recompute| %.6f, |approximate - recompute| %.5f, |shown - full| %.5f\n", i + 1,
                double(d), double(da), double(worst_diff(g.logits[i], f.logits[i])));
    EXPECT_LT(d, tol) << "token " << i + 1;
    if (i < size_t(t.j)) EXPECT_GT(da, 2 * tol) << "token " << i + 1;
  }
}

// The system prompt is an exact prefix hit; the document a content hit computed after another
// beginning (approximate).
const char* kDoc0 = " Tom had a red ball. He liked to throw it high in the sky. One day the ball fell in the pond and Tom was sad.";
const char* kDoc1 = " The little dog ran to the park. It saw a big tree and a small bird. The bird sang a happy song for the dog.";
std::vector<int32_t> stories_prompt(Engine& e, std::vector<int64_t>* segs, const std::string& q) {
  e.warm(join(e, {"Here are some stories.", kDoc1}, segs), *segs);
  e.warm(join(e, {"Read this first, then answer.", kDoc0}, segs), *segs);
  return join(e, {"Here are some stories.", kDoc0, q}, segs);
}

EngineOptions small_chunks() {
  EngineOptions eo;
  eo.chunk_size = 32;
  return eo;
}
}  // namespace

TEST(GuardTokens, DefaultAndCliRange) {
  EXPECT_GE(ReusePolicy{}.guard_tokens, 1);
}

// All K leads pass: nothing reaches the caller until the K-th token is decoded, then everything
// in order; the output is the first-token guard's (the same approximate K/V).
TEST(GuardTokens, HeldTokensReachTheCallerOnlyAfterTheKthPassed) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), small_chunks());
  std::vector<int64_t> segs;
  const auto ids = stories_prompt(*e, &segs, " Once upon a time");
  constexpr int kK = 4;
  GenerateOptions o = greedy(segs, 10);
  o.reuse.guard_lead = 1e-6f;  // passes
  o.reuse.guard_tokens = kK;
  std::string streamed;
  int n_logits = 0, n_lp = 0;
  o.on_text = [&](std::string_view t) {
    streamed += t;
    return true;
  };
  o.on_logits = [&](const float*, int64_t) { ++n_logits; };
  o.logprobs = 0;
  o.on_logprob = [&](const TokenLogprob&) { ++n_lp; };
  auto req = e->submit(ids, o);
  int held_steps = 0;
  while (!req->done()) {
    e->step();
    const GenerateResult r = req->result();
    if (!req->done() && r.output_ids.size() < size_t(kK)) {
      EXPECT_TRUE(streamed.empty()) << "text of token " << r.output_ids.size() << " streamed before the guard passed";
      EXPECT_EQ(n_logits, 0);
      EXPECT_EQ(n_lp, 0);
      held_steps += !r.output_ids.empty();
    } else if (!req->done()) {
      EXPECT_EQ(n_logits, int(r.output_ids.size())) << "each held token's logits once, in order";
    }
  }
  const GenerateResult r = req->result();
  EXPECT_GE(held_steps, kK - 1);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(n_logits, int(r.output_ids.size()));
  EXPECT_EQ(n_lp, int(r.output_ids.size()));
  ASSERT_EQ(r.reuse_steps.size(), 1u);
  EXPECT_TRUE(r.reuse_steps[0].kept);
  EXPECT_EQ(r.reuse_steps[0].checked_tokens, kK);
  EXPECT_EQ(r.n_held_discarded, 0);
  EXPECT_GT(r.ttft_ms, 0);
  GenerateOptions one = greedy(segs, 10);
  one.reuse.guard_lead = 1e-6f;
  EXPECT_EQ(e->generate_ids(ids, one).output_ids, r.output_ids);
  // A request shorter than K: released at its end.
  GenerateOptions two = o;
  two.max_new_tokens = 2;
  streamed.clear();
  n_logits = n_lp = 0;
  const GenerateResult r2 = e->generate_ids(ids, two);
  EXPECT_EQ(r2.output_ids.size(), 2u);
  EXPECT_EQ(streamed, r2.text);
  EXPECT_EQ(n_logits, 2);
}

// Cancelled (or failed) while the guard holds tokens: none of them was shown, and none is in the
// result.
TEST(GuardTokens, CancelledWhileHoldingShowsNothing) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), small_chunks());
  std::vector<int64_t> segs;
  const auto ids = stories_prompt(*e, &segs, " Once upon a time");
  GenerateOptions o = greedy(segs, 10);
  o.reuse.guard_lead = 1e-6f;
  o.reuse.guard_tokens = 6;
  std::string streamed;
  o.on_text = [&](std::string_view t) {
    streamed += t;
    return true;
  };
  auto req = e->submit(ids, o);
  while (!req->done() && req->result().output_ids.size() < 3) e->step();
  ASSERT_FALSE(req->done());
  req->cancel();
  while (!req->done()) e->step();
  const GenerateResult r = req->result();
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_TRUE(streamed.empty());
  EXPECT_TRUE(r.output_ids.empty());
  EXPECT_TRUE(r.text.empty());
  EXPECT_EQ(r.n_held_discarded, 3);
  EXPECT_FALSE(e->has_work());
}

// A close call at token j >= 2: the held tokens are discarded and the caller sees the full
// prefill's run, token for token.
TEST(GuardTokens, ALaterCloseCallDiscardsTheHeldTokensStories) {
  KVBOOST_REQUIRE_PATH(stories());
  for (const char* q : {" Once upon a time", " One day, the", " Tom and", " She", " The dog"}) {
    auto e = Engine::load(stories(), small_chunks());
    std::vector<int64_t> segs;
    const auto ids = stories_prompt(*e, &segs, q);
    if (find_late_trip(*e, ids, segs, 6).j < 3 && std::string(q) != " The dog") continue;
    SCOPED_TRACE(q);
    expect_late_trip_is_the_full_prefill(*e, ids, segs, 6);
    return;
  }
}

// The case that motivated it, on the real model: a number answered as " " then digits, the
// document reused after another beginning.
TEST(GuardTokens, ALaterCloseCallDiscardsTheHeldTokensGemma) {
  const std::string path = test::gemma3_path();
  KVBOOST_REQUIRE_GEMMA3(path);
  EngineOptions eo;
  eo.chunk_size = 64;
  auto e = Engine::load(path, eo);
  const std::string sys = "You answer questions about the documents below. Answer with the exact value from the text.\n";
  const std::string d0 = "\nThe harbour master counted the boats that came in before the storm. The number of boats in the Ostrel "
                         "harbour that night, written in the log, was 4720. The fishermen waited for the wind to drop.";
  const std::string d1 = "\nThe keeper of the Valdera lighthouse, who lit the lamp every night for thirty years, was named "
                         "Greta Lindqvist. She kept a diary of every ship she saw.";
  std::vector<int64_t> segs;
  e->warm(join(*e, {sys, d0}, &segs), segs);
  e->warm(join(*e, {sys, d1}, &segs), segs);
  const auto ids = join(*e, {sys, d1, d0, "\n\nQuestion: How many boats were in the Ostrel harbour? Answer briefly.\nAnswer:"}, &segs);
  expect_late_trip_is_the_full_prefill(*e, ids, segs, 6);
}
