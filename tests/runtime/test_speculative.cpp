// Speculative decoding: greedy output token-identical to plain decoding (prompt lookup and a draft
// model, stories260K and random fixtures, alone and batched), the KV/prefix-cache bookkeeping
// after rollbacks, and sampled output distributed as plain sampling (chi-square, fixed seeds).
#include <cmath>
#include <cstring>
#include <map>

#include "kvboost/kernels.h"
#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "speculative.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::shared_path("models/stories260K"); }

const std::vector<std::string> kPrompts = {
    "Once upon a time",
    "The cat sat on the",
    "Lily and Ben went to the park",
    "One day, a little bird",
    "Tom had a big red ball. Tom had a big red ball. Tom had a",
    "Once upon a time, there was a little girl named Lily. Once upon a time, there was a",
    "The dog ran and ran. The dog ran and",
    "Sue said, \"I want to play.\" Sue said, \"I want",
    "He saw a tree. He saw a bird. He saw a",
    "Mom and Dad",
    "The sun was hot. The sun was hot. The",
    "A boy named Tim liked to jump.",
};

// Random-weight model directory with a byte-level tokenizer, written once per process.
std::string fixture(const std::string& name, uint64_t seed, int64_t layers, const std::string& dtype = "f32") {
  const std::string dir = test::make_temp_dir("spec_" + name);
  FixtureSpec f;
  f.seed = seed;
  f.layers = layers;
  f.dtype = dtype;
  f.max_pos = 512;
  write_fixture_model(dir, f);
  return dir;
}

// A random 3-layer model with stories260K's tokenizer (a target or draft that disagrees with it).
std::string random_stories_like(const std::string& name, uint64_t seed) {
  FixtureSpec f;
  f.layers = 3, f.hidden = 64, f.heads = 8, f.kv_heads = 4, f.intermediate = 172, f.max_pos = 512, f.seed = seed;
  f.tokenizer_dir = stories();
  f.tokenizer_kind = "";
  const std::string dir = test::make_temp_dir(name);
  write_fixture_model(dir, f);
  return dir;
}

GenerateOptions greedy(int n, SpecMode m) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0.0f;
  o.prefix_cache = false;
  o.speculative.mode = m;
  return o;
}

// Rows computed together (a verification pass) against the rows computed one at a time: the
// single-row matmul (GEMV, four interleaved accumulator chains) and the multi-row tiles (one
// chain per output) round differently, so the logits differ in the last bits (as a decode row
// batched with other requests' rows already does) but never by more than float rounding, and
// the argmax agrees. Returns the largest difference relative to the row's largest |logit|.
double rows_max_rel_diff(const std::string& dir, bool pack) {
  LoadOptions lo;
  lo.pack_weights = pack;
  auto m = Model::load(dir, lo);
  const int64_t V = m->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 5, 9, 33, 7, 100, 42, 8, 3, 77, 12};
  const std::vector<int32_t> cont = {50, 51, 9, 33, 7, 2, 99, 11, 15};  // 9 rows: 1 + 8 drafts
  double worst = 0;
  for (size_t n = 1; n <= cont.size(); ++n) {
    KvCache one(m->config(), 64), many(m->config(), 64);
    std::vector<float> l(static_cast<size_t>(V)), all(n * static_cast<size_t>(V));
    m->forward(prompt.data(), int64_t(prompt.size()), one, l.data());
    m->forward(prompt.data(), int64_t(prompt.size()), many, l.data());
    m->forward(cont.data(), int64_t(n), many, all.data(), /*all_logits=*/true);
    for (size_t i = 0; i < n; ++i) {
      m->forward(&cont[i], 1, one, l.data());
      const float* b = &all[i * size_t(V)];
      double mx = 0, d = 0;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(std::fabs(l[size_t(j)]))), d = std::max(d, double(std::fabs(l[size_t(j)] - b[j])));
      worst = std::max(worst, d / std::max(mx, 1e-30));
      EXPECT_EQ(kernels::argmax(l.data(), V), kernels::argmax(b, V)) << dir << ": row " << i << " of " << n;
    }
  }
  return worst;
}

