// Speculative decoding under a grammar (response_format json_schema): drafts are cut where the
// grammar rejects them, each verified row is masked in the matcher's state after the tokens
// before it, and the matcher is rolled back over rejected drafts. Greedy output equals decoding
// without speculation token for token and always parses; sampled output always parses.
#include "kvboost/grammar.h"
#include "kvboost/runtime.h"
#include "speculative.h"
#include "test_util.h"

using namespace kvboost;
using ojson = nlohmann::ordered_json;

namespace {
std::string stories() { return test::shared_path("models/stories260K"); }

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "story": {"type": "string", "maxLength": 200},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age", "story", "ok"]
})";

// Prompts whose JSON answer can quote them (lookup drafts) and ones it cannot.
const std::vector<std::string> kPrompts = {
    "{\"name\": \"Lily\", \"age\": 3, \"story\": \"Once upon a time, there was a little girl named Lily.\", \"ok\": true}\n"
    "{\"name\": \"Lily\", \"age\": 3, \"story\": \"Once upon a time",
    "Once upon a time, there was a little girl named Lily. She liked to play in the park.",
    "{\"name\": \"Tom\", \"age\": 7, \"story\": \"Tom had a big red ball.\", \"ok\": false}\n{\"name\": \"Tom\"",
    "The cat sat on the mat. The cat sat on the",
};

void expect_valid(const std::string& text) {
  ojson j;
  ASSERT_NO_THROW(j = ojson::parse(text)) << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j["name"].is_string()) << text;
  ASSERT_TRUE(j["age"].is_number_integer() && j["age"].get<int64_t>() >= 0 && j["age"].get<int64_t>() <= 150) << text;
  ASSERT_TRUE(j["story"].is_string()) << text;
  ASSERT_TRUE(j["ok"].is_boolean()) << text;
}

std::shared_ptr<const grammar::CompiledGrammar> schema_grammar(const Engine& e) {
  return grammar::CompiledGrammar::get(grammar::json_schema_to_gbnf(ojson::parse(kSchema)),
                                       grammar::TokenVocab::of(e.tokenizer()));
}
}  // namespace

TEST(SpeculativeGrammar, FilterKeepsTheAcceptedPrefixAndRestoresTheState) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  const auto cg = schema_grammar(*e);
  grammar::Matcher m(cg);
  const std::vector<int32_t> eos = {e->tokenizer().eos_id().value_or(2)};
  ASSERT_TRUE(m.accept_bytes("{\"name\": \"Li"));
  const auto before = m.state().stacks;
  const size_t n0 = m.n_accepted();
  // "ly\", \"age\": 3" is a valid continuation; then a token the grammar rejects there.
  std::vector<int32_t> d = e->tokenizer().encode("ly\", \"age\": 3", false);
  const size_t good = d.size();
  for (int32_t t : d) ASSERT_TRUE(m.accept(t, eos));
  auto rejected_here = [&] {  // the first token the grammar rejects in m's state
    for (int32_t t = 3; t < int32_t(e->tokenizer().vocab_size()); ++t) {
      if (!m.accept(t, eos)) return t;
      m.rollback(1);
    }
    return int32_t(-1);
  };
  const int32_t bad_id = rejected_here();
  ASSERT_GE(bad_id, 0);
  m.rollback(good);
  ASSERT_EQ(m.state().stacks, before);
  d.push_back(bad_id);
  d.insert(d.end(), d.begin(), d.begin() + 2);  // acceptable again, but after the rejected one
  EXPECT_EQ(grammar_filter_drafts(m, eos, &d), good);
  EXPECT_EQ(d.size(), good);
  EXPECT_EQ(m.state().stacks, before);
  EXPECT_EQ(m.n_accepted(), n0);
  std::vector<int32_t> rejected_first = {rejected_here(), d[0]};
  ASSERT_GE(rejected_first[0], 0);
  EXPECT_EQ(grammar_filter_drafts(m, eos, &rejected_first), 0u);
  EXPECT_TRUE(rejected_first.empty());
}

TEST(SpeculativeGrammar, GreedyJsonSchemaLookupEqualsPlainAndParses) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.spec.adaptive = false;  // draft whenever lookup finds a match
  auto e = Engine::load(stories(), eo);
  const auto cg = schema_grammar(*e);
  int64_t drafted = 0, accepted = 0, passes = 0, tokens = 0;
  for (const auto& p : kPrompts) {
    GenerateOptions o;
    o.max_new_tokens = 400;  // the schema bounds every string: always enough
    o.sampling.temperature = 0.0f;
    o.prefix_cache = false;
    o.grammar = cg;
    o.speculative.mode = SpecMode::kOff;
    const GenerateResult off = e->generate(p, o);
    expect_valid(off.text);
    EXPECT_EQ(off.finish_reason, "stop") << off.text;
    for (int k : {2, 8}) {
      o.speculative.mode = SpecMode::kLookup;
      o.speculative.draft_tokens = k;
      const GenerateResult on = e->generate(p, o);
      ASSERT_EQ(on.output_ids, off.output_ids) << p << " k=" << k << "\n" << on.text << "\n" << off.text;
      EXPECT_EQ(on.text, off.text);
      EXPECT_EQ(on.finish_reason, off.finish_reason);
      drafted += on.spec_drafted, accepted += on.spec_accepted, passes += on.decode_passes;
      tokens += int64_t(on.output_ids.size()) - 1;
    }
  }
  std::printf("grammar + lookup: drafted %lld, accepted %lld, %.2f tokens per pass\n", (long long)drafted,
              (long long)accepted, double(tokens) / double(std::max<int64_t>(passes, 1)));
  EXPECT_GT(drafted, 20);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(passes, tokens);
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
}

TEST(SpeculativeGrammar, SampledBatchedJsonSchemaAlwaysParses) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.spec.adaptive = false;
  eo.spec.max_batch = 16;
  auto e = Engine::load(stories(), eo);
  const auto cg = schema_grammar(*e);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 12; ++i) {
    GenerateOptions o;
    o.max_new_tokens = 400;
    o.sampling.temperature = 1.0f;
    o.sampling.seed = uint64_t(i + 1);
    o.grammar = cg;
    o.speculative.mode = SpecMode::kLookup;
    o.speculative.draft_tokens = 4;
    reqs.push_back(e->submit(e->tokenizer().encode(kPrompts[size_t(i) % kPrompts.size()], true), o));
  }
  while (e->has_work()) e->step();
  int64_t drafted = 0;
  for (auto& r : reqs) {
    const GenerateResult res = r->result();
    EXPECT_EQ(res.finish_reason, "stop") << res.text;
    expect_valid(res.text);
    drafted += res.spec_drafted;
  }
  EXPECT_GT(drafted, 0);
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
}
