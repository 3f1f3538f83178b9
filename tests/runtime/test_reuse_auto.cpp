// ReuseMode::kAuto (the default): the escalation ladder selective -> cacheblend -> exact recompute
// of the approximate span, each step chosen by the guard, and the guard's calibration persisted
// beside the chunk store (src/runtime/guard_file.cpp).
#include <algorithm>
#include <cmath>
#include <fstream>

#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

const char* kDoc0 = " Tom had a red ball. He liked to throw it high in the sky. One day the ball fell in the pond and Tom was sad.";
const char* kDoc1 = " The little dog ran to the park. It saw a big tree and a small bird. The bird sang a happy song for the dog.";
const std::string kSys = "Here are some stories.";

// sys + doc + question, with segment starts.
std::vector<int32_t> two(const Engine& e, const std::string& sys, const std::string& doc, std::vector<int64_t>* sg,
                         const std::string& question = " Once upon a time") {
  const Tokenizer& t = e.tokenizer();
  std::vector<int32_t> ids = t.encode(sys, true);
  *sg = {int64_t(ids.size())};
  const auto d = t.encode(doc, false);
  ids.insert(ids.end(), d.begin(), d.end());
  sg->push_back(int64_t(ids.size()));
  const auto q = t.encode(question, false);
  ids.insert(ids.end(), q.begin(), q.end());
  return ids;
}

EngineOptions opts() {
  EngineOptions eo;
  eo.chunk_size = 32;
  return eo;
}

// The system prompt is an exact prefix hit; document 0 is a content hit computed after another
// beginning (approximate from segs[0] on).
std::vector<int32_t> prepare(Engine& e, std::vector<int64_t>* segs, const std::string& question = " Once upon a time") {
  e.warm(two(e, kSys, kDoc1, segs), *segs);
  e.warm(two(e, "Read this first, then answer.", kDoc0, segs), *segs);
  return two(e, kSys, kDoc0, segs, question);
}

struct Outcome {
  GenerateResult res;
  std::vector<std::vector<float>> logits;
};
Outcome run(Engine& e, const std::vector<int32_t>& ids, GenerateOptions o) {
  Outcome r;
  o.on_logits = [&](const float* l, int64_t v) { r.logits.emplace_back(l, l + v); };
  r.res = e.generate_ids(ids, o);
  return r;
}

float worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float w = 0;
  for (size_t j = 0; j < a.size(); ++j) w = std::max(w, std::fabs(a[j] - b[j]));
  return w;
}

GenerateOptions base(const std::vector<int64_t>& segs) {
  GenerateOptions o;
  o.segment_starts = segs;
  o.max_new_tokens = 4;
  o.sampling.temperature = 0.0f;
  o.reuse.store = false;
  o.reuse.repair_tokens = 4;  // selective is then the cheaper first step on a fresh engine
  return o;
}
}  // namespace

TEST(ReuseAuto, IsTheDefault) {
  EXPECT_EQ(ReusePolicy{}.mode, ReuseMode::kAuto);
  EXPECT_EQ(GenerateOptions{}.reuse.mode, ReuseMode::kAuto);
  EXPECT_EQ(parse_reuse_mode("auto"), ReuseMode::kAuto);
  EXPECT_STREQ(reuse_mode_name(ReuseMode::kAuto), "auto");
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = prepare(*e, &segs);
  GenerateOptions o;  // every default: the document is reused at its new position
  o.segment_starts = segs;
  o.max_new_tokens = 1;
  const GenerateResult r = e->generate_ids(ids, o);
  EXPECT_EQ(r.n_cached, segs[0]);
  EXPECT_GT(r.n_reused, segs[1] - 2);
  EXPECT_TRUE(r.approximate);
  ASSERT_FALSE(r.reuse_steps.empty());
}