// Two-sample chi-square over the categories both samples show (those expected < 5 pooled);
// returns the p-value (Wilson-Hilferty approximation of the chi-square tail).
double chi_square_p(const std::map<std::vector<int32_t>, int>& a, const std::map<std::vector<int32_t>, int>& b) {
  std::map<std::vector<int32_t>, std::pair<int, int>> all;
  for (const auto& [k, v] : a) all[k].first += v;
  for (const auto& [k, v] : b) all[k].second += v;
  double na = 0, nb = 0;
  for (const auto& [k, v] : all) na += v.first, nb += v.second;
  std::vector<std::pair<double, double>> bins;
  std::pair<double, double> pool{0, 0};
  for (const auto& [k, v] : all) {
    if (v.first + v.second < 10) pool.first += v.first, pool.second += v.second;
    else bins.emplace_back(v.first, v.second);
  }
  if (pool.first + pool.second > 0) bins.push_back(pool);
  double x2 = 0;
  for (const auto& [x, y] : bins) {
    const double t = x + y, ea = t * na / (na + nb), eb = t * nb / (na + nb);
    x2 += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
  }
  const double df = double(bins.size()) - 1;
  if (df < 1) return 1.0;
  const double z = (std::cbrt(x2 / df) - (1 - 2 / (9 * df))) / std::sqrt(2 / (9 * df));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}
}  // namespace

TEST(Speculative, LookupDraftsTheLatestContinuation) {
  std::vector<int32_t> out;
  EXPECT_EQ(lookup_draft({1, 2, 3, 4, 1, 2, 3, 9, 1, 2}, 3, 4, &out), 4);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 9, 1, 2}));  // after the latest "1 2" (not 3 4)
  EXPECT_EQ(lookup_draft({1, 2, 3, 4, 1, 2, 3, 9, 1, 2}, 3, 2, &out), 2);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(lookup_draft({5, 6, 7, 8}, 3, 4, &out), 0);  // no earlier occurrence
  EXPECT_EQ(lookup_draft({5, 6, 5}, 3, 4, &out), 2);     // falls back to the 1-gram "5"
  EXPECT_EQ(out, (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(lookup_draft({5}, 3, 4, &out), 0);
}

TEST(Speculative, AdaptiveLengthFollowsAcceptance) {
  EXPECT_EQ(adaptive_draft_length(0.0, 8, 0.1), 0);
  EXPECT_EQ(adaptive_draft_length(0.05, 8, 0.1), 0);
  EXPECT_GE(adaptive_draft_length(0.3, 8, 0.1), 1);
  EXPECT_LE(adaptive_draft_length(0.3, 8, 0.1), 3);
  EXPECT_EQ(adaptive_draft_length(0.98, 8, 0.05), 8);
  EXPECT_LT(adaptive_draft_length(0.7, 16, 0.3), adaptive_draft_length(0.7, 16, 0.05));
}

// The acceptance rule alone on a synthetic row: tokens emitted (draft accepted or residual
// draw) follow p, whether q is a point mass (lookup) or a different distribution (draft model).
TEST(Speculative, AcceptanceRulePreservesTheDistribution) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f};
  const int64_t V = int64_t(logits.size());
  SamplingParams c;
  c.temperature = 0.9f, c.top_k = 5, c.seed = 7;
  Sampler ref(c);
  SpecDist p;
  std::vector<float> tmp = logits;
  ref.distribution(tmp.data(), V, {}, 0, &p);
  double sum = 0;
  for (auto& [t, v] : p) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_EQ(p.size(), 5u);  // top-k
  const SpecDist q = {{0, 0.1}, {1, 0.6}, {2, 0.1}, {4, 0.1}, {5, 0.1}};
  for (int mode = 0; mode < 2; ++mode) {
    SamplingParams qc;
    qc.temperature = 1.0f, qc.seed = 99;
    Sampler s(c), dq(qc);
    std::vector<double> hist(size_t(V), 0);
    std::vector<float> scratch;
    SpecDist pp;
    const int N = 200000;
    int n_acc = 0;
    for (int i = 0; i < N; ++i) {
      int32_t draft;
      if (mode == 0) {
        draft = int32_t(i % 3);  // lookup: any fixed draft
      } else {
        const double u = dq.uniform();
        double acc = 0;
        draft = q.back().first;
        for (auto& [t, v] : q)
          if (u < (acc += v)) {
            draft = t;
            break;
          }
      }
      bool ok = false;
      const int32_t t = spec_choose(s, logits.data(), V, {}, 0, draft, mode ? &q : nullptr, &scratch, &pp, &ok);
      n_acc += ok;
      hist[size_t(t)] += 1;
    }
    for (auto& [t, v] : p) EXPECT_NEAR(hist[size_t(t)] / N, v, 0.004) << "mode " << mode << " token " << t;
    EXPECT_EQ(hist[5], 0);  // outside top-k: never emitted, even when drafted
    EXPECT_GT(n_acc, 0);
    EXPECT_LT(n_acc, N);
  }
}

