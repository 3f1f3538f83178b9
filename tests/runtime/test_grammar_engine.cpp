// Constrained decoding through the engine: sampled output at temperature 1 always parses, on
// stories260K and on a random-weight fixture (models that know no JSON), with requests batched
// together (each its own matcher state).
#include <regex>

#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
using ojson = nlohmann::ordered_json;

namespace {

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
    "kind": {"anyOf": [{"type": "null"}, {"const": "x"}]}
  },
  "required": ["name", "age", "ok"]
})";

void expect_valid(const std::string& text) {
  ojson j;
  ASSERT_NO_THROW(j = ojson::parse(text)) << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j["name"].is_string() && !j["name"].get<std::string>().empty()) << text;
  ASSERT_TRUE(j["age"].is_number_integer() && j["age"].get<int64_t>() >= 0 && j["age"].get<int64_t>() <= 150) << text;
  ASSERT_TRUE(j["ok"].is_boolean()) << text;
  if (j.contains("tags")) {
    ASSERT_TRUE(j["tags"].is_array() && j["tags"].size() <= 3) << text;
    for (const auto& t : j["tags"]) ASSERT_TRUE(t == "red" || t == "green") << text;
  }
  if (j.contains("kind")) ASSERT_TRUE(j["kind"].is_null() || j["kind"] == "x") << text;
  for (auto it = j.begin(); it != j.end(); ++it)
    ASSERT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "ok" || it.key() == "tags" || it.key() == "kind")
        << text;
}

void run_schema(Engine& e, int n_requests) {
  auto cg = grammar::CompiledGrammar::get(grammar::json_schema_to_gbnf(ojson::parse(kSchema)),
                                          grammar::TokenVocab::of(e.tokenizer()));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < n_requests; ++i) {
    GenerateOptions o;
    o.max_new_tokens = 400;  // the schema bounds every string and number: always enough
    o.sampling.temperature = 1.0f;
    o.sampling.seed = uint64_t(i + 1);
    o.grammar = cg;
    reqs.push_back(e.submit(e.tokenizer().encode("Once upon a time", true), o));
  }
  while (e.has_work()) e.step();
  for (auto& r : reqs) {
    const GenerateResult res = r->result();
    EXPECT_EQ(res.finish_reason, "stop") << res.text;
    expect_valid(res.text);
  }
  EXPECT_GT(cg->cache_stats().hits, 0);  // states repeat across requests and steps
}

}  // namespace

TEST(GrammarEngine, Stories260KSampledJsonAlwaysValidates) {
  const std::string dir = test::shared_path("models/stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  auto e = Engine::load(dir);
  run_schema(*e, 24);
}

TEST(GrammarEngine, RandomFixtureSampledJsonAlwaysValidates) {
  const std::string dir = test::make_temp_dir("grammar_fixture");
  FixtureSpec s = fixture_preset("tiny");
  write_fixture_model(dir, s);
  auto e = Engine::load(dir);
  run_schema(*e, 24);
}

TEST(GrammarEngine, ChoiceRegexAndGreedy) {
  const std::string dir = test::shared_path("models/stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  auto e = Engine::load(dir);
  const auto vocab = grammar::TokenVocab::of(e->tokenizer());
  for (float t : {0.0f, 1.0f}) {
    for (int seed = 0; seed < 6; ++seed) {
      GenerateOptions o;
      o.max_new_tokens = 64;
      o.sampling.temperature = t;
      o.sampling.seed = uint64_t(seed);
      o.grammar = grammar::CompiledGrammar::get(grammar::choice_to_gbnf({" yes", " no", " maybe so"}), vocab);
      const GenerateResult c = e->generate("Is it", o);
      EXPECT_TRUE(c.text == " yes" || c.text == " no" || c.text == " maybe so") << c.text;
      EXPECT_EQ(c.finish_reason, "stop");
      o.grammar = grammar::CompiledGrammar::get(grammar::regex_to_gbnf("[0-9]{3}-[a-z]{2,4}"), vocab);
      const GenerateResult r = e->generate("The code is", o);
      EXPECT_TRUE(std::regex_match(r.text, std::regex("[0-9]{3}-[a-z]{2,4}"))) << r.text;
    }
  }
}
