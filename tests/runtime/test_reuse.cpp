// Chunk-level reuse end to end on stories260K: exact hits from the chunk store (also after a
// restart, from disk), documents reused at other positions with none / selective / cacheblend
// repair, and verify_correctness.
#include <algorithm>
#include <cmath>
#include <span>

#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

const char* kDocs[] = {
    "Tom had a red ball. He liked to throw it high in the sky. One day the ball fell in the pond and Tom was sad.",
    "The little dog ran to the park. It saw a big tree and a small bird. The bird sang a happy song for the dog.",
    "Mia baked a cake with her mom. They put sugar and eggs in a bowl. The cake was sweet and everyone smiled.",
};

// sys + docs[order...] + question, with segment starts
std::vector<int32_t> build(const Engine& e, const std::vector<int>& order, std::vector<int64_t>* segs) {
  const Tokenizer& t = e.tokenizer();
  std::vector<int32_t> ids = t.encode("Here are some stories.", true);
  segs->clear();
  for (int d : order) {
    segs->push_back(int64_t(ids.size()));
    auto x = t.encode(std::string(" ") + kDocs[d], false);
    ids.insert(ids.end(), x.begin(), x.end());
  }
  segs->push_back(int64_t(ids.size()));
  auto q = t.encode(" Once upon a time", false);
  ids.insert(ids.end(), q.begin(), q.end());
  return ids;
}

// Stores the chunks of sys + docs 0, 1, 2 (one request) and returns sys + docs 2, 0, 1 with its
// segment starts: every document is then a content hit at another position.
std::vector<int32_t> reordered(Engine& e, std::vector<int64_t>* segs) {
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.segment_starts.clear();
  e.generate_ids(build(e, {0, 1, 2}, segs), o);
  return build(e, {2, 0, 1}, segs);
}

EngineOptions opts(const std::string& disk = "") {
  EngineOptions eo;
  eo.chunk_size = 32;
  eo.chunk_store.disk_dir = disk;
  return eo;
}

TEST(Reuse, DocumentsInANewOrderAreReusedAndRepaired) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto first = build(*e, {0, 1, 2}, &segs);
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.segment_starts = segs;
  e->generate_ids(first, o);  // computes and stores the chunks
  const auto ids = build(*e, {2, 0, 1}, &segs);
  o.segment_starts = segs;
  o.reuse.guard_lead = 0;  // the repairs themselves (the guard: GuardRecomputesACloseCallExactly)
  const int64_t n = int64_t(ids.size());
  for (ReuseMode m : {ReuseMode::kPrefixOnly, ReuseMode::kNone, ReuseMode::kSelective, ReuseMode::kCacheBlend}) {
    GenerateOptions r = o;
    r.reuse.mode = m;
    r.reuse.store = false;
    const Engine::Agreement a = e->verify_correctness(ids, r, 4);
    SCOPED_TRACE(reuse_mode_name(m));
    ASSERT_EQ(a.cosine.size(), 4u);
    // Bounds at about ten times the measured deviation (2026-12-01, stories260K: cosine 1 -
    // 1.0e-4 / 5e-5 / 7e-5 and KL 7e-5 / 1e-5 / 3e-5 for none / selective / cacheblend, top-1
    // always). Catches: reversing the re-rotation in copy_in (src/runtime/reuse.cpp; measured
    // top-1 0.25, KL 3.9), which the old bound (cosine > 0.9) let pass.
    EXPECT_EQ(a.top1_rate(), 1.0);
    if (m == ReuseMode::kPrefixOnly) {
      EXPECT_LT(a.n_reused, n / 4);  // only the short common beginning
      EXPECT_GT(a.mean_cosine(), 0.9999);
      EXPECT_LT(a.mean_kl(), 1e-6);
    } else {
      EXPECT_GT(a.n_reused, n * 3 / 4);  // the three documents
      const double cos_bound = m == ReuseMode::kNone ? 0.999 : m == ReuseMode::kSelective ? 0.9995 : 0.9993;
      const double kl_bound = m == ReuseMode::kNone ? 7e-4 : m == ReuseMode::kSelective ? 1e-4 : 3e-4;
      EXPECT_GT(a.mean_cosine(), cos_bound);
      EXPECT_LT(a.mean_kl(), kl_bound);
    }
    if (m == ReuseMode::kSelective) {
      EXPECT_GT(a.n_recomputed, 0);
      EXPECT_LE(a.n_recomputed, 3 * 16 + 1);  // R = 16 per reused run (+ the last token)
    }
    if (m == ReuseMode::kCacheBlend) {
      EXPECT_GT(a.n_recomputed, 0);
    }
    std::printf("%-10s reused %lld/%lld recomputed %lld: cosine %.5f KL %.5f top1 %.2f\n", reuse_mode_name(m),
                (long long)a.n_reused, (long long)n, (long long)a.n_recomputed, a.mean_cosine(), a.mean_kl(), a.top1_rate());
  }
  // Full repair is exact: cacheblend at ratio 1, and selective with R covering every chunk.
  GenerateOptions full = o;
  full.reuse.store = false;
  full.reuse.mode = ReuseMode::kCacheBlend;
  full.reuse.blend_ratio = 1.0f;
  EXPECT_GT(e->verify_correctness(ids, full, 4).mean_cosine(), 0.999999);
  full.reuse.mode = ReuseMode::kSelective;
  full.reuse.repair_tokens = 1000;
  const auto sel = e->verify_correctness(ids, full, 4);
  EXPECT_GT(sel.mean_cosine(), 0.999999);
  EXPECT_EQ(sel.top1_rate(), 1.0);
}