TEST(Speculative, VerificationRowsDifferFromSingleRowDecodeOnlyByRounding) {
  KVBOOST_REQUIRE_PATH(stories());
  for (const auto& [dir, pack] : std::vector<std::pair<std::string, bool>>{
           {stories(), true}, {stories(), false}, {fixture("rows_bf16", 3, 2, "bf16"), true},
           {fixture("rows_f16", 4, 2, "f16"), false}}) {
    const double d = rows_max_rel_diff(dir, pack);
    EXPECT_LT(d, 1e-5) << dir << " pack " << pack;
    std::printf("%s (pack %d): verification rows vs single-row decode, max |diff| / max |logit| = %.2g\n", dir.c_str(),
                int(pack), d);
  }
}

TEST(Speculative, GreedyLookupEqualsPlainDecodingOnStories) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.spec.adaptive = false;  // k drafts whenever lookup finds them (the adaptive length is timed)
  auto e = Engine::load(stories(), eo);
  int64_t drafted = 0, accepted = 0, passes = 0, tokens = 0;
  for (const auto& p : kPrompts) {
    const GenerateResult off = e->generate(p, greedy(120, SpecMode::kOff));
    for (int k : {1, 3, 8}) {
      GenerateOptions o = greedy(120, SpecMode::kLookup);
      o.speculative.draft_tokens = k;
      const GenerateResult on = e->generate(p, o);
      ASSERT_EQ(on.output_ids, off.output_ids) << p << " k=" << k;
      EXPECT_EQ(on.text, off.text);
      EXPECT_EQ(on.finish_reason, off.finish_reason);
      drafted += on.spec_drafted, accepted += on.spec_accepted, passes += on.decode_passes;
      tokens += int64_t(on.output_ids.size()) - 1;
    }
    EXPECT_EQ(off.spec_drafted, 0);
    EXPECT_EQ(off.decode_passes, int64_t(off.output_ids.size()) - 1);
  }
  EXPECT_GT(drafted, 100);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);   // rejections happened (rollback exercised)
  EXPECT_LT(passes, tokens);      // more than one token per pass on average
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
}

TEST(Speculative, GreedyDraftModelEqualsPlainDecoding) {
  KVBOOST_REQUIRE_PATH(stories());
  // stories260K drafting for a random 3-layer model sharing its tokenizer (mostly rejected),
  // and for itself (always accepted).
  const std::string target = random_stories_like("spec_target", 11);
  for (const std::string& t : {target, stories()}) {
    EngineOptions eo;
    eo.spec.draft_model = stories();
    eo.spec.mode = SpecMode::kDraft;
    eo.spec.adaptive = false;  // a draft as large as the target never pays: the adaptive length is 0
    auto spec = Engine::load(t, eo);
    auto plain = Engine::load(t);
    int64_t drafted = 0, accepted = 0;
    for (const auto& p : kPrompts) {
      const GenerateResult off = plain->generate(p, greedy(60, SpecMode::kOff));
      const GenerateResult on = spec->generate(p, greedy(60, SpecMode::kDraft));
      ASSERT_EQ(on.output_ids, off.output_ids) << t << ": " << p;
      drafted += on.spec_drafted, accepted += on.spec_accepted;
    }
    EXPECT_GT(drafted, 0);
    if (t == stories()) {
      EXPECT_EQ(accepted, drafted);
    } else {
      EXPECT_LT(accepted, drafted);
    }
    EXPECT_EQ(spec->kv_stats().blocks_used, 0);
  }
}