// A guard that always trips walks the whole ladder: selective, then cacheblend, then the exact
// recompute of only the approximate span (not the exact system prompt before it), whose logits
// are the full prefill's at every step.
// Catches: escalating straight to the recompute, recomputing from the exact prefix's start or
// the whole prompt, and a recompute that misses rows (logits off by the reuse's ~1e-2).
TEST(ReuseAuto, LadderEscalatesToAnExactRecomputeOfTheApproximateSpan) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = prepare(*e, &segs);
  const int64_t n = int64_t(ids.size());
  GenerateOptions full = base(segs);
  full.prefix_cache = false;
  const Outcome fr = run(*e, ids, full);
  GenerateOptions o = base(segs);
  o.reuse.mode = ReuseMode::kAuto;
  o.reuse.guard_lead = 1e9f;  // always trips
  o.reuse.guard_risk = 0;
  const Outcome g = run(*e, ids, o);
  const auto& st = g.res.reuse_steps;
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].repair, "selective");
  EXPECT_FALSE(st[0].kept);
  EXPECT_EQ(st[1].repair, "cacheblend");
  EXPECT_FALSE(st[1].kept);
  EXPECT_EQ(st[2].repair, "recompute");
  EXPECT_TRUE(st[2].kept);
  EXPECT_TRUE(g.res.guarded);
  EXPECT_EQ(g.res.n_cached, segs[0]);
  // Rows: the recompute covers [first approximate token, n) = [segs[0], n) and nothing before.
  EXPECT_EQ(st[2].rows, n - segs[0]);
  EXPECT_LT(st[2].rows, n);
  // selective: its run-start rows (4) + the question's new tokens; cacheblend: fewer than the span
  EXPECT_GE(st[0].rows, 4 + (n - segs[1]) - 1);
  EXPECT_LE(st[0].rows, 4 + (n - segs[1]) + 1);
  EXPECT_GT(st[1].rows, 0);
  EXPECT_LT(st[1].rows, n - segs[0]);
  EXPECT_EQ(g.res.n_recomputed, g.res.n_reused - g.res.n_cached);
  EXPECT_EQ(g.res.output_ids, fr.res.output_ids);
  ASSERT_EQ(g.logits.size(), fr.logits.size());
  for (size_t i = 0; i < fr.logits.size(); ++i) EXPECT_LT(worst_diff(g.logits[i], fr.logits[i]), 1e-5f) << "step " << i;
  // The approximate steps' logits differed (so the escalation changed something).
  GenerateOptions off = o;
  off.reuse.guard_lead = 0;
  const Outcome a = run(*e, ids, off);
  ASSERT_EQ(a.res.reuse_steps.size(), 1u);
  EXPECT_TRUE(a.res.reuse_steps[0].kept);
  EXPECT_GT(worst_diff(a.logits[0], fr.logits[0]), 1e-4f);
}

// A threshold between the selective step's lead and the cacheblend step's stops the ladder at
// cacheblend (no recompute); one under the selective lead keeps selective.
TEST(ReuseAuto, EachStepIsKeptWhenItsLeadClearsTheGuard) {
  KVBOOST_REQUIRE_PATH(stories());
  std::vector<float> leads;
  {
    auto e = Engine::load(stories(), opts());
    std::vector<int64_t> segs;
    const auto ids = prepare(*e, &segs);
    GenerateOptions o = base(segs);
    o.reuse.guard_lead = 1e9f;
    o.reuse.guard_risk = 0;
    const GenerateResult r = e->generate_ids(ids, o);
    ASSERT_EQ(r.reuse_steps.size(), 3u);
    leads = {r.reuse_steps[0].lead, r.reuse_steps[1].lead};
  }
  std::printf("selective lead %.5f, cacheblend-after-selective lead %.5f\n", leads[0], leads[1]);
  ASSERT_GT(leads[0], 0.0f);
  for (int k = 0; k < 2; ++k) {
    auto e = Engine::load(stories(), opts());  // fresh tallies: the ladder starts at selective
    std::vector<int64_t> segs;
    const auto ids = prepare(*e, &segs);
    GenerateOptions o = base(segs);
    o.reuse.guard_risk = 0;
    o.reuse.guard_lead = k == 0 ? leads[0] * 0.99f : leads[0] * 1.001f;
    const GenerateResult r = e->generate_ids(ids, o);
    if (k == 0) {
      ASSERT_EQ(r.reuse_steps.size(), 1u);
      EXPECT_EQ(r.reuse_steps[0].repair, "selective");
      EXPECT_TRUE(r.reuse_steps[0].kept);
      EXPECT_FALSE(r.guarded);
    } else {
      ASSERT_GE(r.reuse_steps.size(), 2u);
      EXPECT_FALSE(r.reuse_steps[0].kept);
      EXPECT_EQ(r.reuse_steps[1].repair, "cacheblend");
      EXPECT_EQ(r.reuse_steps[1].lead, leads[1]);
      const bool blend_kept = leads[1] >= o.reuse.guard_lead;
      EXPECT_EQ(r.reuse_steps[1].kept, blend_kept);
      EXPECT_EQ(r.reuse_steps.size(), blend_kept ? 2u : 3u);
      EXPECT_EQ(r.guarded, !blend_kept);
    }
  }
}