// cacheblend with run starts first: the run starts come out of the same budget (the number of
// recomputed tokens does not change), and a full budget stays exact.
TEST(Reuse, CacheBlendRunStartsShareTheBudget) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = reordered(*e, &segs);
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.segment_starts = segs;
  o.reuse.mode = ReuseMode::kCacheBlend;
  o.reuse.store = false;
  o.reuse.guard_lead = 0;
  o.reuse.blend_ratio = 0.3f;
  const Engine::Agreement plain = e->verify_correctness(ids, o, 4);
  for (int64_t starts : {2, 8, 1000}) {
    SCOPED_TRACE(starts);
    GenerateOptions r = o;
    r.reuse.blend_run_starts = starts;
    const Engine::Agreement a = e->verify_correctness(ids, r, 4);
    EXPECT_EQ(a.n_reused, plain.n_reused);
    EXPECT_NEAR(double(a.n_recomputed), double(plain.n_recomputed), 1.0);
    // (measured cosine 1 - 1e-4 or closer, KL under 5e-5: bounds ten times that; the
    // reversed re-rotation fails them)
    std::printf("run starts %lld: cosine %.6f KL %.2e\n", (long long)starts, a.mean_cosine(), a.mean_kl());
    EXPECT_GT(a.mean_cosine(), 0.999);
    EXPECT_LT(a.mean_kl(), 5e-4);
    EXPECT_EQ(a.top1_rate(), 1.0);
    // another set of tokens was recomputed: the logits move
    if (starts == 1000) {
      EXPECT_NE(a.mean_kl(), plain.mean_kl());
    }
  }
  o.reuse.blend_ratio = 1.0f;
  o.reuse.blend_run_starts = 8;
  EXPECT_GT(e->verify_correctness(ids, o, 4).mean_cosine(), 0.999999);
}

