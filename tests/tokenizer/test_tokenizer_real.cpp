// Real tokenizers (Qwen2.5, Llama 3, stories260K) against ids produced by Hugging Face
// `tokenizers` 0.21.1 (tools/oracle/tokenizer_oracle.py has the full differential test).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using kvboost::Tokenizer;

namespace {

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// Generated with /work/main/.venv/bin/python (tokenizers==0.21.1):
//   Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids
const std::vector<Vector> kQwenVectors = {
    {"Hello, world!", {9707, 11, 1879, 0}},
    {"  leading and   multiple   spaces  ", {220, 6388, 323, 256, 5248, 256, 12621, 256}},
    {"tabs\tand\nnewlines\r\nwindows\n\n\nend", {30993, 52477, 198, 931, 7969, 319, 27077, 1406, 408}},
    {"中文分词测试，你好世界！", {104811, 17177, 99689, 81705, 3837, 108386, 99489, 6313}},
    {"日本語のテキストとカタカナ", {101059, 102819, 15767, 56833, 61803, 70534, 19182, 70393, 46207, 70393, 95352}},
    {"emoji 😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇺🇸", {37523, 90316, 61804, 235, 145375, 61804, 101, 378, 235, 145233, 378, 235, 145665, 378, 235, 145988, 11162, 229, 118, 145383}},
    {"combining: e\u0301 a\u0308 n\u0303 and precomposed é", {21873, 5740, 25, 3958, 12709, 1683, 109, 323, 855, 92734, 3958}},
    {"numbers 1234567 3.14159 -42 1e10", {37378, 220, 16, 17, 18, 19, 20, 21, 22, 220, 18, 13, 16, 19, 16, 20, 24, 481, 19, 17, 220, 16, 68, 16, 15}},
    {"def f(x):\n    return x**2  # square\n", {750, 282, 2075, 982, 262, 470, 856, 334, 17, 220, 671, 9334, 198}},
    {"for (int i = 0; i < n; ++i) { sum += a[i]; }", {1958, 320, 396, 600, 284, 220, 15, 26, 600, 366, 308, 26, 3443, 72, 8, 314, 2629, 1421, 264, 989, 5265, 335}},
    {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", {151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198}},
    {"I'm sure they'll say it's fine, we've DONE IT'S", {40, 2776, 2704, 807, 3278, 1977, 432, 594, 6915, 11, 582, 3003, 54685, 8700, 13272}},
    {"العربية עברית हिन्दी", {31382, 23224, 125600, 131917, 123826, 84310, 42311, 101, 30484, 99, 43647}},
    {"<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|endoftext|>", {27, 91, 7265, 3575, 4326, 91, 29, 13048, 27, 91, 68, 354, 842, 91, 1784, 91, 2468, 8757, 842, 91, 29, 872, 27, 91, 408, 8757, 842, 91, 1339, 6023, 151643}},
    {"x = 'tab\there'  \t\t  \n  \n", {87, 284, 364, 6192, 197, 6739, 6, 35329, 30779}},
    {"   ", {262}},
    {"\n", {198}},
    {"a", {64}},
    {"", {}},
};
const std::vector<Vector> kLlama3Vectors = {
    {"Hello, world!", {9906, 11, 1917, 0}},
    {"  leading and   multiple   spaces  ", {220, 6522, 323, 256, 5361, 256, 12908, 256}},
    {"tabs\tand\nnewlines\r\nwindows\n\n\nend", {32093, 53577, 198, 943, 8128, 319, 28176, 1432, 408}},
    {"中文分词测试，你好世界！", {108891, 17620, 106015, 82805, 104660, 53901, 102616, 6447}},
    {"日本語のテキストとカタカナ", {102433, 102158, 16144, 57933, 62903, 71634, 19732, 71493, 47307, 71493, 96452}},
    {"emoji 😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇺🇸", {38623, 91416, 62904, 235, 9468, 237, 121, 62904, 101, 102470, 9468, 239, 102, 102470, 9468, 239, 100, 102470, 9468, 239, 99, 11410, 229, 118, 9468, 229, 116}},
    {"combining: e\u0301 a\u0308 n\u0303 and precomposed é", {22631, 5859, 25, 384, 54939, 264, 127104, 308, 119074, 323, 864, 93834, 4046}},
    {"numbers 1234567 3.14159 -42 1e10", {38478, 220, 4513, 10961, 22, 220, 18, 13, 9335, 2946, 482, 2983, 220, 16, 68, 605}},
    {"def f(x):\n    return x**2  # square\n", {755, 282, 2120, 997, 262, 471, 865, 334, 17, 220, 674, 9518, 198}},
    {"for (int i = 0; i < n; ++i) { sum += a[i]; }", {2000, 320, 396, 602, 284, 220, 15, 26, 602, 366, 308, 26, 3526, 72, 8, 314, 2694, 1447, 264, 1004, 5378, 335}},
    {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", {27, 91, 318, 5011, 91, 29, 882, 198, 6151, 27, 91, 318, 6345, 91, 397, 27, 91, 318, 5011, 91, 29, 78191, 198}},
    {"I'm sure they'll say it's fine, we've DONE IT'S", {40, 2846, 2771, 814, 3358, 2019, 433, 596, 7060, 11, 584, 3077, 55785, 8871, 13575}},
    {"العربية עברית हिन्दी", {107659, 124368, 17732, 95, 76625, 51326, 43336, 103, 85410, 100556, 101102, 44747}},
    {"<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|endoftext|>", {128000, 13347, 128009, 128006, 882, 128007, 271, 6151, 27, 91, 8862, 728, 428, 91, 29}},
    {"x = 'tab\there'  \t\t  \n  \n", {87, 284, 364, 6323, 197, 6881, 6, 36429, 31879}},
    {"   ", {262}},
    {"\n", {198}},
    {"a", {64}},
    {"", {}},
};

const Tokenizer& qwen() {
  static Tokenizer t = Tokenizer::from_dir(kvboost::test::shared_path("tokenizers/qwen2.5"));
  return t;
}
const Tokenizer& llama3() {
  static Tokenizer t = Tokenizer::from_dir(kvboost::test::shared_path("tokenizers/llama3"));
  return t;
}

std::string escaped(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '\n') r += "\\n";
    else if (c == '\t') r += "\\t";
    else if (c == '\r') r += "\\r";
    else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\x%02x", c); r += b; }
    else r += static_cast<char>(c);
  }
  return r;
}

// `nfc`: the tokenizer composes "e\u0301" to "\u00e9", so that text does not round-trip byte for byte.
void check_vectors(const Tokenizer& t, const std::vector<Vector>& vectors, bool nfc) {
  for (const auto& v : vectors) {
    EXPECT_EQ(t.encode(v.text, false), v.ids) << "text: \"" << escaped(v.text) << "\"";
    if (nfc && v.text.find("\u0301") != std::string::npos) continue;
    EXPECT_EQ(t.decode(v.ids), v.text) << "text: \"" << escaped(v.text) << "\"";
  }
}

}  // namespace

