// The architecture registry (src/model/arch/): every descriptor's tensor table is well formed,
// the config and GGUF lookups go through it, and a fixture of each architecture binds exactly
// the tensors its table names (counted by Model::weight_bytes). A new architecture adds its
// case here (docs/architecture.md "Adding an architecture").
#include <cmath>
#include <filesystem>
#include <set>

#include "arch.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;

TEST(ArchRegistry, SupportedModelTypesAreTheRegistry) {
  std::vector<std::string> want;
  for (const arch::Arch* a : arch::all()) want.push_back(a->model_type);
  EXPECT_EQ(supported_model_types(), want);
  EXPECT_EQ(want, (std::vector<std::string>{"llama", "mistral", "qwen2", "qwen3", "gemma3"}));
  EXPECT_EQ(arch::find("gemma3_text"), &arch::kGemma3);
  EXPECT_EQ(arch::find("gpt2"), nullptr);
}

TEST(ArchRegistry, TablesAreWellFormed) {
  using arch::Role;
  for (const arch::Arch* a : arch::all()) {
    SCOPED_TRACE(a->model_type);
    EXPECT_NE(a->configure, nullptr);
    EXPECT_NE(a->layer, nullptr);
    std::set<Role> roles;
    std::set<std::string> hf, gguf;
    for (const arch::LayerTensor& t : a->tensors) {
      EXPECT_TRUE(roles.insert(t.role).second) << t.hf << ": role listed twice";
      EXPECT_TRUE(hf.insert(t.hf).second) << t.hf;
      EXPECT_TRUE(gguf.insert(t.gguf).second) << t.gguf;
    }
    for (Role r : {Role::AttnNorm, Role::MlpNorm, Role::Wq, Role::Wk, Role::Wv, Role::Wo, Role::Gate, Role::Up,
                   Role::Down})
      EXPECT_TRUE(roles.count(r)) << "role " << int(r) << " missing";
    // Sandwich norms come in pairs; q/k norm too; a bias table entry is conditional.
    EXPECT_EQ(roles.count(Role::PostAttnNorm), roles.count(Role::PostMlpNorm));
    EXPECT_EQ(roles.count(Role::QNorm), roles.count(Role::KNorm));
    for (const arch::LayerTensor& t : a->tensors)
      if (t.role == Role::QBias || t.role == Role::KBias || t.role == Role::VBias || t.role == Role::OBias)
        EXPECT_EQ(t.when, arch::When::AttentionBias) << t.hf;
  }
  EXPECT_EQ(arch::tensor(arch::kQwen2, arch::Role::OBias), nullptr);  // Qwen2 has no o_proj bias
  EXPECT_NE(arch::tensor(arch::kQwen3, arch::Role::QNorm), nullptr);
  EXPECT_STREQ(arch::tensor(arch::kGemma3, arch::Role::MlpNorm)->hf, "pre_feedforward_layernorm.weight");
}

TEST(ArchRegistry, GgufArchitectures) {
  EXPECT_EQ(&arch::find_gguf("qwen2", "x.gguf"), &arch::kQwen2);
  EXPECT_TRUE(arch::kLlama.gguf_permuted_qk);
  EXPECT_FALSE(arch::kQwen3.gguf_permuted_qk);
  try {
    arch::find_gguf("mistral", "x.gguf");  // llama.cpp writes Mistral as llama
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "x.gguf: general.architecture \"mistral\" is not supported (supported: llama, qwen2, qwen3, gemma3)");
  }
}

namespace {
// The bytes Model::weight_bytes must report for an f32 fixture that binds exactly the tensors
// of the architecture's table (conditional ones per config.attention_bias).
size_t table_bytes(const arch::Arch& a, const ModelConfig& c) {
  using arch::Role;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  int64_t n = c.vocab_size * H * (c.tie_word_embeddings ? 1 : 2) + H;  // embeddings (+ head), final norm
  for (const arch::LayerTensor& t : a.tensors) {
    if (t.when == arch::When::AttentionBias && !c.attention_bias) continue;
    switch (t.role) {
      case Role::AttnNorm: case Role::PostAttnNorm: case Role::MlpNorm: case Role::PostMlpNorm: n += H * c.n_layers; break;
      case Role::QNorm: case Role::KNorm: n += hd * c.n_layers; break;
      case Role::Wq: case Role::Wo: n += nq * H * c.n_layers; break;
      case Role::Wk: case Role::Wv: n += nkv * H * c.n_layers; break;
      case Role::QBias: n += nq * c.n_layers; break;
      case Role::KBias: case Role::VBias: n += nkv * c.n_layers; break;
      case Role::OBias: n += H * c.n_layers; break;
      case Role::Gate: case Role::Up: case Role::Down: n += I * H * c.n_layers; break;
    }
  }
  return size_t(n) * sizeof(float);
}
}  // namespace

class ArchFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchFixture, BindsItsTableAndRuns) {
  const std::string dir = test::make_temp_dir("arch_" + GetParam());
  FixtureSpec s;
  s.arch = GetParam();
  s.tokenizer_kind = "";
  s.vocab = 96;
  s.sliding_window = GetParam() == "mistral" ? 4 : 0;
  write_fixture_model(dir, s);
  LoadOptions o;
  o.pack_weights = false;
  auto m = Model::load(dir, o);
  const ModelConfig& c = m->config();
  const arch::Arch* a = arch::find(c.model_type);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(m->weight_bytes(), table_bytes(*a, c));
  if (GetParam() == "mistral") EXPECT_EQ(c.layer_window, std::vector<int64_t>(size_t(c.n_layers), 4));
  if (GetParam() == "qwen2") EXPECT_TRUE(c.attention_bias);
  if (GetParam() == "qwen3") EXPECT_TRUE(c.qk_norm);
  // The layer function runs: prefill == token-by-token decode, bit for bit.
  const std::vector<int32_t> ids = {1, 5, 9, 17, 33, 2, 64, 7};
  KvCache kv1(c, 16), kv2(c, 16);
  std::vector<float> a1(ids.size() * size_t(c.vocab_size)), a2(size_t(c.vocab_size));
  m->forward(ids.data(), int64_t(ids.size()), kv1, a1.data(), /*all_logits=*/true);
  for (size_t i = 0; i < ids.size(); ++i) m->forward(&ids[i], 1, kv2, a2.data());
  const float* last = &a1[(ids.size() - 1) * size_t(c.vocab_size)];
  for (int64_t v = 0; v < c.vocab_size; ++v) {
    ASSERT_TRUE(std::isfinite(last[v]));
    EXPECT_NEAR(last[v], a2[size_t(v)], 1e-4f) << v;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchFixture, ::testing::Values("llama", "mistral", "qwen2", "qwen3"));
