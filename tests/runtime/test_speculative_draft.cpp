// Draft-model speculation on a pair that agrees most of the time: stories260K drafting for a
// larger Llama grown around it (testing/fixture.h, write_grown_model). Greedy output equals plain
// decoding alone and batched; acceptance is meaningful (neither ~0 as with a random target nor 1
// as with itself); the draft's own paged KV stays consistent across rollbacks (drafts made from a
// long-lived sequence equal drafts made from a fresh one) and is all given back.
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
    "Tom had a big red ball.",
    "Mom and Dad",
    "A boy named Tim liked to jump.",
    "The sun was hot.",
};

std::string grown(const std::string& name, float scale, int64_t extra = 6, int64_t inter = 256) {
  const std::string dir = test::make_temp_dir(name);
  GrownSpec g;
  g.base_dir = stories();
  g.extra_layers = extra;
  g.intermediate = inter;
  g.residual_scale = scale;
  write_grown_model(dir, g);
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
}  // namespace

TEST(SpeculativeDraft, GrownModelWithZeroScaleIsTheBase) {
  KVBOOST_REQUIRE_PATH(stories());
  auto base = Engine::load(stories());
  auto same = Engine::load(grown("grown0", 0.0f));
  EXPECT_EQ(same->model().config().n_layers, base->model().config().n_layers + 6);
  EXPECT_GT(same->model().decode_weight_bytes(), 2 * base->model().decode_weight_bytes());
  for (const auto& p : kPrompts)
    EXPECT_EQ(same->generate(p, greedy(60, SpecMode::kOff)).output_ids, base->generate(p, greedy(60, SpecMode::kOff)).output_ids)
        << p;
}

TEST(SpeculativeDraft, StoriesDraftsForAGrownModelExactlyWithMeaningfulAcceptance) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string target = grown("grown_target", 5.0f);
  auto plain = Engine::load(target);
  EngineOptions eo;
  eo.spec.draft_model = stories();
  eo.spec.mode = SpecMode::kDraft;
  eo.spec.adaptive = false;
  eo.spec.max_batch = 16;
  eo.block_size = 16;
  auto spec = Engine::load(target, eo);
  std::vector<GenerateResult> alone;
  int64_t drafted = 0, accepted = 0, differs_from_base = 0;
  auto base = Engine::load(stories());
  for (const auto& p : kPrompts) {
    alone.push_back(plain->generate(p, greedy(80, SpecMode::kOff)));
    GenerateOptions o = greedy(80, SpecMode::kDraft);
    o.speculative.draft_tokens = 4;
    const GenerateResult on = spec->generate(p, o);
    ASSERT_EQ(on.output_ids, alone.back().output_ids) << p;
    drafted += on.spec_drafted, accepted += on.spec_accepted;
    differs_from_base += base->generate(p, greedy(80, SpecMode::kOff)).output_ids != on.output_ids;
  }
  const double rate = double(accepted) / double(std::max<int64_t>(drafted, 1));
  std::printf("stories260K drafting for the grown model: %lld drafted, acceptance %.2f, %lld of %zu outputs differ from the base's\n",
              (long long)drafted, rate, (long long)differs_from_base, kPrompts.size());
  EXPECT_GT(rate, 0.3);
  EXPECT_LT(rate, 1.0);      // the grown model is a different model: rejections (rollbacks) happen
  EXPECT_GT(differs_from_base, 0);
  // Batched: all prompts at once (each request its own sequence in the draft's KV).
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : kPrompts) {
    GenerateOptions o = greedy(80, SpecMode::kDraft);
    o.speculative.draft_tokens = 4;
    reqs.push_back(spec->submit(spec->tokenizer().encode(p, true), o));
  }
  int64_t max_drafted = 0;
  while (spec->has_work()) max_drafted = std::max(max_drafted, spec->step().n_drafted);
  EXPECT_GT(max_drafted, 4);  // more than one request drafted in a step
  for (size_t i = 0; i < kPrompts.size(); ++i) ASSERT_EQ(reqs[i]->result().output_ids, alone[i].output_ids) << kPrompts[i];
  EXPECT_EQ(spec->kv_stats().blocks_used, 0);
}

// The draft's KV after many catch-ups and truncations: a long-lived sequence drafts what a fresh
// sequence given the same history drafts, at every step, with some drafts "rejected" (the history
// continues with the grown model's token instead), and every block comes back at the end.
TEST(SpeculativeDraft, DraftKvRollbackStaysConsistent) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string target_dir = grown("grown_kv", 5.0f);
  auto target = Engine::load(target_dir);
  EngineOptions eo;
  eo.block_size = 16;
  auto d = load_draft_model(stories(), target->model(), target->tokenizer(), eo);
  ASSERT_EQ(d->kv->stats().blocks_used, 0);
  const int64_t V = target->model().config().vocab_size;
  for (const auto& p : {kPrompts[0], kPrompts[2], kPrompts[4]}) {
    std::vector<int32_t> h = target->tokenizer().encode(p, true);
    const std::vector<int32_t> truth = target->generate_ids(h, greedy(70, SpecMode::kOff)).output_ids;
    SpecState live;
    size_t next = 0;
    int64_t rejections = 0;
    while (next < truth.size()) {
      std::vector<int32_t> a, b;
      draft_model_tokens(*d, live, h, 4, V, &a);
      SpecState fresh;
      draft_model_tokens(*d, fresh, h, 4, V, &b);
      draft_model_release(*d, fresh);
      ASSERT_EQ(a, b) << p << " at " << h.size();
      // Accept the drafts the grown model agrees with, then its own token (a rejection or the bonus).
      size_t j = 0;
      while (j < a.size() && next < truth.size() && a[j] == truth[next]) h.push_back(truth[next++]), ++j;
      if (j < a.size()) ++rejections;
      if (next < truth.size()) h.push_back(truth[next++]);
    }
    EXPECT_GT(rejections, 0) << p;
    draft_model_release(*d, live);
    EXPECT_EQ(d->kv->stats().blocks_used, 0);
  }
}