// A quantized store's prefix hits are lossy but in their own context: a document computed after
// one (the system prompt) is stored under its prefix key too, so a later prompt with the same
// beginning reuses the document in prefix mode, and selective repair leaves it alone.
TEST(Reuse, QuantizedStoreKeepsPrefixKeysAfterALossyHit) {
  KVBOOST_REQUIRE_PATH(stories());
  for (kv::KvQuant q : {kv::KvQuant::kF32, kv::KvQuant::kInt8, kv::KvQuant::kInt4}) {
    SCOPED_TRACE(int(q));
    EngineOptions eo = opts();
    eo.chunk_store.quant = q;
    auto e = Engine::load(stories(), eo);
    std::vector<int64_t> s0, segs;
    const std::vector<int32_t> first = build(*e, {0}, &s0), second = build(*e, {1}, &segs);
    const int64_t doc_end = segs[1];  // system prompt + document 1
    e->warm(std::vector<int32_t>(first.begin(), first.begin() + s0[1]), {s0[0]});
    e->warm(std::vector<int32_t>(second.begin(), second.begin() + doc_end), {segs[0]});
    GenerateOptions o;
    o.max_new_tokens = 1;
    o.segment_starts = segs;
    o.reuse.mode = ReuseMode::kPrefixOnly;
    o.reuse.store = false;
    const GenerateResult r = e->generate_ids(second, o);
    EXPECT_GE(r.n_reused, doc_end) << "document 1 computed after the system prompt's hit is a prefix hit";
    o.reuse.mode = ReuseMode::kSelective;
    EXPECT_EQ(e->generate_ids(second, o).n_recomputed, 0) << "nothing reused from another context: no repair";
  }
}

// The guard: an approximate prompt whose first token is a close call (top-1 lead under
// guard_lead) is recomputed before that token is sampled, so its logits and output are the full
// prefill's (to the last bits), and its chunks are stored under prefix keys (the same prompt again is
// an exact hit). A clear lead keeps the approximate answer.
TEST(Reuse, GuardRecomputesACloseCallExactly) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = reordered(*e, &segs);
  GenerateOptions o;
  o.segment_starts = segs;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0.0f;
  GenerateOptions full = o;
  full.prefix_cache = false;
  std::vector<std::vector<float>> ref;
  full.on_logits = [&](const float* l, int64_t v) { ref.emplace_back(l, l + v); };
  const GenerateResult fr = e->generate_ids(ids, full);
  for (ReuseMode m : {ReuseMode::kNone, ReuseMode::kSelective, ReuseMode::kCacheBlend}) {
    SCOPED_TRACE(reuse_mode_name(m));
    GenerateOptions r = o;
    r.reuse.mode = m;
    r.reuse.store = false;
    r.reuse.guard_lead = 0;
    r.reuse.guard_risk = 0;  // the threshold as given (the adaptive one: below)
    std::vector<std::vector<float>> got;
    r.on_logits = [&](const float* l, int64_t v) { got.emplace_back(l, l + v); };
    const GenerateResult plain = e->generate_ids(ids, r);
    EXPECT_FALSE(plain.guarded);
    ASSERT_FALSE(got.empty());
    EXPECT_NE(got[0], ref[0]) << "approximate K/V: the logits differ from the full prefill's";
    const float lead = plain.first_lead;
    EXPECT_GT(lead, 0.0f);
    // A guard just under the lead keeps the approximate answer (same logits as without a guard).
    r.reuse.guard_lead = lead * 0.99f;
    std::vector<std::vector<float>> kept;
    r.on_logits = [&](const float* l, int64_t v) { kept.emplace_back(l, l + v); };
    const GenerateResult k = e->generate_ids(ids, r);
    EXPECT_FALSE(k.guarded);
    EXPECT_EQ(k.first_lead, lead);
    ASSERT_FALSE(kept.empty());
    EXPECT_EQ(kept[0], got[0]);
    // Just over it: recomputed; every step's logits equal the full prefill's.
    r.reuse.guard_lead = lead * 1.01f;
    got.clear();
    r.on_logits = [&](const float* l, int64_t v) { got.emplace_back(l, l + v); };
    const GenerateResult g = e->generate_ids(ids, r);
    EXPECT_TRUE(g.guarded);
    EXPECT_EQ(g.output_ids, fr.output_ids);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      float worst = 0;
      for (size_t j = 0; j < ref[i].size(); ++j) worst = std::max(worst, std::fabs(got[i][j] - ref[i][j]));
      EXPECT_LT(worst, 1e-5f) << "step " << i;  // (approximate K/V moved them by ~1e-2)
    }
    EXPECT_EQ(g.n_recomputed, g.n_reused - g.n_cached) << "every reused token past the exact prefix";
    EXPECT_NEAR(g.reuse_ratio() * double(ids.size()), double(g.n_cached), 1e-6);
  }
  // Stored after a guarded prefill: the same prompt is now an exact hit, chunk by chunk.
  GenerateOptions s = o;
  s.reuse.mode = ReuseMode::kCacheBlend;
  s.reuse.guard_lead = 1e9f;
  EXPECT_TRUE(e->generate_ids(ids, s).guarded);
  s.reuse.mode = ReuseMode::kPrefixOnly;
  const GenerateResult again = e->generate_ids(ids, s);
  EXPECT_EQ(again.n_cached, int64_t(ids.size()) - 1);
  EXPECT_EQ(again.output_ids, fr.output_ids);
  // verify_correctness measures what a request gets: the guard's exact answer.
  GenerateOptions v = o;
  v.reuse.mode = ReuseMode::kCacheBlend;
  v.reuse.store = false;
  v.reuse.guard_lead = 1e9f;
  const auto ids2 = build(*e, {1, 2, 0}, &segs);
  v.segment_starts = segs;
  const Engine::Agreement a = e->verify_correctness(ids2, v, 4);
  EXPECT_TRUE(a.guarded);
  EXPECT_EQ(a.top1_rate(), 1.0);
  // (as on an exact prefix hit: the logits may differ in the last bits, the cached prefix's K/V
  // having been computed in another batch shape)
  ASSERT_EQ(a.kl.size(), 4u);
  EXPECT_LT(a.mean_kl(), 1e-9);
}