TEST(TokenizerQwen, HandCheckedVectors) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/qwen2.5/tokenizer.json"));
  check_vectors(qwen(), kQwenVectors, true);
}

TEST(TokenizerQwen, SpecialTokensAndIds) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/qwen2.5/tokenizer.json"));
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.vocab_size(), 151665);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.id_to_token(151645), "<|im_end|>");
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(9707));
  EXPECT_FALSE(t.bos_id().has_value());  // bos_token: null
  EXPECT_EQ(t.eos_id(), 151645);
  // No BOS for Qwen even with add_special.
  EXPECT_EQ(t.encode("Hello, world!", true), (std::vector<int32_t>{9707, 11, 1879, 0}));
  std::vector<int32_t> ids = t.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t.decode(ids, true), "user\nhi");
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>user\nhi<|im_end|>");
}

TEST(TokenizerQwen, NfcNormalizes) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/qwen2.5/tokenizer.json"));
  // "e" + U+0301 is composed to U+00E9 before BPE, so both spellings give the same ids.
  EXPECT_EQ(qwen().encode("caf\u00e9", false), qwen().encode("cafe\u0301", false));
  EXPECT_EQ(qwen().decode(qwen().encode("cafe\u0301", false)), "caf\u00e9");
}

TEST(TokenizerQwen, InvalidUtf8Throws) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/qwen2.5/tokenizer.json"));
  try {
    qwen().encode(std::string("abc\xff", 4));
    FAIL() << "no exception";
  } catch (const kvboost::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(qwen().encode(std::string("\xe4\xb8", 2)), kvboost::Error);    // truncated
  EXPECT_THROW(qwen().encode(std::string("\xed\xa0\x80", 3)), kvboost::Error);  // surrogate
  EXPECT_THROW(qwen().encode(std::string("\xc0\xaf", 2)), kvboost::Error);    // overlong
}

