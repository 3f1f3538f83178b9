// The per-position split (MaskMode::kSplit) against the per-state trie walk (MaskMode::kWalk,
// itself checked against token-by-token matching in test_grammar.cpp): the same mask, bit for
// bit, over random walks through many grammars (JSON, bounded JSON Schema strings, a tool-call
// grammar, regexes, nullable and nested GBNF) on vocabularies shaped like real ones (word-like
// tokens sharing prefixes, tokens that close a string mid-token, split UTF-8 characters), and on
// the real Qwen2.5 vocabulary when ../shared has it.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "kvboost/grammar.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::grammar;
using ojson = nlohmann::ordered_json;

namespace {

// Tokens built from JSON-ish pieces and words, 1-4 pieces, sometimes cut inside a character.
std::shared_ptr<const TokenVocab> mixed_vocab(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "  ", "\n", "a", "ab", "the", "name",
                                          "x", "1", "0", "42", "-", ".", "e", "true", "null", "\\", "\\n", "\\u00",
                                          "@", "com", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "<tool_call>", "\"}"};
  std::vector<std::string> v;
  for (int i = 0; i < 256; ++i) v.push_back(std::string(1, char(i)));
  while (int(v.size()) < n) {
    std::string s;
    const int parts = 1 + int(rng() % 4);
    for (int p = 0; p < parts; ++p) s += atoms[rng() % atoms.size()];
    if (rng() % 6 == 0 && s.size() > 1) s = s.substr(rng() % 2, s.size() - 1);
    v.push_back(s);
  }
  v.push_back("");
  return std::make_shared<const TokenVocab>(v);
}

// A Hermes-style tool call over two functions' parameter schemas, shaped as the server's
// (src/server/api_tools.cpp) builds it.
std::string tool_call_gbnf() {
  const std::vector<std::pair<std::string, std::string>> fns = {
      {"get_weather", R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
          "unit":{"enum":["c","f"]}},"required":["city"]})"},
      {"search", R"({"type":"object","properties":{"q":{"type":"string"},"k":{"type":"integer","minimum":1,"maximum":20}},
          "required":["q","k"]})"}};
  std::string g = "root ::= \"<tool_call>\\n\" (", rules;
  for (size_t i = 0; i < fns.size(); ++i) {
    const std::string pre = "f" + std::to_string(i) + "-";
    rules += prefix_rules(json_schema_to_gbnf(ojson::parse(fns[i].second), true), pre);
    g += std::string(i ? " | " : " ") + gbnf_literal("{\"name\": \"" + fns[i].first + "\", \"arguments\": ") + " " + pre +
         "root \"}\"";
  }
  return g + " ) \"\\n</tool_call>\"\n" + rules;
}

std::vector<std::string> grammars() {
  return {
      json_gbnf(),
      json_gbnf(true),
      json_schema_to_gbnf(ojson::parse(R"({"type":"object","properties":{
        "name":{"type":"string","maxLength":24},"age":{"type":"integer","minimum":0,"maximum":120},
        "email":{"type":"string","pattern":"^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4},
        "address":{"type":"object","properties":{"city":{"type":"string","maxLength":20},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
                   "required":["city","zip"]}},"required":["name","age","email","tags","address"]})")),
      json_schema_to_gbnf(ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
        "anyOf":[{"$ref":"#/$defs/node"},{"type":"array","items":{"type":"boolean"},"minItems":1},{"type":"null"}]})")),
      tool_call_gbnf(),
      regex_to_gbnf("[a-z]{1,12}@[a-z]{1,12}\\.com"),
      regex_to_gbnf("(\xC3\xA9|\xE2\x82\xAC|[a-f ])+![0-9]{1,5}"),
      choice_to_gbnf({"the", "then", "\"quoted\"", "caf\xC3\xA9"}),
      // nullable rules, a rule that is only a tail call, nesting through a non-tail reference
      "root ::= item (\",\" sp item)* sp \"!\"\nitem ::= opt word opt | \"(\" root \")\"\nopt ::= \" \"?\n"
      "sp ::= opt\nword ::= [a-z\\u00e9]+ | \"\\\"\" [^\"]* \"\\\"\"\n",
  };
}

