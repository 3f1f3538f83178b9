// Layer streaming through the Engine: greedy generation with a weight budget of two and three
// layers equals the resident model's, token for token.
#include <gtest/gtest.h>

#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "greedy.h"
#include "test_util.h"

using namespace kvboost;
using kvboost::test::greedy;

namespace {

std::string fixture_dir() {
  static const std::string dir = [] {
    const std::string d = test::make_temp_dir("stream_engine");
    FixtureSpec s = fixture_preset("tiny");
    s.arch = "llama", s.layers = 4, s.dtype = "bf16";
    write_fixture_model(d, s);
    return d;
  }();
  return dir;
}

}  // namespace

TEST(StreamEngine, GreedyGenerationEqualsResident) {
  const std::string dir = fixture_dir();
  auto resident = Engine::load(dir);
  ASSERT_FALSE(resident->model().stream_info().streaming);
  const std::vector<std::string> prompts{"Once upon a time", "The quick brown fox jumps over the lazy dog, and then"};
  std::vector<GenerateResult> want;
  for (const auto& p : prompts) want.push_back(resident->generate(p, greedy(24)));
  // One slot's size, from a load that streams.
  LoadOptions probe;
  probe.weight_budget = resident->model().weight_bytes() / 2;
  const uint64_t slot = Model::load(dir, probe)->stream_info().slot_bytes;
  ASSERT_GT(slot, 0u);
  for (uint64_t n : {2, 3}) {
    EngineOptions eo;
    eo.load.weight_budget = n * slot;
    auto e = Engine::load(dir, eo);
    ASSERT_TRUE(e->model().stream_info().streaming);
    EXPECT_EQ(e->model().stream_info().n_slots, int64_t(n));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const GenerateResult r = e->generate(prompts[i], greedy(24));
      EXPECT_EQ(r.output_ids, want[i].output_ids) << "budget " << n << " slots, prompt " << i;
      EXPECT_EQ(r.text, want[i].text);
    }
    // Again, from the prefix cache.
    const GenerateResult again = e->generate(prompts[0], greedy(24));
    EXPECT_EQ(again.output_ids, want[0].output_ids);
    EXPECT_GT(again.n_cached, 0);
  }
}

TEST(StreamEngine, BudgetBelowTwoLayersIsAnError) {
  EngineOptions eo;
  eo.load.weight_budget = 4096;
  try {
    Engine::load(fixture_dir(), eo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight budget of 4096 bytes"), std::string::npos) << e.what();
  }
}
