// JSON Schema -> GBNF: acceptance/rejection of hand-picked documents, random documents sampled
// from the grammar checked against the schema by hand, unsupported keywords named.
#include <gtest/gtest.h>

#include <random>

#include "kvboost/grammar.h"

using namespace kvboost::grammar;
using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const TokenVocab> bytes_vocab() {
  static auto v = [] {
    std::vector<std::string> b;
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, char(i)));
    return std::make_shared<const TokenVocab>(b);
  }();
  return v;
}

bool accepts(const std::string& schema, const std::string& doc, bool strict = true) {
  const std::string g = json_schema_to_gbnf(ojson::parse(schema), strict);
  Matcher m(std::make_shared<const CompiledGrammar>(parse_gbnf(g), bytes_vocab()));
  return m.accept_bytes(doc) && m.is_complete();
}

// Samples a document from the grammar: random allowed bytes (ASCII-biased), ending when possible
// with probability 1/2 per step. Empty when it ran past max_len.
std::string sample(const std::shared_ptr<const CompiledGrammar>& cg, std::mt19937_64& rng, size_t max_len = 600) {
  Matcher m(cg);
  std::string out;
  while (out.size() < max_len) {
    if (m.must_end() || (m.is_complete() && rng() % 2 == 0)) return out;
    const auto bits = m.allowed();
    std::vector<int> ok;
    for (int t = 0; t < 256; ++t)
      if (((*bits)[size_t(t) >> 5] >> (t & 31)) & 1u) ok.push_back(t);
    if (ok.empty()) return "";
    int t = ok[rng() % ok.size()];
    for (int tries = 0; tries < 3 && t >= 0x80 && !m.state().partial_left; ++tries) t = ok[rng() % ok.size()];
    EXPECT_TRUE(m.accept(t));
    out += char(t);
  }
  return "";
}

std::string unsupported_feature(const std::string& schema) {
  try {
    json_schema_to_gbnf(ojson::parse(schema));
  } catch (const UnsupportedFeature& e) {
    return e.feature();
  }
  return "";
}

}  // namespace

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                            "c":{"type":"boolean"}},"required":["b"]})";
  EXPECT_TRUE(accepts(s, R"({"b": "x"})"));
  EXPECT_TRUE(accepts(s, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(accepts(s, R"({"a":-3,"b":""})"));
  EXPECT_TRUE(accepts(s, R"({"b": "x", "c": false})"));
  EXPECT_FALSE(accepts(s, R"({"a": 1})"));              // b missing
  EXPECT_FALSE(accepts(s, R"({"b": "x", "d": 1})"));    // strict: no additional properties
  EXPECT_FALSE(accepts(s, R"({"b": 1})"));
  EXPECT_FALSE(accepts(s, R"({"c": true, "b": "x"})"));  // schema order
  EXPECT_FALSE(accepts(s, R"({"b": "x",})"));
  EXPECT_FALSE(accepts(s, R"({})"));
}

TEST(JsonSchema, AdditionalPropertiesNeverShadowKnownKeys) {
  const std::string s = R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":{"type":"string"}})";
  EXPECT_TRUE(accepts(s, R"({"ab": 1, "x": "y"})"));
  EXPECT_TRUE(accepts(s, R"({"a": "y", "abc": "z"})"));
  EXPECT_FALSE(accepts(s, R"({"ab": "y"})"));
  EXPECT_FALSE(accepts(s, R"({"x": "y", "ab": "z"})"));  // "ab" as an additional key
  EXPECT_FALSE(accepts(s, R"({"x": 1})"));
  EXPECT_TRUE(accepts(R"({"type":"object","properties":{}})", "{}"));
  EXPECT_FALSE(accepts(R"({"type":"object","properties":{}})", R"({"a": 1})"));
  EXPECT_TRUE(accepts(R"({"type":"object"})", R"({"a": 1})"));  // no properties: any object
  // Not strict: additional properties allowed by default.
  EXPECT_TRUE(accepts(R"({"type":"object","properties":{"a":{"type":"null"}}})", R"({"a": null, "z": [1]})", false));
  EXPECT_FALSE(accepts(R"({"type":"object","properties":{"a":{"type":"null"}}})", R"({"a": null, "z": [1]})", true));
}

TEST(JsonSchema, EnumsConstsAndTypeLists) {
  EXPECT_TRUE(accepts(R"({"enum":["red","green",3,null]})", R"("green")"));
  EXPECT_TRUE(accepts(R"({"enum":["red","green",3,null]})", "3"));
  EXPECT_FALSE(accepts(R"({"enum":["red","green",3,null]})", R"("blue")"));
  EXPECT_TRUE(accepts(R"({"const":{"k":[1,2]}})", R"({"k":[1,2]})"));
  EXPECT_TRUE(accepts(R"({"type":["string","null"],"maxLength":2})", "null"));
  EXPECT_TRUE(accepts(R"({"type":["string","null"],"maxLength":2})", R"("ab")"));
  EXPECT_FALSE(accepts(R"({"type":["string","null"],"maxLength":2})", R"("abc")"));
  EXPECT_TRUE(accepts(R"({"type":"integer","nullable":true})", "null"));
}

TEST(JsonSchema, IntegerRanges) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 9}, {5, 123}, {-17, 4}, {-250, -3}, {10, 10}, {99, 1000}, {0, 65535}};
  for (const auto& [lo, hi] : ranges) {
    const std::string s = R"({"type":"integer","minimum":)" + std::to_string(lo) + R"(,"maximum":)" + std::to_string(hi) + "}";
    for (int64_t v = lo - 30; v <= hi + 30; v += (hi - lo > 1000 ? 97 : 1))
      ASSERT_EQ(accepts(s, std::to_string(v)), v >= lo && v <= hi) << s << " value " << v;
    EXPECT_FALSE(accepts(s, "0" + std::to_string(std::abs(lo) + 1))) << "leading zero";
  }
  EXPECT_TRUE(accepts(R"({"type":"integer","exclusiveMinimum":0})", "1"));
  EXPECT_FALSE(accepts(R"({"type":"integer","exclusiveMinimum":0})", "0"));
  EXPECT_TRUE(accepts(R"({"type":"integer","minimum":100})", "123456"));
  EXPECT_FALSE(accepts(R"({"type":"integer","minimum":100})", "99"));
  EXPECT_FALSE(accepts(R"({"type":"integer","minimum":100})", "-100"));
  EXPECT_TRUE(accepts(R"({"type":"integer","maximum":-5})", "-123456"));
  EXPECT_FALSE(accepts(R"({"type":"integer","maximum":-5})", "-4"));
  EXPECT_TRUE(accepts(R"({"type":"number","minimum":0})", "0.5"));
  EXPECT_FALSE(accepts(R"({"type":"number","minimum":0})", "-0.5"));
}