// Each step has its own error model: with selective's learned errors wide (its threshold above the
// prompt's lead) and cacheblend's narrow, the ladder trips at selective and stops at cacheblend.
TEST(ReuseAuto, PerModeErrorModelsPickTheStepThatStands) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  // A prompt whose first token leads by less than the thresholds' cap (kGuardMaxLead).
  std::vector<int64_t> segs;
  std::vector<int32_t> ids;
  for (const char* q : {" She", " The dog", " One day, the", " Tom and", " Once upon a time"}) {
    ids = prepare(*e, &segs, q);
    GenerateOptions off = base(segs);
    off.max_new_tokens = 1;
    off.reuse.guard_lead = 0;
    if (e->generate_ids(ids, off).first_lead < 0.8f * kGuardMaxLead) break;
  }
  for (float x : {5.0f, 5.2f, 4.9f, 5.1f, 5.05f}) e->guard_observe(ReuseMode::kSelective, x);
  for (float x : {0.01f, -0.01f, 0.0f, 0.005f, 0.002f}) e->guard_observe(ReuseMode::kCacheBlend, x);
  GenerateOptions full = base(segs);
  full.prefix_cache = false;
  const Outcome fr = run(*e, ids, full);
  GenerateOptions o = base(segs);  // guard_lead 0.3, guard_risk 0.05: the adaptive thresholds
  const Outcome g = run(*e, ids, o);
  const auto& st = g.res.reuse_steps;
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].repair, "selective");
  EXPECT_FALSE(st[0].kept);
  EXPECT_EQ(st[0].limit, kGuardMaxLead);
  EXPECT_EQ(st[1].repair, "cacheblend");
  EXPECT_TRUE(st[1].kept);
  EXPECT_LT(st[1].limit, 0.1f);
  EXPECT_FALSE(g.res.guarded);
  EXPECT_GT(st[1].rows, 0);
  // No recompute: the approximate answer stands (here the forced, too narrow cacheblend error
  // model lets a changed first token through: what a wrong calibration costs).
  EXPECT_GT(worst_diff(g.logits[0], fr.logits[0]), 1e-4f);
  std::printf("kept at cacheblend: lead %.3f (threshold %.3f); first token %d, full prefill's %d\n", st[1].lead,
              st[1].limit, g.res.output_ids[0], fr.res.output_ids[0]);
}

// The first step follows the guard's tallies: once selective (and cacheblend) keep tripping,
// starting at selective costs more than starting at cacheblend, and auto starts there.
TEST(ReuseAuto, FirstStepMovesToCacheBlendWhenSelectiveKeepsTripping) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = prepare(*e, &segs);
  GenerateOptions o = base(segs);
  o.max_new_tokens = 1;
  o.reuse.guard_lead = 1e9f;
  o.reuse.guard_risk = 0;
  int first_blend = -1;
  for (int i = 0; i < 30 && first_blend < 0; ++i) {
    const GenerateResult r = e->generate_ids(ids, o);
    ASSERT_FALSE(r.reuse_steps.empty());
    if (r.reuse_steps[0].repair == "cacheblend") {
      first_blend = i;
      EXPECT_EQ(r.reuse_steps.size(), 2u) << "cacheblend, then the recompute";
    } else {
      EXPECT_EQ(r.reuse_steps[0].repair, "selective");
    }
  }
  EXPECT_GT(first_blend, 0) << "a fresh engine starts at selective";
  const Engine::GuardCalibration c = e->guard_calibration();
  EXPECT_EQ(c.n_tripped[size_t(ReuseMode::kSelective)], first_blend);
  EXPECT_EQ(c.n_checked[size_t(ReuseMode::kSelective)], first_blend);
}