// Layer 0's K/V depend on nothing but the token and its position, so in a one-layer model a
// chunk reused at another position (repair none) must give the full prefill's K/V once its keys
// are re-rotated: the reused layer-0 keys equal freshly computed ones, seen through the logits
// (the model's only K/V are layer 0's), to float rounding of the rotation.
// Catches: reversing the re-rotation (delta = ch.pos0 - begin in copy_in, src/runtime/reuse.cpp),
// and any drift of the chunk codec or the copy into paged memory.
TEST(Reuse, ReusedLayerZeroKeysEqualFreshOnesAfterReRotation) {
  const std::string dir = test::make_temp_dir("reuse_layer0");
  FixtureSpec s = fixture_preset("tiny");
  s.layers = 1;
  s.init_std = 0.5f;  // peaked attention: wrong keys move the logits by whole units
  write_fixture_model(dir, s);
  auto e = Engine::load(dir, opts());
  const Tokenizer& t = e->tokenizer();
  const std::string doc = " A river ran past the mill. The miller ground wheat into flour all day.";
  auto seg = [&](const std::vector<std::string>& parts, std::vector<int64_t>* segs) {
    std::vector<int32_t> ids = t.encode(parts[0], true);
    segs->clear();
    for (size_t i = 1; i < parts.size(); ++i) {
      segs->push_back(int64_t(ids.size()));
      const auto x = t.encode(parts[i], false);
      ids.insert(ids.end(), x.begin(), x.end());
    }
    return ids;
  };
  std::vector<int64_t> segs;
  GenerateOptions o;
  o.max_new_tokens = 1;
  e->warm(seg({"Short.", doc}, &segs), segs);  // the document stored at one position ...
  const auto ids = seg({"A much longer opening line that moves the document along.", doc, " Then"}, &segs);
  o.segment_starts = segs;  // ... reused 40-odd positions later
  o.reuse.mode = ReuseMode::kNone;
  o.reuse.store = false;
  o.reuse.guard_lead = 0;
  std::vector<float> got, ref;
  o.on_logits = [&](const float* l, int64_t v) { got.assign(l, l + v); };
  const GenerateResult r = e->generate_ids(ids, o);
  ASSERT_GE(r.n_reused - r.n_cached, int64_t(t.encode(doc, false).size()) - 1) << "the document is a content hit";
  EXPECT_EQ(r.n_recomputed, 0);
  GenerateOptions f = o;
  f.prefix_cache = false;
  f.on_logits = [&](const float* l, int64_t v) { ref.assign(l, l + v); };
  e->generate_ids(ids, f);
  ASSERT_EQ(got.size(), ref.size());
  float worst = 0, spread = 0;
  for (size_t j = 0; j < ref.size(); ++j) worst = std::max(worst, std::fabs(got[j] - ref[j])), spread = std::max(spread, std::fabs(ref[j]));
  std::printf("one layer, reused at another position: max |logit - full| %.3g (logits up to %.3g)\n", worst, spread);
  EXPECT_GT(spread, 1.0f);
  EXPECT_LT(worst, 1e-4f * spread);
}