TEST(JsonSchema, ArraysStringsFormatsPatterns) {
  const std::string a = R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})";
  EXPECT_FALSE(accepts(a, "[1]"));
  EXPECT_TRUE(accepts(a, "[1, 2]"));
  EXPECT_TRUE(accepts(a, "[1,2,3]"));
  EXPECT_FALSE(accepts(a, "[1,2,3,4]"));
  EXPECT_TRUE(accepts(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})", R"(["a", 1])"));
  EXPECT_FALSE(accepts(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})", R"(["a", 1, 2])"));
  EXPECT_TRUE(accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("\u00e9\n")"));
  EXPECT_FALSE(accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("a")"));
  EXPECT_TRUE(accepts(R"({"type":"string","format":"date"})", R"("2026-12-01")"));
  EXPECT_FALSE(accepts(R"({"type":"string","format":"date"})", R"("2026-13-01")"));
  EXPECT_TRUE(accepts(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(accepts(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", R"("AB-123")"));
  EXPECT_FALSE(accepts(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", R"("AB-12")"));
  EXPECT_TRUE(accepts(R"({"type":"string","pattern":"x\"y"})", R"("ax\"yb")"));  // unanchored, escaped quote
}

TEST(JsonSchema, RefsDefsAndAnyOf) {
  const std::string s = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(accepts(s, R"({"v": 1, "next": {"v": 2, "next": null}})"));
  EXPECT_FALSE(accepts(s, R"({"v": 1, "next": {"v": 2}})"));
  EXPECT_TRUE(accepts(R"({"oneOf":[{"type":"string"},{"type":"array","items":{"type":"boolean"}}]})", "[true]"));
  EXPECT_EQ(unsupported_feature(R"({"$ref":"#/$defs/missing"})"), "$ref");
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_EQ(unsupported_feature(R"({"type":"array","uniqueItems":true})"), "uniqueItems");
  EXPECT_EQ(unsupported_feature(R"({"type":"object","patternProperties":{"^a":{}}})"), "patternProperties");
  EXPECT_EQ(unsupported_feature(R"({"type":"integer","multipleOf":3})"), "multipleOf");
  EXPECT_EQ(unsupported_feature(R"({"type":"string","format":"email"})"), "format: email");
  EXPECT_EQ(unsupported_feature(R"({"type":"number","maximum":3.5})"), "maximum");
  EXPECT_EQ(unsupported_feature(R"({"if":{},"then":{}})"), "if");
  EXPECT_EQ(unsupported_feature(R"({"type":"string","pattern":"(a)\\1"})"), "pattern");
  EXPECT_EQ(unsupported_feature(R"({"type":"object","properties":{"a":{}},"minProperties":1})"), "minProperties");
  EXPECT_EQ(unsupported_feature(R"({"description":"annotations are fine","title":"x","type":"null"})"), "");
}

// Documents sampled from the grammar, then checked against the schema by hand.
TEST(JsonSchema, SampledDocumentsValidate) {
  const ojson schema = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
      "kind": {"anyOf": [{"const": "x"}, {"type": "null"}]},
      "score": {"type": "number"}
    },
    "required": ["name", "age"]
  })");
  auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(json_schema_to_gbnf(schema)), bytes_vocab());
  std::mt19937_64 rng(1);
  int n_ok = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string doc = sample(cg, rng);
    if (doc.empty()) continue;  // ran long (numbers/strings): not a validity question
    ojson j;
    ASSERT_NO_THROW(j = ojson::parse(doc)) << doc;
    ASSERT_TRUE(j.is_object()) << doc;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << doc;
    const std::string name = j["name"].get<std::string>();
    ASSERT_GE(name.size(), 1u);
    ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << doc;
    ASSERT_TRUE(j["age"].get<int64_t>() >= 0 && j["age"].get<int64_t>() <= 150) << doc;
    if (j.contains("tags")) {
      ASSERT_TRUE(j["tags"].is_array() && j["tags"].size() <= 3) << doc;
      for (const auto& t : j["tags"]) ASSERT_TRUE(t == "a" || t == "b" || t == "c") << doc;
    }
    if (j.contains("kind")) ASSERT_TRUE(j["kind"].is_null() || j["kind"] == "x") << doc;
    if (j.contains("score")) ASSERT_TRUE(j["score"].is_number()) << doc;
    for (auto it = j.begin(); it != j.end(); ++it)
      ASSERT_TRUE(schema["properties"].contains(it.key())) << doc;
    ++n_ok;
  }
  EXPECT_GT(n_ok, 100);
}