// After selective trips, the CacheBlend step runs only when it pays for itself: with a
// calibration whose CacheBlend steps have always tripped (50 of 50), c_blend + p_blend c_full is
// above c_full, so the ladder goes from selective straight to the exact recompute (the full
// prefill's logits), while a fresh engine (p_blend = 1/2) still tries CacheBlend on the same prompt.
// The selective step also reports the deviation of its repaired rows' cached K/V from the fresh
// ones (positive: the document's K/V were computed after other text).
// Catches: an escalation that ignores the trip rate, and a probe that compares a row with itself.
TEST(ReuseAuto, LadderSkipsACacheBlendStepThatKeepsTripping) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = test::make_temp_dir("guard_skip");
  auto e = Engine::load(stories(), opts());
  std::vector<int64_t> segs;
  const auto ids = prepare(*e, &segs);
  GenerateOptions o = base(segs);
  o.reuse.guard_lead = 1e9f;  // always trips
  o.reuse.guard_risk = 0;
  const Outcome fresh = run(*e, ids, o);
  ASSERT_EQ(fresh.res.reuse_steps.size(), 3u);
  EXPECT_EQ(fresh.res.reuse_steps[1].repair, "cacheblend");
  EXPECT_GT(fresh.res.reuse_steps[0].deviation, 1e-6f);
  EXPECT_TRUE(std::isnan(fresh.res.reuse_steps[1].deviation));
  {
    std::ofstream f(dir + "/calib.txt");
    f << "kvboost-guard-calibration 1\nmodel " << e->model_id() << "\n"
      << "mode prefix checked 0 tripped 0 errors 0\nmode none checked 0 tripped 0 errors 0\n"
      << "mode selective checked 0 tripped 0 errors 0\nmode cacheblend checked 50 tripped 50 errors 0\nend 4\n";
  }
  EngineOptions eo = opts();
  eo.guard_file = dir + "/calib.txt";
  auto e2 = Engine::load(stories(), eo);
  std::vector<int64_t> segs2;
  const auto ids2 = prepare(*e2, &segs2);
  ASSERT_EQ(ids2, ids);
  GenerateOptions full = base(segs2);
  full.prefix_cache = false;
  const Outcome fr = run(*e2, ids2, full);
  const Outcome g = run(*e2, ids2, o);
  const auto& st = g.res.reuse_steps;
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].repair, "selective");
  EXPECT_FALSE(st[0].kept);
  EXPECT_EQ(st[1].repair, "recompute");
  EXPECT_EQ(st[1].rows, int64_t(ids.size()) - segs2[0]);
  EXPECT_EQ(g.res.output_ids, fr.res.output_ids);
  for (size_t i = 0; i < fr.logits.size(); ++i) EXPECT_LT(worst_diff(g.logits[i], fr.logits[i]), 1e-5f) << "step " << i;
}

