// StreamDecoder: never emits half a UTF-8 character; concatenation equals decode(all).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using kvboost::StreamDecoder;
using kvboost::Tokenizer;

namespace {

bool is_complete_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Streams `ids`, checking every piece; returns the pieces.
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder sd(t, skip_special);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    pieces.push_back(sd.push(id));
    EXPECT_TRUE(is_complete_utf8(pieces.back()));
    EXPECT_EQ(pieces.back().find("\xEF\xBF\xBD"), std::string::npos) << "emitted U+FFFD mid-stream";
  }
  pieces.push_back(sd.finish());
  std::string all;
  for (auto& p : pieces) all += p;
  EXPECT_EQ(all, t.decode(ids, skip_special));
  return pieces;
}

const char* kTexts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "中文分词测试，你好世界！😀 👨\u200d👩\u200d👧 e\u0301",
    "<|im_start|>user\nhi 🇺🇸<|im_end|>",
};

}  // namespace

TEST(TokenizerStream, StoriesByteFallbackEmojiNeverHalf) {
  const std::string dir = kvboost::test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  Tokenizer t = Tokenizer::from_dir(dir);
  std::vector<int32_t> ids = t.encode("Hi 😀 and 中 ok");
  auto pieces = stream(t, ids, true);
  // The emoji is four <0xXX> tokens: the three pushes before its last byte emit nothing.
  int empty_run = 0, max_empty_run = 0;
  for (size_t k = 0; k + 1 < pieces.size(); ++k) {
    empty_run = pieces[k].empty() ? empty_run + 1 : 0;
    max_empty_run = std::max(max_empty_run, empty_run);
    if (pieces[k].find("\xF0\x9F\x98\x80") != std::string::npos) {
      EXPECT_GE(k, 4u);
    }
  }
  EXPECT_GE(max_empty_run, 3);
  // Strip(start=1) applies to the very first token only: later leading spaces survive.
  std::string joined;
  for (auto& p : pieces) joined += p;
  EXPECT_EQ(joined, "Hi 😀 and 中 ok");
  for (const char* s : kTexts) stream(t, t.encode(s), true);
  for (const char* s : kTexts) stream(t, t.encode(s), false);
}

TEST(TokenizerStream, ByteLevelSplitCharacters) {
  const std::string dir = kvboost::test::shared_path("tokenizers/qwen2.5");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  Tokenizer t = Tokenizer::from_dir(dir);
  for (const char* s : kTexts) {
    stream(t, t.encode(s), true);
    stream(t, t.encode(s), false);
  }
  // Feed "中" (e4 b8 ad) as three single-byte tokens: nothing until the last one.
  std::vector<int32_t> ids = {*t.token_to_id("Hi"), *t.token_to_id("\xc3\xa4"), *t.token_to_id("\xc2\xb8"),
                              *t.token_to_id("\xc5\x83")};  // 0xAD maps to U+0143
  auto pieces = stream(t, ids, true);
  EXPECT_EQ(pieces[0], "Hi");
  EXPECT_EQ(pieces[1], "");
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], "中");
  // A byte that never completes is released by finish() as U+FFFD, as decode() gives it.
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(*t.token_to_id("Hi")), "Hi");
  EXPECT_EQ(sd.push(*t.token_to_id("\xc3\xa4")), "");
  EXPECT_EQ(sd.finish(), "\xEF\xBF\xBD");
}

// A continuation after set_context(prompt): the text the ids add after the prompt, so a
// SentencePiece token keeps its leading space ("Once upon a" + " time"; decode(ids) alone strips
// it), whole characters only, and the byte-level tokenizer's text is unchanged by it.
TEST(TokenizerStream, ContinuationOfAPromptKeepsTheLeadingSpace) {
  const std::string dir = kvboost::test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  Tokenizer t = Tokenizer::from_dir(dir);
  for (const char* s : {"Once upon a time, there was a little girl.", "Hi 😀 and 中 ok", " x\n\n  y"}) {
    const std::vector<int32_t> all = t.encode(std::string("The story: ") + s);
    const std::vector<int32_t> prompt = t.encode("The story:");
    ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), all.begin()));  // (this split is a token boundary)
    StreamDecoder sd(t);
    sd.set_context(prompt);
    std::string got;
    for (size_t i = prompt.size(); i < all.size(); ++i) {
      const std::string piece = sd.push(all[i]);
      EXPECT_TRUE(is_complete_utf8(piece)) << s;
      got += piece;
    }
    got += sd.finish();
    EXPECT_EQ(t.decode(prompt) + got, t.decode(all)) << s;
    EXPECT_EQ(got.substr(0, 1), " ") << s;  // decode(generated ids) alone would start without it
  }
  const std::string q = kvboost::test::shared_path("tokenizers/qwen2.5");
  KVBOOST_REQUIRE_PATH(q + "/tokenizer.json");
  Tokenizer b = Tokenizer::from_dir(q);
  const std::vector<int32_t> prompt = b.encode("<|im_start|>assistant\n", false), out = b.encode("Hi 😀 there", false);
  StreamDecoder sd(b);
  sd.set_context(prompt);
  std::string got;
  for (int32_t id : out) got += sd.push(id);
  got += sd.finish();
  EXPECT_EQ(got, b.decode(out));
}