TEST(Speculative, GreedyLookupEqualsPlainOnRandomFixtures) {
  for (const auto& [dtype, seed] : std::vector<std::pair<std::string, uint64_t>>{{"f32", 21}, {"bf16", 22}}) {
    const std::string dir = fixture("greedy_" + dtype, seed, 2, dtype);
    EngineOptions eo;
    eo.spec.adaptive = false;
    auto e = Engine::load(dir, eo);
    int64_t drafted = 0;
    for (const auto& p : kPrompts) {
      const GenerateResult off = e->generate(p, greedy(80, SpecMode::kOff));
      const GenerateResult on = e->generate(p, greedy(80, SpecMode::kLookup));
      ASSERT_EQ(on.output_ids, off.output_ids) << dtype << ": " << p;
      drafted += on.spec_drafted;
    }
    EXPECT_GT(drafted, 0);
  }
}

// Batched with other requests, under KV pressure (preemption), with the prefix cache on: the
// outputs equal plain decoding alone, no block leaks, and the cache holds only final tokens (a
// follow-up prompt continuing each output hits its blocks and still decodes the same).
TEST(Speculative, BatchedWithPrefixCacheAndPreemptionKeepsOutputs) {
  KVBOOST_REQUIRE_PATH(stories());
  auto plain = Engine::load(stories());
  EngineOptions eo;
  eo.block_size = 16;
  eo.spec.max_batch = 16;
  eo.spec.adaptive = false;  // draft every step (on a model this small the measured row cost turns it off)
  const auto& c = plain->model().config();
  const size_t per_block = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim * 16) * sizeof(float);
  eo.kv_budget_bytes = per_block * 24;
  auto e = Engine::load(stories(), eo);
  GenerateOptions o = greedy(100, SpecMode::kLookup);
  o.prefix_cache = true;
  GenerateOptions po = o;
  po.speculative.mode = SpecMode::kOff;
  po.prefix_cache = false;
  std::vector<GenerateResult> alone;
  for (const auto& p : kPrompts) alone.push_back(plain->generate(p, po));
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<Request>> reqs;
    for (const auto& p : kPrompts) reqs.push_back(e->submit(e->tokenizer().encode(p, true), o));
    int64_t max_drafted = 0;
    while (e->has_work()) max_drafted = std::max(max_drafted, e->step().n_drafted);
    EXPECT_GT(max_drafted, 0);
    int64_t preempted = 0;
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const GenerateResult r = reqs[i]->result();
      ASSERT_EQ(r.output_ids, alone[i].output_ids) << "round " << round << ": " << kPrompts[i];
      preempted += r.n_preempted;
    }
    if (round == 0) {
      EXPECT_GT(preempted, 0);  // the pool of 24 blocks is too small for all
    }
    EXPECT_EQ(e->kv_stats().blocks_used, 0);
  }
  // Follow-ups: prompt + output; the blocks the speculating request cached must be exact.
  po.max_new_tokens = 20;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_EQ(e->generate(kPrompts[i], o).output_ids, alone[i].output_ids);
    std::vector<int32_t> ids = alone[i].prompt_ids;
    ids.insert(ids.end(), alone[i].output_ids.begin(), alone[i].output_ids.end());
    if (int64_t(ids.size()) > 400) ids.resize(400);
    GenerateOptions f = o;
    f.max_new_tokens = 20;
    const GenerateResult hit = e->generate_ids(ids, f);
    const GenerateResult ref = plain->generate_ids(ids, po);
    EXPECT_EQ(hit.output_ids, ref.output_ids) << kPrompts[i];
    EXPECT_GT(hit.n_cached, 0);
  }
}