// Walks `walks` random paths of up to `steps` tokens, comparing the two modes' masks at each
// state; returns the split compilation (for its stats).
std::shared_ptr<const CompiledGrammar> compare(const std::string& gtext, const std::shared_ptr<const TokenVocab>& vocab,
                                               uint64_t seed, int walks, int steps) {
  auto g = parse_gbnf(gtext);
  auto split = std::make_shared<const CompiledGrammar>(g, vocab, MaskMode::kSplit);
  auto walk = std::make_shared<const CompiledGrammar>(g, vocab, MaskMode::kWalk);
  std::mt19937_64 rng(seed);
  for (int w = 0; w < walks; ++w) {
    Matcher ms(split), mw(walk);
    for (int step = 0; step < steps; ++step) {
      const auto a = ms.allowed(), b = mw.allowed();
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        const bool x = ((*a)[size_t(t) >> 5] >> (t & 31)) & 1u, y = ((*b)[size_t(t) >> 5] >> (t & 31)) & 1u;
        if (x != y) {
          ADD_FAILURE() << "token " << t << " '" << vocab->bytes(t) << "': split " << x << ", walk " << y << " at step "
                        << step << " of walk " << w << " in\n"
                        << gtext;
          return split;
        }
        if (x) ok.push_back(t);
      }
      if (ok.empty()) break;
      // Long tokens more often, so that walks get deep into the grammar.
      int32_t t = ok[rng() % ok.size()];
      for (int k = 0; k < 2; ++k) {
        const int32_t u = ok[rng() % ok.size()];
        if (vocab->bytes(u).size() > vocab->bytes(t).size()) t = u;
      }
      EXPECT_TRUE(ms.accept(t));
      EXPECT_TRUE(mw.accept(t));
      EXPECT_EQ(ms.state().stacks, mw.state().stacks);
    }
  }
  return split;
}

}  // namespace

TEST(Split, MasksEqualThePerStateWalkBitForBit) {
  int64_t entries = 0, checked = 0;
  uint64_t seed = 1;
  for (const auto& vocab : {mixed_vocab(1500, 7), mixed_vocab(4000, 8)})
    for (const std::string& g : grammars()) {
      const auto cg = compare(g, vocab, seed++, 5, 40);
      if (HasFailure()) return;
      const auto st = cg->cache_stats();
      EXPECT_GT(st.split_entries, 0) << g;
      entries += st.split_entries;
      checked += st.split_checked;
    }
  // The uncertain tokens (checked against the stack below) are exercised, not only stored masks.
  EXPECT_GT(checked, 0);
  EXPECT_GT(entries, 0);
}

TEST(Split, DefaultModeIsTheWalkAndTheSplitIsOptIn) {
  auto g = parse_gbnf(json_gbnf());
  const auto v = mixed_vocab(600, 3);
  if (const char* e = std::getenv("KVBOOST_GRAMMAR_SPLIT"); e && std::string(e) == "1") {
    EXPECT_GT(CompiledGrammar(g, v).cache_stats().split_entries, 0);
  } else {
    EXPECT_EQ(CompiledGrammar(g, v).cache_stats().split_entries, 0);
  }
  EXPECT_EQ(CompiledGrammar(g, v, MaskMode::kWalk).cache_stats().split_entries, 0);
  const auto st = CompiledGrammar(g, v, MaskMode::kSplit).cache_stats();
  EXPECT_GT(st.split_entries, 0);
  EXPECT_EQ(st.split_late, 0) << "the JSON grammar's entries are all foreseen at compile time";
}

// The real Qwen2.5 vocabulary (151k byte-level BPE tokens): the bounded schema and the tool call.
TEST(Split, MasksEqualTheWalkOnQwen25Vocabulary) {
  const std::string dir = kvboost::test::shared_path("tokenizers/qwen2.5");
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << dir << " missing";
  const Tokenizer tok = Tokenizer::from_dir(dir);
  const auto vocab = TokenVocab::of(tok);
  const auto gs = grammars();
  uint64_t seed = 100;
  for (const size_t i : {size_t(2), size_t(4)}) {
    compare(gs[i], vocab, seed++, 1, 20);
    if (HasFailure()) return;
  }
}