// The guard's exact recompute must start at the first approximate token. A content hit that
// begins right where the exact prefix ends (system prompt an exact store hit, the document
// found by content at another position) puts that first approximate token at the frontier
// itself; the guarded logits must then equal the full prefill's.
// Catches: starting the guard's recompute one token late (the todo range from r.guard_from + 1
// in guard_trips, src/runtime/reuse.cpp, which no other runtime test fails): that token keeps
// its approximate K/V and the guarded logits then differ from the full prefill's by 1.3e-2 to
// 3.3e-2 (measured 2026-12-01) instead of < 1e-5. (Setting r.guard_from = frontier + 1 in
// plan_reuse fails this test and GuardRecomputesACloseCallExactly's recompute count too.)
TEST(Reuse, GuardRecomputesFromTheFirstApproximateToken) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  const Tokenizer& t = e->tokenizer();
  std::vector<int64_t> segs;
  auto two = [&](const std::string& sys, const std::string& doc, std::vector<int64_t>* sg) {
    std::vector<int32_t> ids = t.encode(sys, true);
    *sg = {int64_t(ids.size())};
    const auto d = t.encode(doc, false);
    ids.insert(ids.end(), d.begin(), d.end());
    sg->push_back(int64_t(ids.size()));
    const auto q = t.encode(" Once upon a time", false);
    ids.insert(ids.end(), q.begin(), q.end());
    return ids;
  };
  const std::string sys = "Here are some stories.";
  // The system prompt under its prefix key (with another document after it) ...
  e->warm(two(sys, std::string(" ") + kDocs[1], &segs), segs);
  // ... and document 0 computed after another beginning (a content entry elsewhere).
  e->warm(two("Read this first, then answer.", std::string(" ") + kDocs[0], &segs), segs);
  const auto ids = two(sys, std::string(" ") + kDocs[0], &segs);
  GenerateOptions o;
  o.segment_starts = segs;
  o.max_new_tokens = 4;
  o.sampling.temperature = 0.0f;
  GenerateOptions full = o;
  full.prefix_cache = false;
  std::vector<std::vector<float>> ref, got;
  full.on_logits = [&](const float* l, int64_t v) { ref.emplace_back(l, l + v); };
  const GenerateResult fr = e->generate_ids(ids, full);
  for (ReuseMode m : {ReuseMode::kNone, ReuseMode::kSelective, ReuseMode::kCacheBlend}) {
    SCOPED_TRACE(reuse_mode_name(m));
    GenerateOptions r = o;
    r.reuse.mode = m;
    r.reuse.store = false;
    r.reuse.guard_lead = 1e9f;  // always trips
    r.reuse.guard_risk = 0;
    got.clear();
    r.on_logits = [&](const float* l, int64_t v) { got.emplace_back(l, l + v); };
    const GenerateResult g = e->generate_ids(ids, r);
    ASSERT_TRUE(g.guarded);
    EXPECT_EQ(g.n_cached, segs[0]) << "the exact prefix ends where the document's content hit begins";
    EXPECT_GT(g.n_reused, segs[1] - 2);
    EXPECT_EQ(g.output_ids, fr.output_ids);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      float worst = 0;
      for (size_t j = 0; j < ref[i].size(); ++j) worst = std::max(worst, std::fabs(got[i][j] - ref[i][j]));
      EXPECT_LT(worst, 1e-5f) << "step " << i;
    }
  }
}

