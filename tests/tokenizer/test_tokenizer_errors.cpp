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
