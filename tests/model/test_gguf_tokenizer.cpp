// The tokenizer stored in a GGUF (tokenizer.ggml.*): hand-made files for the semantics and the
// errors, and — on GGUFs that tools/oracle/gguf_fixture.py writes from real tokenizer.json files
// the way llama.cpp's converter does (ctest fixture gguf_fixture.tokenizers) — the same ids and
// text as the tokenizer.json the GGUF was made from.
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gguf_builder.h"
#include "kvboost/model.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using namespace kvboost;

namespace {

using test::Builder;

Tokenizer load(const std::string& gguf) {
  const GgufTokenizerFiles t = gguf_tokenizer_files(gguf);
  return Tokenizer::from_json(t.tokenizer_json, t.tokenizer_config_json, gguf);
}

std::string error_of(const std::string& gguf) {
  try {
    load(gguf);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string write_tmp(const std::string& name, Builder& b) {
  static const std::string dir = test::make_temp_dir("gguf_tokenizer");
  return test::write(dir, name, b.finish());
}

const std::string kSp = "\xe2\x96\x81";  // U+2581

// A SentencePiece vocabulary: <unk> <s> </s>, two byte tokens, pieces with the given scores.
Builder spm_file(const std::vector<std::pair<std::string, float>>& pieces) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>"};
  std::vector<float> scores = {0, 0, 0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3, 6, 6};
  for (const auto& [p, s] : pieces) tokens.push_back(p), scores.push_back(s), types.push_back(1);
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv_str("tokenizer.ggml.model", "llama");
  b.kv_strs("tokenizer.ggml.tokens", tokens);
  b.kv_f32s("tokenizer.ggml.scores", scores);
  b.kv_i32s("tokenizer.ggml.token_type", types);
  return b;
}

}  // namespace

TEST(GgufTokenizer, SentencePieceMergesFollowTheScores) {
  // "abc" with pieces ab and bc: llama.cpp merges the higher-scoring pair first.
  std::vector<std::pair<std::string, float>> pieces = {{kSp, -1}, {"a", -2}, {"b", -3}, {"c", -4},
                                                       {"ab", -5}, {"bc", -6}, {kSp + "a", -7}};
  Builder b1 = spm_file(pieces);
  const Tokenizer t1 = load(write_tmp("ab_first.gguf", b1));
  // ids: <unk> 0, <s> 1, </s> 2, <0xC3> 3, <0xA9> 4, ▁ 5, a 6, b 7, c 8, ab 9, bc 10, ▁a 11
  EXPECT_EQ(t1.encode("bc abc"), (std::vector<int32_t>{1, 5, 10, 5, 9, 8}));
  pieces[4].second = -9;  // now bc outranks ab, and ▁a outranks ab
  Builder b2 = spm_file(pieces);
  const Tokenizer t2 = load(write_tmp("bc_first.gguf", b2));
  EXPECT_EQ(t2.encode("bc abc"), (std::vector<int32_t>{1, 5, 10, 11, 10}));
  // byte fallback for a character outside the vocabulary; BOS by default; no space prefix kept
  EXPECT_EQ(t2.encode("\xc3\xa9", false), (std::vector<int32_t>{5, 3, 4}));
  EXPECT_EQ(t2.decode({1, 5, 10, 11, 10}, true), "bc abc");
  EXPECT_EQ(t2.decode({5, 3, 4, 2}), "\xc3\xa9</s>");
  EXPECT_EQ(t2.bos_id(), 1);
  EXPECT_EQ(t2.eos_id(), 2);
  EXPECT_EQ(t2.encode("a</s>b", false), (std::vector<int32_t>{11, 2, 5, 7}));  // control tokens matched in text
}

TEST(GgufTokenizer, SentencePieceFlags) {
  Builder b = spm_file({{kSp, -1}, {"a", -2}});
  b.kv_bool("tokenizer.ggml.add_space_prefix", false);
  b.kv_bool("tokenizer.ggml.add_bos_token", false);
  b.kv_bool("tokenizer.ggml.add_eos_token", true);
  b.kv_u32("tokenizer.ggml.eos_token_id", 1);
  b.kv_str("tokenizer.chat_template", "{{ messages }}");
  const std::string p = write_tmp("flags.gguf", b);
  const Tokenizer t = load(p);
  EXPECT_EQ(t.encode("a a"), (std::vector<int32_t>{6, 5, 6, 1}));
  EXPECT_EQ(t.decode({5, 6}), " a");
  EXPECT_EQ(nlohmann::json::parse(gguf_tokenizer_files(p).tokenizer_config_json)["chat_template"], "{{ messages }}");
}

TEST(GgufTokenizer, ByteLevelWithMergesAndUnusedPadding) {
  Builder b;
  b.kv_str("tokenizer.ggml.model", "gpt2");
  b.kv_str("tokenizer.ggml.pre", "qwen2");
  // a b ab Ġ Ġab <|end|> [PAD6]
  b.kv_strs("tokenizer.ggml.tokens", {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab", "<|end|>", "[PAD6]"});
  b.kv_i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3, 5});
  b.kv_strs("tokenizer.ggml.merges", {"a b", "\xc4\xa0 ab"});
  b.kv_u32("tokenizer.ggml.eos_token_id", 5);
  const Tokenizer t = load(write_tmp("bytelevel.gguf", b));
  EXPECT_EQ(t.encode("ab ab<|end|>"), (std::vector<int32_t>{2, 4, 5}));  // no BOS for gpt2 by default
  EXPECT_EQ(t.decode({2, 4, 5, 6}), "ab ab<|end|>");                   // unused ids decode to nothing
  EXPECT_EQ(t.decode({2, 5}, true), "ab");
  EXPECT_EQ(t.vocab_size(), 6);
  EXPECT_EQ(t.eos_id(), 5);
  EXPECT_FALSE(t.token_to_id("[PAD6]"));
}

TEST(GgufTokenizer, BadMetadataNamesTheKey) {
  const auto err_has = [](Builder b, const std::string& name, std::vector<std::string> want) {
    const std::string e = error_of(write_tmp(name, b));
    for (const auto& w : want) EXPECT_NE(e.find(w), std::string::npos) << name << ": " << e;
  };
  {
    Builder b;
    b.kv_str("general.architecture", "llama");
    err_has(b, "none.gguf", {"none.gguf", "tokenizer.ggml.model", "missing"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "bert");
    b.kv_strs("tokenizer.ggml.tokens", {"a"});
    err_has(b, "bert.gguf", {"tokenizer.ggml.model", "\"bert\""});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    err_has(b, "notokens.gguf", {"tokenizer.ggml.tokens", "missing"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_u32("tokenizer.ggml.tokens", 3);
    err_has(b, "tokens_u32.gguf", {"tokenizer.ggml.tokens", "u32", "array of strings"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_strs("tokenizer.ggml.tokens", {"a", "b"});
    err_has(b, "nomerges.gguf", {"tokenizer.ggml.merges", "missing"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_str("tokenizer.ggml.pre", "falcon");
    b.kv_strs("tokenizer.ggml.tokens", {"a", "b"});
    b.kv_strs("tokenizer.ggml.merges", {});
    err_has(b, "pre.gguf", {"tokenizer.ggml.pre", "\"falcon\"", "qwen2"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_strs("tokenizer.ggml.tokens", {"a", "b"});
    b.kv_i32s("tokenizer.ggml.token_type", {1});
    b.kv_strs("tokenizer.ggml.merges", {});
    err_has(b, "types.gguf", {"tokenizer.ggml.token_type", "1 entries", "has 2"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_strs("tokenizer.ggml.tokens", {"a", "b", "a"});
    b.kv_strs("tokenizer.ggml.merges", {});
    err_has(b, "dup.gguf", {"tokenizer.ggml.tokens", "\"a\" twice", "ids 0 and 2"});
  }
  {
    Builder b;
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_strs("tokenizer.ggml.tokens", {"a", "b"});
    b.kv_strs("tokenizer.ggml.merges", {"a c"});
    err_has(b, "merge.gguf", {"merges[0]", "'c' is not in the vocab"});
  }
  {
    Builder b = spm_file({{"a", -1}});
    b.kv_u32("tokenizer.ggml.bos_token_id", 99);
    err_has(b, "bos.gguf", {"tokenizer.ggml.bos_token_id", "99", "outside the vocabulary"});
  }
}

// ---- against the tokenizer.json each GGUF was made from ----

namespace {

nlohmann::json tokenizer_manifest() {
  const char* d = std::getenv("KVBOOST_GGUF_TOKENIZER_DIR");
  const std::string path = std::string(d ? d : "") + "/manifest.json";
  if (!d || !test::path_exists(path)) return nullptr;
  return nlohmann::json::parse(read_file(path));
}

std::vector<std::string> texts(const std::string& special) {
  std::vector<std::string> t = {
      "",
      "Hello world",
      " leading space and trailing space ",
      "  multiple   spaces\tand\ttabs\n\nnew lines\r\n",
      "The year 2024 had 366 days; 3.14159 and 1,000,000 and 12345678901234567890.",
      "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n    print(f(3))\n",
      "std::vector<int> v{1, 2, 3}; for (auto& x : v) x <<= 2;",
      "Caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88",
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xce\xb3\xce\xb5\xce\xb9\xce\xac",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x87\xab\xf0\x9f\x87\xb7 and ZWJ \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
      "I'm can't we'll they've SHE'S It'D",
      "!!!???... ---=== *** ~~~ ``` <div class=\"x\">&amp;</div>",
      special + "text around" + special + " a special token " + special,
      "once upon a time there was a little girl named Lily. She liked to play.",
      "\xe2\x96\x81" "already\xe2\x96\x81" "escaped \xe2\x80\x83" "em space\xc2\xa0nbsp",
  };
  // random strings over a mixed character pool, seeded
  const std::vector<std::string> pool = {"a", "b", "e", "t", "h", " ", "  ", "\n", "\t", "0", "7", "'", "s", ".", ",",
                                         "\xc3\xa9", "\xe4\xb8\x96", "\xf0\x9f\x98\x80", "<", ">", "|", "_", "A", "Z"};
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int len = int(rng() % 40);
    for (int k = 0; k < len; ++k) s += pool[rng() % pool.size()];
    t.push_back(s);
  }
  return t;
}

void compare(const std::string& name, const std::string& special) {
  const nlohmann::json m = tokenizer_manifest();
  if (m.is_null()) {
    if (test::oracles_required()) FAIL() << "KVBOOST_GGUF_TOKENIZER_DIR/manifest.json is missing";
    GTEST_SKIP() << "no GGUF tokenizer fixtures (run through ctest: gguf_fixture.tokenizers)";
  }
  if (!m.contains(name)) {
    if (test::oracles_required()) FAIL() << name << " is not in the manifest";
    GTEST_SKIP() << name << " is not in the manifest (its tokenizer.json was not available)";
  }
  const Tokenizer ref = Tokenizer::from_dir(m[name]["src"].get<std::string>());
  const Tokenizer tok = load(m[name]["gguf"].get<std::string>());
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());
  EXPECT_EQ(tok.bos_id(), ref.bos_id());
  EXPECT_EQ(tok.eos_id(), ref.eos_id());
  for (const std::string& s : texts(special)) {
    for (bool add : {true, false}) {
      const std::vector<int32_t> ids = ref.encode(s, add);
      ASSERT_EQ(tok.encode(s, add), ids) << name << ": \"" << s << "\" add_special=" << add;
      EXPECT_EQ(tok.decode(ids), ref.decode(ids)) << name << ": \"" << s << "\"";
      EXPECT_EQ(tok.decode(ids, true), ref.decode(ids, true)) << name << ": \"" << s << "\"";
    }
  }
  // every id decodes the same, alone and in runs (byte-level pieces joining into characters)
  for (int32_t id = 0; id < ref.vocab_size(); ++id) {
    ASSERT_EQ(tok.id_to_token(id), ref.id_to_token(id)) << name << ": id " << id;
    if (id % 3 == 0 && id + 3 <= ref.vocab_size()) {
      const std::vector<int32_t> run = {id, id + 1, id + 2};
      ASSERT_EQ(tok.decode(run), ref.decode(run)) << name << ": ids " << id << "..";
    }
  }
}

}  // namespace

TEST(GgufTokenizerOracle, Qwen25) { compare("qwen25", "<|im_start|>"); }
TEST(GgufTokenizerOracle, Llama3) { compare("llama3", "<|begin_of_text|>"); }
TEST(GgufTokenizerOracle, Stories260K) { compare("stories260K", "</s>"); }
TEST(GgufTokenizerOracle, FixtureByteLevel) { compare("fixture_bytelevel", "<|im_end|>"); }
TEST(GgufTokenizerOracle, FixtureSentencePiece) { compare("fixture_sentencepiece", "<s>"); }
