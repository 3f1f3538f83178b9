// Fixture tokenizers (make_fixture_tokenizer_json): exact vocabulary size, round trips,
// special tokens, determinism. The differential test checks them against Hugging Face.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using kvboost::Tokenizer;

namespace {

Tokenizer fixture(const std::string& kind, int vocab_size, uint64_t seed = 0) {
  return Tokenizer::from_json(kvboost::make_fixture_tokenizer_json(kind, vocab_size, seed),
                              kvboost::make_fixture_tokenizer_config_json(kind), "fixture " + kind);
}

const char* kTexts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "def greet(name):\n    return f\"Hello, {name}!\"\n",
    "  spaces\tand\ttabs\r\n\n",
    "你好，世界！ 😀👍🏽 👨\u200d👩\u200d👧 café naïve Привет 12345",
    "never seen: ꙮ 𓀀 ᚠ",
};

}  // namespace

TEST(TokenizerFixture, ByteLevelVocabularyAndRoundTrip) {
  for (int n : {260, 512, 1000, 4096}) {
    Tokenizer t = fixture("bytelevel", n);
    EXPECT_EQ(t.vocab_size(), n);
    EXPECT_EQ(t.token_to_id("<|endoftext|>"), n - 3);
    EXPECT_EQ(t.token_to_id("<|im_start|>"), n - 2);
    EXPECT_EQ(t.eos_id(), n - 1);
    EXPECT_FALSE(t.bos_id().has_value());
    EXPECT_TRUE(t.is_special(n - 1));
    for (const char* s : kTexts) {
      auto ids = t.encode(s);
      for (int32_t id : ids) ASSERT_LT(id, n - 3);
      EXPECT_EQ(t.decode(ids), s) << s;
    }
  }
  Tokenizer t = fixture("bytelevel", 1000);
  // Merges were learned: common words take far fewer tokens than bytes.
  EXPECT_LT(t.encode(kTexts[0]).size(), std::string(kTexts[0]).size() / 2);
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>").front(), 998);
  EXPECT_EQ(t.decode(t.encode("<|im_start|>user\nhi<|im_end|>"), true), "user\nhi");
}

TEST(TokenizerFixture, SentencePieceVocabularyAndRoundTrip) {
  for (int n : {260, 512, 1000, 4096}) {
    Tokenizer t = fixture("sentencepiece", n);
    EXPECT_EQ(t.vocab_size(), n);
    EXPECT_EQ(t.bos_id(), 1);
    EXPECT_EQ(t.eos_id(), 2);
    EXPECT_EQ(t.id_to_token(3), "<0x00>");
    EXPECT_EQ(t.id_to_token(258), "<0xFF>");
    for (const char* s : kTexts) {
      auto ids = t.encode(s);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.front(), 1);  // BOS
      EXPECT_EQ(t.decode(ids, true), s) << s;
    }
  }
  Tokenizer t = fixture("sentencepiece", 1000);
  EXPECT_LT(t.encode(kTexts[0]).size(), std::string(kTexts[0]).size() / 2);
}

TEST(TokenizerFixture, DeterministicInSeed) {
  for (const char* kind : {"bytelevel", "sentencepiece"}) {
    EXPECT_EQ(kvboost::make_fixture_tokenizer_json(kind, 700, 3), kvboost::make_fixture_tokenizer_json(kind, 700, 3));
    EXPECT_NE(kvboost::make_fixture_tokenizer_json(kind, 700, 3), kvboost::make_fixture_tokenizer_json(kind, 700, 4));
    auto j = nlohmann::json::parse(kvboost::make_fixture_tokenizer_json(kind, 700, 3));
    EXPECT_EQ(j["model"]["type"], "BPE");
    EXPECT_GT(j["model"]["merges"].size(), 100u);
  }
}

TEST(TokenizerFixture, LargeVocabularyIsFilled) {
  // More entries than the built-in text can teach: the rest are unreachable reserved pieces.
  Tokenizer t = fixture("bytelevel", 20000);
  EXPECT_EQ(t.vocab_size(), 20000);
  EXPECT_EQ(t.decode(t.encode(kTexts[3])), kTexts[3]);
}

TEST(TokenizerFixture, BadArguments) {
  EXPECT_THROW(kvboost::make_fixture_tokenizer_json("wordpiece", 1000, 0), kvboost::Error);
  EXPECT_THROW(kvboost::make_fixture_tokenizer_json("bytelevel", 100, 0), kvboost::Error);
  EXPECT_THROW(kvboost::make_fixture_tokenizer_config_json("wordpiece"), kvboost::Error);
}
