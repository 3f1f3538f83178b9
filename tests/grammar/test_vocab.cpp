// Token byte strings from real tokenizers: the bytes of a text's tokens join to the text.
#include <gtest/gtest.h>

#include <filesystem>

#include "kvboost/grammar.h"
#include "test_util.h"

using namespace kvboost;

namespace {
void check_joins(const std::string& dir, bool sentencepiece) {
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << dir << " missing";
  const Tokenizer tok = Tokenizer::from_dir(dir);
  const auto v = grammar::TokenVocab::of(tok);
  EXPECT_EQ(v.get(), grammar::TokenVocab::of(tok).get());  // cached
  for (const std::string text : {"Once upon a time, there was a little girl.\nShe said: \"hi!\"",
                                 "{\"a\": [1, 2.5e3], \"b\": null}", "caf\xC3\xA9 \xE2\x82\xAC 12"}) {
    std::string joined;
    for (int32_t id : tok.encode(text, false)) joined += v->bytes(id);
    // SentencePiece's normalizer prepends a space to the text.
    EXPECT_EQ(joined, sentencepiece ? " " + text : text) << dir;
  }
  if (auto eos = tok.eos_id()) {
    EXPECT_TRUE(v->bytes(*eos).empty()) << "special tokens have no bytes";
  }
}
}  // namespace

TEST(TokenVocab, Stories260KBytesJoinToText) { check_joins(kvboost::test::shared_path("models/stories260K"), true); }
TEST(TokenVocab, Qwen25BytesJoinToText) { check_joins(kvboost::test::shared_path("tokenizers/qwen2.5"), false); }

TEST(TokenVocab, TrieHoldsEveryNonEmptyToken) {
  const grammar::TokenVocab v({"ab", "a", "", "abc", "b", "ab"});
  size_t n = 0;
  for (const auto& node : v.nodes()) n += node.n_tokens;
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(v.max_len(), 3u);
}
