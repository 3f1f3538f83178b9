// The engine end to end on stories260K: tokenizer + prefill + decode + detokenize + stream.
#include <nlohmann/json.hpp>

#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }
}  // namespace

TEST(Engine, Stories260KStoryStreamsExactly) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  auto ref = nlohmann::json::parse(read_file(stories() + "/reference_greedy.json"));
  for (const auto& cs : ref["cases"]) {
    GenerateOptions opt;
    opt.max_new_tokens = int(cs["greedy_ids"].size());
    std::string streamed;
    opt.on_text = [&](std::string_view s) {
      streamed += s;
      return true;
    };
    GenerateResult r = e->generate(cs["prompt"].get<std::string>(), opt);
    EXPECT_EQ(r.prompt_ids, cs["prompt_ids"].get<std::vector<int32_t>>());
    auto want = cs["greedy_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got(r.output_ids.begin(), r.output_ids.begin() + std::min(r.output_ids.size(), want.size()));
    EXPECT_EQ(got, want);
    EXPECT_EQ(streamed, r.text);
    // The text continues the prompt: decode(prompt + output) minus decode(prompt), which keeps
    // the first token's leading space (decode(want) alone strips it).
    std::vector<int32_t> all = r.prompt_ids;
    all.insert(all.end(), want.begin(), want.end());
    const std::string head = e->tokenizer().decode(r.prompt_ids, true), full = e->tokenizer().decode(all, true);
    ASSERT_EQ(full.rfind(head, 0), 0u);
    EXPECT_EQ(r.text, full.substr(head.size(), r.text.size()));
    EXPECT_GT(r.ttft_ms, 0);
  }
  GenerateOptions opt;
  opt.max_new_tokens = 20;
  GenerateResult r = e->generate("Once upon a time", opt);
  EXPECT_EQ(r.text.rfind(", there was a little girl named Lily.", 0), 0u) << r.text;
  EXPECT_EQ(r.finish_reason, "length");
}

TEST(Engine, StopStringsEosAndLimits) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions opt;
  opt.max_new_tokens = 100;
  opt.stop = {"Lily."};
  GenerateResult r = e->generate("Once upon a time", opt);
  EXPECT_EQ(r.text, ", there was a little girl named ");
  EXPECT_EQ(r.finish_reason, "stop");
  // a short story ends with BOS (eos_token_id [1, 2])
  opt.stop.clear();
  opt.max_new_tokens = 250;
  r = e->generate("The little dog was sad because", opt);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.output_ids.back(), 1);
  // cancel from the callback
  int calls = 0;
  opt.on_text = [&](std::string_view) { return ++calls < 3; };
  r = e->generate("Once upon a time", opt);
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_EQ(calls, 3);
  // a prompt longer than the context is an error, not a crash
  opt.on_text = nullptr;
  std::vector<int32_t> longp(600, 300);
  try {
    e->generate_ids(longp, opt);
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("600 tokens"), std::string::npos) << err.what();
  }
  // generation stops at the context end
  std::vector<int32_t> nearly(510, 300);
  opt.max_new_tokens = 50;
  opt.ignore_eos = true;
  r = e->generate_ids(nearly, opt);
  EXPECT_EQ(r.output_ids.size(), 2u);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_THROW(e->generate_ids({}, opt), Error);
}

TEST(Engine, SeededSamplingIsReproducible) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions opt;
  opt.max_new_tokens = 40;
  opt.sampling.temperature = 1.0f;
  opt.sampling.top_p = 0.9f;
  opt.sampling.seed = 42;
  auto a = e->generate("Once upon a time", opt);
  auto b = e->generate("Once upon a time", opt);
  EXPECT_EQ(a.output_ids, b.output_ids);
  opt.sampling.seed = 43;
  auto c = e->generate("Once upon a time", opt);
  EXPECT_NE(a.output_ids, c.output_ids);
}

// GenerateOptions::keep_special_tokens (the server sets it for Mistral v11 tool calls, whose
// [TOOL_CALLS]/[ARGS] markers are special tokens): special tokens stay in the text.
TEST(Engine, KeepSpecialTokensInText) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions opt;
  opt.max_new_tokens = 3;
  opt.forced_output = {0, 300, 0};  // <unk> (a special token), a word piece, <unk>
  const GenerateResult dropped = e->generate("Once upon a time", opt);
  EXPECT_EQ(dropped.text.find("<unk>"), std::string::npos) << dropped.text;
  opt.keep_special_tokens = true;
  const GenerateResult kept = e->generate("Once upon a time", opt);
  EXPECT_NE(kept.text.find("<unk>"), std::string::npos) << kept.text;
  EXPECT_EQ(kept.text.size(), dropped.text.size() + 2 * std::string("<unk>").size()) << kept.text << " | " << dropped.text;
}

// Idle work commits KV memory a bounded distance ahead of the blocks used, then stops; it
// changes no output (the blocks it touches hold nothing yet), and 0 turns it off.
TEST(Engine, IdleWorkPrefaultsAheadThenStops) {
  KVBOOST_REQUIRE_PATH(stories());
  GenerateOptions g;
  g.max_new_tokens = 24;
  EngineOptions off;
  off.kv_prefault_tokens = 0;
  auto e0 = Engine::load(stories(), off);
  EXPECT_FALSE(e0->idle_work());
  const std::string want = e0->generate("Once upon a time", g).text;

  EngineOptions on;
  on.kv_prefault_tokens = 4096;
  on.kv_budget_bytes = size_t(64) << 20;  // room past the frontier
  auto e = Engine::load(stories(), on);
  int calls = 0;
  while (e->idle_work() && calls < 100000) ++calls;
  EXPECT_GT(calls, 0);
  EXPECT_FALSE(e->idle_work());  // nothing left until blocks are used
  EXPECT_EQ(e->generate("Once upon a time", g).text, want);
  EXPECT_TRUE(e->idle_work());   // the used blocks moved the frontier
  while (e->idle_work()) {}
  EXPECT_EQ(e->generate("Once upon a time", g).text, want);
}