// A chunk computed after approximate K/V holds bytes that depend on the repair settings of the
// request that computed it; it is stored as a content entry under those settings, so only a
// request with the same settings reuses it (docs/chunk-identity.md).
// Catches: storing those entries under the plain content key (store_chunks in
// src/runtime/reuse.cpp): selective and cacheblend then reuse the 33 tokens too.
TEST(Reuse, ContentEntriesComputedAfterApproximateKVCarryTheRepairSettings) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  const Tokenizer& t = e->tokenizer();
  std::vector<int64_t> segs;
  auto ids = reordered(*e, &segs);  // docs 2, 0, 1: content hits; then a question never seen
  const auto q = t.encode(" The cat sat by the warm fire and watched the snow fall outside.", false);
  ids.resize(size_t(segs.back()));
  ids.insert(ids.end(), q.begin(), q.end());
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.segment_starts = segs;
  o.reuse.mode = ReuseMode::kNone;
  o.reuse.guard_lead = 0;
  e->generate_ids(ids, o);  // stores the question's chunk, computed after reused documents
  // The question after another beginning: only a content lookup can find it.
  std::vector<int32_t> p = t.encode("Something else entirely.", true);
  const std::vector<int64_t> psegs{int64_t(p.size())};
  p.insert(p.end(), q.begin(), q.end());
  GenerateOptions r = o;
  r.segment_starts = psegs;
  r.reuse.store = false;
  const GenerateResult same = e->generate_ids(p, r);
  EXPECT_GE(same.n_reused - same.n_cached, int64_t(q.size()) - 1) << "same settings: the entry is found";
  for (ReuseMode m : {ReuseMode::kSelective, ReuseMode::kCacheBlend}) {
    SCOPED_TRACE(reuse_mode_name(m));
    GenerateOptions x = r;
    x.reuse.mode = m;
    const GenerateResult g = e->generate_ids(p, x);
    EXPECT_EQ(g.n_reused, g.n_cached) << "other repair settings: not served (only the exact prefix, the BOS token)";
  }
}

// Student's t quantiles against table values (and the closed forms for 1 and 2 degrees of
// freedom); the normal's in the limit.
TEST(Reuse, StudentTQuantile) {
  EXPECT_NEAR(student_t_quantile(0.95, 3), 2.353363, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.9, 10), 1.372184, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.99, 63), 2.387008, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.975, 1), std::tan(M_PI * 0.475), 1e-6);  // Cauchy
  const double p = 0.8;  // nu = 2: t = (2p - 1) * sqrt(2 / (1 - (2p - 1)^2))
  EXPECT_NEAR(student_t_quantile(p, 2), (2 * p - 1) * std::sqrt(2 / (1 - (2 * p - 1) * (2 * p - 1))), 1e-9);
  EXPECT_NEAR(student_t_quantile(0.9, 1e7), 1.281552, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.05, 3), -2.353363, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.5, 5), 0.0, 1e-9);
  EXPECT_THROW(student_t_quantile(1.0, 3), Error);
  EXPECT_THROW(student_t_quantile(0.5, 0), Error);
}

