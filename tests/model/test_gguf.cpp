// GGUF: the reader on files written here (every metadata type, alignment, truncation at every
// length, bit flips, malformed fields), and — on files written by the gguf Python package
// (tools/oracle/gguf_fixture.py, run by the ctest fixture gguf_fixture.generate) — the
// dequantization kernels against the package's dequantizer and whole models against the
// safetensors loader on the same weights.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gguf.h"
#include "gguf_builder.h"
#include "../kernels/kernel_test_util.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "test_util.h"

using namespace kvboost;
using kernels::GgmlType;

namespace {

using test::Builder;
using test::write;

std::vector<uint8_t> sample_file() {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.kv_i8("test.i8", -5);
  b.kv_u64("test.u64", 1ull << 40);
  b.kv_i64("test.i64", -7);
  b.kv_f32("test.f32", 0.25f);
  b.kv_f64("test.f64", -1.5);
  b.kv_bool("test.bool", true);
  b.kv_strs("tokenizer.ggml.tokens", {"a", "", "héllo"});
  b.kv_i32s("tokenizer.ggml.token_type", {1, 2, 3});
  std::vector<float> f(64);
  for (int i = 0; i < 64; ++i) f[size_t(i)] = float(i);
  b.tensor("w", GgmlType::F32, {16, 4}, f.data(), f.size() * 4);
  std::vector<uint8_t> q(34 * 2, 0);
  b.tensor("q", GgmlType::Q8_0, {64}, q.data(), q.size());
  return b.finish();
}

std::string fixture_dir() {
  const char* e = std::getenv("KVBOOST_GGUF_FIXTURE_DIR");
  return e && *e ? e : kvboost::test::binary_dir() + "/tests/oracle/gguf_fixtures";
}

}  // namespace

TEST(GgufReader, ParsesEveryMetadataTypeAndTensors) {
  const std::string p = write(test::make_temp_dir("gguf_reader"), "a.gguf", sample_file());
  gguf::File f(p);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get_int("test.i8"), -5);
  EXPECT_EQ(f.get_int("test.u64"), int64_t(1) << 40);
  EXPECT_EQ(f.get_int("test.i64"), -7);
  EXPECT_EQ(f.get_float("test.f32", 0), 0.25);
  EXPECT_EQ(f.get_float("test.f64", 0), -1.5);
  EXPECT_EQ(f.find("test.bool")->i, 1);
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->strings, (std::vector<std::string>{"a", "", "héllo"}));
  EXPECT_EQ(f.find("tokenizer.ggml.token_type")->ints, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.get_int("missing", 9), 9);
  EXPECT_THROW(f.get_int("general.architecture"), Error);
  EXPECT_THROW(f.get_string("missing"), Error);
  ASSERT_EQ(f.tensors().size(), 2u);
  const gguf::Tensor* w = f.tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->ne, (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(w->rows(), 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 32, 0u);
  EXPECT_EQ(reinterpret_cast<const float*>(w->data)[17], 17.0f);
  EXPECT_EQ(f.tensor("q")->nbytes, 68u);
}

TEST(GgufReader, CustomAlignmentAndVersion2) {
  Builder b(2);
  b.kv_u32("general.alignment", 64);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  b.tensor("a", GgmlType::F32, {8}, x, 32);
  b.tensor("b", GgmlType::F32, {8}, x, 32);
  const std::string p = write(test::make_temp_dir("gguf_align"), "a.gguf", b.finish(64));
  gguf::File f(p);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.tensor("b")->offset, 64u);
  EXPECT_EQ(reinterpret_cast<const float*>(f.tensor("b")->data)[7], 8.0f);
}

TEST(GgufReader, EveryTruncationIsAnErrorNamingTheFile) {
  const auto bytes = sample_file();
  const std::string dir = test::make_temp_dir("gguf_trunc");
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string p = write(dir, "t.gguf", std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(n)));
    try {
      gguf::File f(p);
      ADD_FAILURE() << "truncated to " << n << " bytes but parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("t.gguf"), std::string::npos) << e.what();
    }
  }
}

