// Error reporting: the file and field at fault are named.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using kvboost::Tokenizer;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const kvboost::Error& e) {
    return e.what();
  }
  return "<no error>";
}

const char* kMinimal = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

}  // namespace

#define EXPECT_CONTAINS(hay, needle) EXPECT_NE((hay).find(needle), std::string::npos) << (hay)

TEST(TokenizerErrors, MissingFile) {
  std::string dir = kvboost::test::make_temp_dir("tok_missing");
  std::string msg = error_of([&] { Tokenizer::from_dir(dir); });
  EXPECT_CONTAINS(msg, dir + "/tokenizer.json");
}

TEST(TokenizerErrors, MalformedJson) {
  std::string dir = kvboost::test::make_temp_dir("tok_malformed");
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {";
  std::string msg = error_of([&] { Tokenizer::from_dir(dir); });
  EXPECT_CONTAINS(msg, "tokenizer.json");
  EXPECT_CONTAINS(msg, "malformed JSON");
  msg = error_of([&] { Tokenizer::from_json(kMinimal, "{oops", "x/tokenizer.json"); });
  EXPECT_CONTAINS(msg, "tokenizer_config.json");
}

TEST(TokenizerErrors, UnsupportedTypesAreNamed) {
  std::string msg = error_of([] { Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"); });
  EXPECT_CONTAINS(msg, "model");
  EXPECT_CONTAINS(msg, "WordPiece");
  msg = error_of([] {
    Tokenizer::from_json(R"({"normalizer": {"type": "BertNormalizer"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  });
  EXPECT_CONTAINS(msg, "normalizer");
  EXPECT_CONTAINS(msg, "BertNormalizer");
  msg = error_of([] {
    Tokenizer::from_json(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]},
                            "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  });
  EXPECT_CONTAINS(msg, "pre_tokenizer.pretokenizers[0]");
  EXPECT_CONTAINS(msg, "Whitespace");
  msg = error_of([] {
    Tokenizer::from_json(R"({"decoder": {"type": "WordPiece"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  });
  EXPECT_CONTAINS(msg, "decoder");
  EXPECT_CONTAINS(msg, "WordPiece");
  msg = error_of([] { Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})"); });
  EXPECT_CONTAINS(msg, "merges[0]");
  EXPECT_CONTAINS(msg, "'c'");
  msg = error_of([] { Tokenizer::from_json(R"({"normalizer": null})"); });
  EXPECT_CONTAINS(msg, "model");
}

TEST(TokenizerErrors, MinimalModelWorks) {
  Tokenizer t = Tokenizer::from_json(kMinimal);
  EXPECT_EQ(t.encode("abab", false), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t.encode("aba", false), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(t.encode("ac", false), (std::vector<int32_t>{0}));  // no unk_token: dropped, as HF
  EXPECT_EQ(t.decode({2, 0}), "ab a");                           // no decoder: joined by spaces
  // Merges also load in the [a, b] pair form.
  Tokenizer p = Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})");
  EXPECT_EQ(p.encode("ab", false), (std::vector<int32_t>{2}));
}

// Token ids that are not int32 integers (a float such as 1e300 was cast to int32_t: undefined
// behaviour, found by fuzz_tokenizer_json in CI 2026-12-04) are Errors naming the field.
TEST(TokenizerErrors, NonIntegerTokenIdsAreNamed) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})";
  std::string msg = error_of([&] {
    Tokenizer::from_json(R"({"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
      {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [1e300]}}}, )" + model + "}");
  });
  EXPECT_CONTAINS(msg, "special_tokens[\"<s>\"].ids");
  EXPECT_CONTAINS(msg, "not an integer");
  msg = error_of([&] {
    Tokenizer::from_json(R"({"post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 4294967296], "sep": ["[SEP]", 1]}, )" +
                         model + "}");
  });
  EXPECT_CONTAINS(msg, ".cls");
  EXPECT_CONTAINS(msg, "out of range");
  msg = error_of([&] { Tokenizer::from_json(R"({"added_tokens": [{"id": -1e300, "content": "x"}], )" + model + "}"); });
  EXPECT_CONTAINS(msg, "added_tokens[0]");
  EXPECT_CONTAINS(msg, "not an integer");
}

// A component "type" that is not a string (fuzz_tokenizer_json, CI 2026-12-04: {"type": 1} in a
// post_processor escaped as json::type_error) and a tokenizer_config field of the wrong JSON type
// are Errors naming the component, not exceptions of another kind.
TEST(TokenizerErrors, NonStringFieldsAreNamed) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})";
  for (const char* part : {"normalizer", "pre_tokenizer", "decoder", "post_processor"}) {
    const std::string msg = error_of([&] {
      Tokenizer::from_json(std::string(R"({")") + part + R"(": {"type": 1}, )" + model + "}");
    });
    EXPECT_CONTAINS(msg, part);
    EXPECT_CONTAINS(msg, "expected a string");
  }
  Tokenizer t = Tokenizer::from_json("{" + model + "}", R"({"tokenizer_class": 7, "add_bos_token": "yes"})");
  EXPECT_EQ(t.encode("a", true), (std::vector<int32_t>{0}));
  const std::string msg = error_of([&] {
    Tokenizer::from_json(R"({"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 3}}]}, )" +
                         model + "}");
  });
  EXPECT_CONTAINS(msg, "post_processor");
}