// The adaptive guard's threshold: median + t quantile x spread x sqrt(1 + 1/n), worked by hand.
TEST(Reuse, GuardThresholdEstimate) {
  const std::vector<float> errs{0.1f, -0.1f, 0.2f, -0.2f};
  EXPECT_EQ(guard_threshold(std::span(errs).first(3), 0.1f, 7.0f), 7.0f);  // too few: the fallback
  // Median 0, standard deviation sqrt(0.1 / 3) = 0.182574, times sqrt(1.25): 0.204124; the 0.9
  // quantile of t with 3 degrees of freedom is 1.637744: L = 0.334304.
  EXPECT_NEAR(guard_threshold(errs, 0.1f, 7.0f), 0.334304f, 1e-5f);
  EXPECT_NEAR(guard_threshold(errs, 0.05f, 7.0f), 0.204124f * 2.353363f, 1e-5f);  // a smaller risk: higher
  // Sixteen errors of the same spread: the t quantile and the interval narrow (15 degrees of
  // freedom: 1.340606; sd sqrt(0.1 * 4 / 15), times sqrt(1 + 1/16)).
  std::vector<float> many;
  for (int i = 0; i < 4; ++i) many.insert(many.end(), errs.begin(), errs.end());
  EXPECT_NEAR(guard_threshold(many, 0.1f, 7.0f), std::sqrt(0.4 / 15) * std::sqrt(17.0 / 16) * 1.340606, 1e-5);
  EXPECT_LT(guard_threshold(many, 0.1f, 7.0f), guard_threshold(errs, 0.1f, 7.0f));
  // A reuse that only shrinks leads (median -0.09, spread 0.01): no lead can be overturned.
  const std::vector<float> shrink{-0.08f, -0.09f, -0.1f, -0.085f, -0.095f};
  EXPECT_EQ(guard_threshold(shrink, 0.1f, 7.0f), 0.0f);
  // One error far above such a run widens the spread: close calls are recomputed again.
  const std::vector<float> outlier{-0.08f, -0.09f, -0.1f, -0.085f, 0.2f};
  EXPECT_GT(guard_threshold(outlier, 0.1f, 7.0f), 0.05f);
  // Errors shifted up by 0.3: the threshold moves with them (the median is the center).
  std::vector<float> up = errs;
  for (float& x : up) x += 0.3f;
  EXPECT_NEAR(guard_threshold(up, 0.1f, 7.0f), 0.634304f, 1e-5f);
  // Risk 1 passes everything; huge errors stop at kGuardMaxLead.
  EXPECT_EQ(guard_threshold(errs, 1.0f, 7.0f), 0.0f);
  const std::vector<float> big{-10.f, 10.f, -10.f, 10.f};
  EXPECT_EQ(guard_threshold(big, 0.1f, 7.0f), kGuardMaxLead);
}