// Sampled output: the joint distribution of the tokens speculation decides (after the first)
// equals plain sampling's. 1500 seeded samples per mode; the seeds are fixed so the test is
// deterministic; a wrong rule (temperature 0.8 vs 1) is rejected by the same test.
TEST(Speculative, SampledDistributionMatchesPlainSampling) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.spec.draft_model = random_stories_like("spec_draft", 12);  // q far from p: many rejections
  eo.spec.adaptive = false;
  auto e = Engine::load(stories(), eo);
  const std::vector<int32_t> ids =
      e->tokenizer().encode("Once upon a time, there was a little girl. Once upon a time, there was a", true);
  const int N = 1500;
  auto run = [&](SpecMode m, float temp, uint64_t seed0, int64_t* drafted, int64_t* accepted) {
    std::map<std::vector<int32_t>, int> h;
    for (int i = 0; i < N; ++i) {
      GenerateOptions o;
      o.max_new_tokens = 3;
      o.prefix_cache = true;
      o.sampling.temperature = temp;
      o.sampling.top_k = 0;
      o.sampling.top_p = 1.0f;
      o.sampling.seed = seed0 + uint64_t(i);
      o.speculative.mode = m;
      o.speculative.draft_tokens = 2;
      const GenerateResult r = e->generate_ids(ids, o);
      std::vector<int32_t> key(r.output_ids.begin() + 1, r.output_ids.end());  // tokens 2 and 3
      h[key]++;
      if (drafted) *drafted += r.spec_drafted, *accepted += r.spec_accepted;
    }
    return h;
  };
  const auto off = run(SpecMode::kOff, 1.0f, 1000000, nullptr, nullptr);
  int64_t ld = 0, la = 0, dd = 0, da = 0;
  const auto lookup = run(SpecMode::kLookup, 1.0f, 2000000, &ld, &la);
  const auto draft = run(SpecMode::kDraft, 1.0f, 3000000, &dd, &da);
  const auto colder = run(SpecMode::kOff, 0.8f, 4000000, nullptr, nullptr);
  EXPECT_GT(ld, N / 2);
  EXPECT_GT(la, 0);
  EXPECT_LT(la, ld);  // rejections and residual draws happened
  EXPECT_GT(dd, N / 2);
  EXPECT_GT(da, 0);
  EXPECT_LT(da, dd);
  const double p_lookup = chi_square_p(off, lookup), p_draft = chi_square_p(off, draft), p_wrong = chi_square_p(off, colder);
  EXPECT_GT(p_lookup, 0.001) << "lookup vs plain";
  EXPECT_GT(p_draft, 0.001) << "draft vs plain";
  EXPECT_LT(p_wrong, 0.001) << "the test cannot tell temperature 0.8 from 1";
  std::printf("chi-square p: lookup %.3f, draft %.3f, temperature 0.8 %.2g; lookup acceptance %.2f, draft %.2f\n",
              p_lookup, p_draft, p_wrong, double(la) / double(ld), double(da) / double(dd));
}

TEST(Speculative, BadKnobsAreErrors) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions o = greedy(4, SpecMode::kDraft);
  EXPECT_THROW(e->generate("Once", o), Error);  // no draft model loaded
  o.speculative.mode = SpecMode::kLookup;
  o.speculative.draft_tokens = 99;
  EXPECT_THROW(e->generate("Once", o), Error);
  o.speculative.draft_tokens = 4;
  o.speculative.ngram = 0;
  EXPECT_THROW(e->generate("Once", o), Error);
  EXPECT_THROW(parse_spec_mode("fast"), Error);
  EXPECT_EQ(parse_spec_mode("lookup"), SpecMode::kLookup);
  EngineOptions eo;
  eo.spec.mode = SpecMode::kDraft;
  EXPECT_THROW(Engine::load(stories(), eo), Error);
}

// A measured cost per draft length overrides the linear row cost: when 1- and 2-draft passes cost
// 2.5x a plain pass, ~50% acceptance does not pay; unmeasured lengths keep the linear prior.
TEST(Speculative, AdaptiveLengthUsesTheMeasuredCostPerLength) {
  EXPECT_GE(adaptive_draft_length(0.5, 8, 0.3), 1);
  double cost[9] = {0, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1, 3.3};
  EXPECT_EQ(adaptive_draft_length(0.5, 8, 0.3, cost, 9), 0);
  EXPECT_EQ(adaptive_draft_length(0.99, 8, 0.3, cost, 9), 8);  // 9 tokens for 3.3: worth it
  double partial[9] = {0, 2.5, 0, 0, 0, 0, 0, 0, 0};             // only k = 1 measured
  EXPECT_GE(adaptive_draft_length(0.5, 8, 0.3, partial, 9), 2);  // the prior says try longer
}