TEST(GgufReader, BitFlipsNeverCrash) {
  const auto bytes = sample_file();
  const std::string dir = test::make_temp_dir("gguf_flip");
  std::mt19937 rng(3);
  int errors = 0;
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    for (uint8_t mask : {uint8_t(0x80), uint8_t(rng() | 1)}) {
      auto c = bytes;
      c[pos] ^= mask;
      const std::string p = write(dir, "f.gguf", c);
      try {
        gguf::File f(p);
        for (const auto& t : f.tensors()) ASSERT_LE(t.data + t.nbytes, f.mapping()->data() + f.mapping()->size());
      } catch (const Error&) {
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(GgufReader, MalformedFieldsNameTheCulprit) {
  const std::string dir = test::make_temp_dir("gguf_bad");
  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& needle) {
    const std::string p = write(dir, "bad.gguf", bytes);
    try {
      gguf::File f(p);
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto good = sample_file();
  auto c = good;
  c[0] = 'X';
  expect_error(c, "bad magic");
  c = good;
  c[4] = 1;
  expect_error(c, "version 1");
  c = good;
  c[4] = 0, c[7] = 3;  // version 3 big-endian
  expect_error(c, "big-endian");
  Builder b;
  b.kv_u32("general.alignment", 24);
  expect_error(b.finish(), "general.alignment");
  Builder b2;
  float x[4] = {};
  b2.tensor("odd", GgmlType::Q8_0, {48}, x, 16);  // 48 is not a whole Q8_0 block
  expect_error(b2.finish(), "odd");
  Builder b3;
  b3.tensor("unknown", GgmlType(99), {4}, x, 16);
  expect_error(b3.finish(), "unknown ggml type 99");
  Builder b4;
  b4.tensor("big", GgmlType::F32, {4}, x, 16);
  auto f4 = b4.finish();
  f4.erase(f4.end() - 8, f4.end());
  expect_error(f4, "\"big\"");
  Builder b5;
  b5.kv_u32("k", 1);
  b5.kv_u32("k", 2);
  expect_error(b5.finish(), "appears twice");
}

TEST(GgufModel, PathResolution) {
  const std::string dir = test::make_temp_dir("gguf_paths");
  EXPECT_EQ(gguf_model_file(dir), "");
  write(dir, "one.gguf", sample_file());
  EXPECT_EQ(gguf_model_file(dir), path_join(dir, "one.gguf"));
  EXPECT_EQ(gguf_model_file(path_join(dir, "one.gguf")), path_join(dir, "one.gguf"));
  write(dir, "two.gguf", sample_file());
  EXPECT_THROW(gguf_model_file(dir), Error);
  // A Hugging Face directory stays a Hugging Face directory.
  write(dir, "config.json", {'{', '}'});
  EXPECT_EQ(gguf_model_file(dir), "");
}

TEST(GgufModel, UnsupportedArchitectureIsAnError) {
  Builder b;
  b.kv_str("general.architecture", "gemma3");
  const std::string p = write(test::make_temp_dir("gguf_arch"), "g.gguf", b.finish());
  try {
    ModelConfig::from_gguf(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemma3"), std::string::npos) << e.what();
  }
}

// End-of-generation ids as llama.cpp decides them: eos, tokenizer.ggml.eot_token_id /
// eom_token_id, and tokens whose text ends a turn (Gemma's <end_of_turn>, which Gemma 3 GGUF
// files do not name in any key: without it a chat reply never stops).
TEST(GgufModel, EndOfTurnTokensJoinEos) {
  auto file = [](const std::vector<std::string>& tokens, int64_t eot) {
    Builder b;
    b.kv_str("general.architecture", "gemma3");
    b.kv_u32("gemma3.embedding_length", 8);
    b.kv_u32("gemma3.feed_forward_length", 16);
    b.kv_u32("gemma3.block_count", 1);
    b.kv_u32("gemma3.attention.head_count", 2);
    b.kv_u32("tokenizer.ggml.eos_token_id", 1);
    if (eot >= 0) b.kv_u32("tokenizer.ggml.eot_token_id", uint32_t(eot));
    b.kv_strs("tokenizer.ggml.tokens", tokens);
    std::vector<float> emb(8 * tokens.size(), 0.0f);
    b.tensor("token_embd.weight", GgmlType::F32, {8, int64_t(tokens.size())}, emb.data(), emb.size() * 4);
    return b.finish();
  };
  const std::string dir = test::make_temp_dir("gguf_eog");
  const std::vector<std::string> gemma = {"<pad>", "<eos>", "<bos>", "a", "<start_of_turn>", "<end_of_turn>", "b"};
  EXPECT_EQ(ModelConfig::from_gguf(write(dir, "g.gguf", file(gemma, -1))).eos_token_ids, (std::vector<int32_t>{1, 5}));
  // An explicit eot key (listed once even when its text is also recognised), and ChatML's end.
  EXPECT_EQ(ModelConfig::from_gguf(write(dir, "e.gguf", file(gemma, 3))).eos_token_ids, (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(ModelConfig::from_gguf(write(dir, "c.gguf", file({"x", "<|endoftext|>", "<|im_end|>"}, 2))).eos_token_ids,
            (std::vector<int32_t>{1, 2}));
  // No turn-end token: eos alone.
  EXPECT_EQ(ModelConfig::from_gguf(write(dir, "n.gguf", file({"x", "y", "z"}, -1))).eos_token_ids, (std::vector<int32_t>{1}));
}

// ---- against files written by the gguf Python package ----

namespace {
nlohmann::json manifest() {
  const std::string m = fixture_dir() + "/manifest.json";
  if (!file_exists(m)) return nullptr;
  return nlohmann::json::parse(read_file(m));
}

#define REQUIRE_MANIFEST(j)                                                                    \
  auto j = manifest();                                                                         \
  if (j.is_null()) {                                                                           \
    if (test::oracles_required()) FAIL() << "missing " << fixture_dir() << "/manifest.json";   \
    GTEST_SKIP() << "no GGUF fixtures in " << fixture_dir()                                    \
                 << " (ctest runs tools/oracle/gguf_fixture.py; needs python gguf + numpy)";   \
  }

std::vector<float> logits(const Model& m, const std::vector<int32_t>& ids) {
  KvCache kv(m.config(), int64_t(ids.size()));
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, out.data(), /*all_logits=*/true);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}
}  // namespace

TEST(GgufOracle, DequantMatchesPythonPackageBitForBit) {
  REQUIRE_MANIFEST(j);
  gguf::File f(j["dequant"].get<std::string>());
  const Isa saved = active_isa();
  int checked = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.size() > 4 && t.name.compare(t.name.size() - 4, 4, ".ref") == 0) continue;
    const gguf::Tensor* ref = f.tensor(t.name + ".ref");
    ASSERT_NE(ref, nullptr) << t.name;
    ASSERT_EQ(ref->n_elems(), t.n_elems());
    for (Isa isa : {Isa::Scalar, Isa::Avx2}) {
      set_active_isa(isa);
      std::vector<float> y(size_t(t.n_elems()));
      for (int64_t r = 0; r < t.rows(); ++r)
        kernels::dequantize_row(t.data + size_t(r * kernels::ggml_row_bytes(t.type, t.ne[0])), t.type,
                                y.data() + r * t.ne[0], t.ne[0]);
      EXPECT_EQ(0, std::memcmp(y.data(), ref->data, y.size() * 4)) << t.name << " on " << isa_name(active_isa());
    }
    ++checked;
  }
  set_active_isa(saved);
  EXPECT_EQ(checked, 8);
}

TEST(GgufOracle, SameLogitsAsSafetensorsOnTheSameWeights) {
  REQUIRE_MANIFEST(j);
  // The f32-activation paths: with AVX512-BF16 the default packs bf16 weights for kernels that
  // round activations to bf16 (kernels.h PackLayout::Bf16Pairs; test_pack_weights checks them).
  kernel_test::IsaGuard isa;  // restores the ISA
  if (active_isa() > Isa::Avx512) set_active_isa(Isa::Avx512);
  const std::vector<int32_t> ids = {1, 17, 300, 4, 99, 250, 3, 511, 42, 8, 128, 77};
  for (const auto& c : j["cases"]) {
    const std::string name = c["name"], type = c["type"];
    SCOPED_TRACE(name);
    auto g = Model::load(c["gguf"].get<std::string>());
    auto src = Model::load(c["src"].get<std::string>());
    auto ref = Model::load(c["ref"].get<std::string>());
    // Hyper-parameters survive the trip through GGUF metadata.
    const ModelConfig &a = g->config(), &b = src->config();
    EXPECT_EQ(a.model_type, b.model_type);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.attention_bias, b.attention_bias);
    EXPECT_EQ(a.qk_norm, b.qk_norm);
    EXPECT_FLOAT_EQ(float(a.rms_norm_eps), float(b.rms_norm_eps));
    const auto lg = logits(*g, ids), ls = logits(*src, ids), lr = logits(*ref, ids);
    double scale = 0;
    for (float v : ls) scale = std::max(scale, double(std::fabs(v)));
    // The reference model holds exactly the weights the GGUF file stores (dequantized by the
    // gguf package). Float types: only summation order could differ. Quantized types run
    // integer matmuls on 8-bit activations (kernels.h matmul), so they differ by that rounding.
    const bool quantized = type != "f32" && type != "f16" && type != "bf16";
    if (!quantized) {
      EXPECT_LE(max_abs_diff(lg, lr), 1e-4 * std::max(1.0, scale)) << type;
    } else {
      // Each matmul rounds its activations to 8 bits per block of 32: an error of at most
      // d/2 = max|x|/254 per element, i.e. at most 1/254 of the block's |x|.|w| per dot. Two
      // layers of 7 matmuls plus the lm_head chain 15 of them, so even if every error added up
      // in one direction the logits move by at most 15/254 (~6%) of their scale. Measured: 1-3%,
      // cosine >= 0.9997.
      const double bound = 15.0 / 254.0 * std::max(1.0, scale);
      EXPECT_LE(max_abs_diff(lg, lr), bound) << type;
      EXPECT_GT(cosine(lg, lr), 0.999) << type;
      // The greedy choice is the same wherever the reference's top-1 leads the runner-up by
      // more than twice that bound (only a near tie can flip).
      const int64_t V = g->config().vocab_size;
      for (size_t t = 0; t < ids.size(); ++t) {
        const float* a = lg.data() + t * V;
        const float* b = lr.data() + t * V;
        const int64_t top = kernels::argmax(b, V);
        float second = -INFINITY;
        for (int64_t i = 0; i < V; ++i)
          if (i != top) second = std::max(second, b[i]);
        if (b[top] - second > 2 * bound) EXPECT_EQ(kernels::argmax(a, V), top) << type << " position " << t;
      }
      std::printf("  %-14s cos(gguf, ref) %.7f  max|gguf-ref| %.3e (bound %.3e)\n", name.c_str(), cosine(lg, lr),
                  max_abs_diff(lg, lr), bound);
      // The blocks stay quantized in memory: no bigger than the file (tensors + f32 norms),
      // about half of f32 or less (rows that are not whole blocks fall back to F16).
      const size_t file = MappedFile(c["gguf"].get<std::string>()).size();
      EXPECT_LE(g->weight_bytes(), file) << type;
      EXPECT_LT(double(g->weight_bytes()), 0.55 * double(ref->weight_bytes())) << type;
      EXPECT_LE(g->decode_weight_bytes(), g->weight_bytes()) << type;
    }
    if (type == "f32") {
      EXPECT_LE(max_abs_diff(lg, ls), 1e-4 * std::max(1.0, scale));
    }
    if (type == "f16" || type == "bf16" || type == "q8_0") {
      EXPECT_GT(cosine(lg, ls), 0.999) << type;
    } else {
      EXPECT_GT(cosine(lg, ls), 0.9) << type;  // 4/5/6-bit: close, not equal
    }
    std::printf("  %-14s max|gguf-ref| %.2e  cos(gguf, original) %.6f  (max |logit| %.3f)\n", name.c_str(),
                max_abs_diff(lg, lr), cosine(lg, ls), scale);
  }
}