// The adaptive guard learns from the prompts it recomputed: after kGuardMinErrors of them its
// threshold is guard_threshold over the errors of those leads (the full
// prefill's logits against the approximate ones), whatever guard_lead it started from.
TEST(Reuse, AdaptiveGuardLearnsHowFarTheReuseErrs) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  reordered(*e, &segs);  // stores sys + docs 0, 1, 2
  const std::vector<std::vector<int>> orders{{2, 0, 1}, {1, 2, 0}, {2, 1, 0}, {1, 0, 2}, {0, 2, 1}};
  std::vector<float> errs;
  for (size_t i = 0; i < orders.size(); ++i) {
    SCOPED_TRACE(i);
    const auto ids = build(*e, orders[i], &segs);
    GenerateOptions o;
    o.segment_starts = segs;
    o.max_new_tokens = 1;
    o.reuse.mode = ReuseMode::kCacheBlend;
    o.reuse.store = false;
    // The approximate and the full prefill's logits of this prompt (the guard off: not learned).
    std::vector<float> approx, exact;
    GenerateOptions a = o;
    a.reuse.guard_lead = 0;
    a.on_logits = [&](const float* l, int64_t v) { approx.assign(l, l + v); };
    e->generate_ids(ids, a);
    GenerateOptions f = o;
    f.prefix_cache = false;
    f.reuse.mode = ReuseMode::kPrefixOnly;
    f.on_logits = [&](const float* l, int64_t v) { exact.assign(l, l + v); };
    e->generate_ids(ids, f);
    const auto top = std::max_element(approx.begin(), approx.end()) - approx.begin();
    float second = -INFINITY;
    int64_t runner = 0;
    for (size_t j = 0; j < approx.size(); ++j)
      if (int64_t(j) != top && approx[j] > second) second = approx[j], runner = int64_t(j);
    const float lead = approx[size_t(top)] - second;
    // With a threshold nothing passes until the guard has learned.
    o.reuse.guard_lead = 1e6f;
    const GenerateResult g = e->generate_ids(ids, o);
    EXPECT_TRUE(g.approximate);
    EXPECT_EQ(g.first_lead, lead);
    if (i < kGuardMinErrors) {
      EXPECT_EQ(g.guard_lead, 1e6f);
      EXPECT_TRUE(g.guarded);
    } else {
      // (the engine's full prefill may differ from this one in the last bits)
      EXPECT_NEAR(g.guard_lead, guard_threshold(errs, o.reuse.guard_risk, 1e6f), 1e-4f);
      EXPECT_LT(g.guard_lead, 1.0f) << "stories260K's reuse errs by hundredths of a logit";
      EXPECT_EQ(g.guarded, lead < g.guard_lead);
    }
    if (g.guarded) errs.push_back(lead - (exact[size_t(top)] - exact[size_t(runner)]));
    // guard_risk 0: the fixed threshold, learned or not.
    GenerateOptions fixed = o;
    fixed.reuse.guard_risk = 0;
    fixed.reuse.guard_lead = 0.5f;
    EXPECT_EQ(e->generate_ids(ids, fixed).guard_lead, 0.5f);
  }
}

TEST(Reuse, ExactHitsSurviveARestartThroughTheDiskTier) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = test::make_temp_dir("reuse_disk");
  std::vector<int64_t> segs;
  GenerateOptions o;
  o.max_new_tokens = 20;
  GenerateResult cold;
  std::vector<int32_t> ids;
  {
    auto e = Engine::load(stories(), opts(dir));
    ids = build(*e, {0, 1}, &segs);
    o.segment_starts = segs;
    cold = e->generate_ids(ids, o);
    EXPECT_EQ(cold.n_cached, 0);
    e->chunk_store()->flush();
    EXPECT_GT(e->chunk_store()->stats().entries_disk, 0);
  }
  auto e = Engine::load(stories(), opts(dir));  // a new process: empty block cache, disk index
  const GenerateResult warm = e->generate_ids(ids, o);
  EXPECT_EQ(warm.n_cached, int64_t(ids.size()) - 1);
  EXPECT_EQ(warm.output_ids, cold.output_ids);
  const kv::ChunkStats s = e->chunk_store()->stats();
  EXPECT_GT(s.disk_loads, 0);
  EXPECT_GT(s.prefix_hits, 0);
}

TEST(Reuse, WarmPinsAndCountsAreConsistent) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = build(*e, {1, 2}, &segs);
  e->warm(ids, segs);
  EXPECT_GT(e->chunk_store()->stats().pinned, 0);
  GenerateOptions o;
  o.max_new_tokens = 5;
  o.segment_starts = segs;
  const GenerateResult r = e->generate_ids(ids, o);
  EXPECT_EQ(r.n_cached, int64_t(ids.size()) - 1);
  EXPECT_EQ(r.n_reused + r.n_new, int64_t(ids.size()));
  EXPECT_NEAR(r.reuse_ratio(), double(ids.size() - 1) / double(ids.size()), 1e-9);
}

}  // namespace