TEST(TokenizerQwen, DecodeInvalidBytesIsLossy) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/qwen2.5/tokenizer.json"));
  const Tokenizer& t = qwen();
  // "中" is e4 b8 ad; its byte tokens alone are incomplete sequences.
  auto e4 = t.token_to_id("\xc3\xa4");  // byte-level char for 0xE4
  ASSERT_TRUE(e4.has_value());
  EXPECT_EQ(t.decode({*e4}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({9707, *e4, 11}), "Hello\xEF\xBF\xBD,");
  EXPECT_EQ(t.decode({9707, 999999}), "Hello");  // unknown ids are dropped
}

TEST(TokenizerLlama3, HandCheckedVectors) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/llama3/tokenizer.json"));
  check_vectors(llama3(), kLlama3Vectors, false);
}

TEST(TokenizerLlama3, BosAndSpecials) {
  KVBOOST_REQUIRE_PATH(kvboost::test::shared_path("tokenizers/llama3/tokenizer.json"));
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  EXPECT_EQ(t.encode("Hello, world!"), (std::vector<int32_t>{128000, 9906, 11, 1917, 0}));
  EXPECT_EQ(t.encode(""), (std::vector<int32_t>{128000}));
  EXPECT_EQ(t.decode({128000, 9906, 11, 1917, 0}, true), "Hello, world!");
  EXPECT_EQ(t.decode({128000, 9906}, false), "<|begin_of_text|>Hello");
  // ignore_merges: a whole pre-token found in the vocab is emitted as is.
  EXPECT_EQ(t.encode(" Hello", false), (std::vector<int32_t>{22691}));
}

TEST(TokenizerStories, ReferencePromptIds) {
  const std::string dir = kvboost::test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir + "/reference_greedy.json");
  Tokenizer t = Tokenizer::from_dir(dir);
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  nlohmann::json ref = nlohmann::json::parse(kvboost::read_file(dir + "/reference_greedy.json"));
  const nlohmann::json& cases = ref.contains("cases") ? ref["cases"] : ref;
  ASSERT_GT(cases.size(), 0u);
  for (const auto& c : cases) {
    const std::string prompt = c.at("prompt").get<std::string>();
    std::vector<int32_t> prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(t.encode(prompt), prompt_ids) << prompt;
    std::vector<int32_t> all = prompt_ids;
    for (int32_t id : c.at("greedy_ids").get<std::vector<int32_t>>()) all.push_back(id);
    std::string text = t.decode(all, true);
    EXPECT_EQ(text.substr(0, prompt.size()), prompt);
    EXPECT_GT(text.size(), prompt.size() + 20);
  }
}

TEST(TokenizerStories, ByteFallbackRoundTrip) {
  const std::string dir = kvboost::test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  Tokenizer t = Tokenizer::from_dir(dir);
  for (std::string s : {"Once upon a time", "  two  spaces", "中文 😀 é", "tab\tnew\nline"}) {
    std::vector<int32_t> ids = t.encode(s, false);
    EXPECT_EQ(t.decode(ids), s) << s;
  }
  // "中" is not a piece: it goes through <0xE4><0xB8><0xAD>.
  std::vector<int32_t> ids = t.encode("中", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(t.id_to_token(ids[ids.size() - 3]), "<0xE4>");
  EXPECT_EQ(t.id_to_token(ids.back()), "<0xAD>");
}