// Calibration round trip: saved beside the chunk store after a learned sample, loaded by a new
// engine on the same directory (the restart), and the threshold a request then gets is the one
// the loaded samples give.
TEST(ReuseAuto, CalibrationSurvivesARestartBesideTheChunkStore) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = test::make_temp_dir("guard_calib");
  EngineOptions eo = opts();
  eo.chunk_store.disk_dir = dir;
  Engine::GuardCalibration before;
  std::string file;
  {
    auto e = Engine::load(stories(), eo);
    file = e->guard_file();
    EXPECT_EQ(file, dir + "/guard-" + e->model_id() + ".txt");
    std::vector<int64_t> segs;
    const auto ids = prepare(*e, &segs);
    GenerateOptions o = base(segs);
    o.max_new_tokens = 1;
    o.reuse.guard_lead = 1e9f;  // trips: the recompute gives error samples, saved
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(e->generate_ids(ids, o).guarded);
    for (float x : {0.05f, -0.02f, 0.11f}) e->guard_observe(ReuseMode::kCacheBlend, x);
    e->save_guard_calibration(file);
    before = e->guard_calibration();
    EXPECT_GE(before.errors[size_t(ReuseMode::kSelective)].size(), 2u);
    // cacheblend: one sample per CacheBlend step the ladder took (the first prompt's at least; the
    // second may go from selective straight to the recompute once CacheBlend's trip rate makes
    // it a loss), plus the 3 observed.
    EXPECT_GE(before.n_checked[size_t(ReuseMode::kCacheBlend)], 1);
    EXPECT_EQ(before.errors[size_t(ReuseMode::kCacheBlend)].size(), 3u + size_t(before.n_checked[size_t(ReuseMode::kCacheBlend)]));
  }
  ASSERT_TRUE(file_exists(file));
  auto e = Engine::load(stories(), eo);
  const Engine::GuardCalibration after = e->guard_calibration();
  for (size_t m = 0; m < 4; ++m) {
    EXPECT_EQ(after.errors[m], before.errors[m]) << m;
    EXPECT_EQ(after.n_checked[m], before.n_checked[m]) << m;
    EXPECT_EQ(after.n_tripped[m], before.n_tripped[m]) << m;
  }
  // A cacheblend request's threshold comes from the loaded samples, not from guard_lead.
  std::vector<int64_t> segs;
  const auto ids = prepare(*e, &segs);
  GenerateOptions o = base(segs);
  o.max_new_tokens = 1;
  o.reuse.mode = ReuseMode::kCacheBlend;
  o.reuse.guard_lead = 1e6f;
  const GenerateResult r = e->generate_ids(ids, o);
  EXPECT_NEAR(r.guard_lead, guard_threshold(before.errors[size_t(ReuseMode::kCacheBlend)], o.reuse.guard_risk, 1e6f), 1e-6f);
}

// Corrupt, truncated or foreign files: load throws an Error naming the file and the line and
// leaves the calibration as it was; Engine::load with such a file warns and starts empty.
TEST(ReuseAuto, BadCalibrationFilesAreClearErrorsNeverCrashes) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = test::make_temp_dir("guard_bad");
  auto e = Engine::load(stories(), opts());
  for (float x : {0.1f, 0.2f, -0.1f, 0.0f}) e->guard_observe(ReuseMode::kSelective, x);
  const std::string good = dir + "/good.txt";
  e->save_guard_calibration(good);
  const std::string text = read_file(good);
  const Engine::GuardCalibration ref = e->guard_calibration();
  auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir + "/" + name, std::ios::binary) << body;
    return dir + "/" + name;
  };
  std::string bad_sample = text;
  bad_sample.replace(bad_sample.find("errors 4 ") + 9, 1, "nan ");
  std::string other_model = text;
  other_model.replace(other_model.find("kvb1-") + 5, 4, "ffff");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated.txt", text.substr(0, text.size() / 2)},
      {"cut_end.txt", text.substr(0, text.rfind("end"))},
      {"empty.txt", ""},
      {"garbage.txt", std::string("\x00\xff\x13 binary", 10)},
      {"nan.txt", bad_sample},
      {"model.txt", other_model},
      {"counts.txt", std::string(text).replace(text.find("tripped 0"), 9, "tripped 9")},
  };
  for (const auto& [name, body] : cases) {
    SCOPED_TRACE(name);
    const std::string path = write(name, body);
    try {
      e->load_guard_calibration(path);
      ADD_FAILURE() << "loaded a bad file";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(path), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("line"), std::string::npos) << err.what();
    }
    EXPECT_EQ(e->guard_calibration().errors, ref.errors) << "unchanged";
    EngineOptions eo = opts();
    eo.guard_file = path;
    auto fresh = Engine::load(stories(), eo);  // warns, does not throw
    for (const auto& v : fresh->guard_calibration().errors) EXPECT_TRUE(v.empty());
  }
  EXPECT_THROW(e->load_guard_calibration(dir + "/missing.txt"), Error);
  e->load_guard_calibration(good);  // and the good file still loads
  EXPECT_EQ(e->guard_calibration().errors, ref.errors);
}
