// Bad model directories give an Error naming the file, tensor or field — never a crash.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
namespace fs = std::filesystem;

namespace {

std::string make_model(const std::string& name) {
  const std::string dir = test::make_temp_dir("loader_" + name);
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  s.vocab = 256;
  write_fixture_model(dir, s);
  return dir;
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string bytes(const std::string& path) { return read_file(path); }
void write(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

}  // namespace

TEST(LoaderErrors, MissingDirectoryAndFiles) {
  EXPECT_NE(load_error("/nonexistent/model").find("/nonexistent/model/config.json"), std::string::npos);
  std::string dir = make_model("nofile");
  fs::remove(dir + "/model.safetensors");
  EXPECT_NE(load_error(dir).find("no model.safetensors"), std::string::npos);
}

TEST(LoaderErrors, TruncatedAndCorruptSafetensors) {
  std::string dir = make_model("trunc");
  const std::string p = dir + "/model.safetensors";
  const std::string good = bytes(p);
  write(p, good.substr(0, good.size() / 2));
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  write(p, good.substr(0, 5));
  EXPECT_NE(load_error(dir).find("no header"), std::string::npos);

  std::string bad = good;
  bad[0] = char(0xff), bad[1] = char(0xff), bad[5] = 0x7f;  // absurd header length
  write(p, bad);
  EXPECT_NE(load_error(dir).find("exceeds file size"), std::string::npos);

  bad = good;
  bad[8] = 'x';  // JSON broken
  write(p, bad);
  EXPECT_NE(load_error(dir).find("corrupt safetensors header"), std::string::npos);
}

TEST(LoaderErrors, WrongShapeAndDtype) {
  std::string dir = make_model("shape");
  const std::string p = dir + "/model.safetensors";
  std::string data = bytes(p);
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= uint64_t(uint8_t(data[i])) << (8 * i);
  auto header = nlohmann::ordered_json::parse(data.substr(8, hl));
  const std::string rest = data.substr(8 + hl);
  auto rewrite = [&](const nlohmann::ordered_json& h) {
    std::string hs = h.dump();
    while (hs.size() < hl) hs.push_back(' ');
    ASSERT_EQ(hs.size(), hl);
    write(p, data.substr(0, 8) + hs + rest);
  };
  // swap the shape of q_proj to [H, 2H]: byte count still right for a different shape
  auto h = header;
  auto& q = h["model.layers.0.self_attn.q_proj.weight"];
  q["shape"] = {32, 128};
  rewrite(h);
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[32, 128]"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [64, 64]"), std::string::npos) << e;
  // dtype the engine does not run
  h = header;
  h["model.norm.weight"]["dtype"] = "I32";
  rewrite(h);
  e = load_error(dir);
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("I32"), std::string::npos) << e;
  // offsets past the end of the file
  h = header;
  h["model.norm.weight"]["data_offsets"] = {0, 1u << 30};
  rewrite(h);
  EXPECT_NE(load_error(dir).find("data_offsets"), std::string::npos);
  // a missing tensor
  h = header;
  h.erase("model.layers.1.mlp.down_proj.weight");
  rewrite(h);
  e = load_error(dir);
  EXPECT_NE(e.find("model.layers.1.mlp.down_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST(LoaderErrors, ConfigFields) {
  auto err = [](const std::string& cfg) {
    try {
      ModelConfig::from_json(cfg, "", "x/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 8, "vocab_size": 100)";
  std::string e = err(R"({"model_type": "gpt2", )" + base + "}");
  EXPECT_NE(e.find("unsupported model_type \"gpt2\""), std::string::npos) << e;
  EXPECT_NE(e.find("llama, mistral, qwen2, qwen3"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "hidden_size": "64"})");
  EXPECT_NE(e.find("\"hidden_size\" must be an integer"), std::string::npos) << e;
  e = err(R"({"model_type": "llama")");
  EXPECT_NE(e.find("x/config.json: malformed JSON"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", )" + base + R"(, "num_key_value_heads": 3})");
  EXPECT_NE(e.find("num_key_value_heads = 3"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", )" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4}})");
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
  // sliding windows: mistral on all layers; qwen2 only when use_sliding_window, from max_window_layers
  ModelConfig m = ModelConfig::from_json(R"({"model_type": "mistral", )" + base + R"(, "sliding_window": 16})");
  EXPECT_EQ(m.layer_window, (std::vector<int64_t>{16, 16}));
  ModelConfig q = ModelConfig::from_json(R"({"model_type": "qwen2", )" + base +
                                         R"(, "sliding_window": 16, "use_sliding_window": true, "max_window_layers": 1})");
  EXPECT_EQ(q.layer_window, (std::vector<int64_t>{0, 16}));
  EXPECT_TRUE(q.attention_bias);
  ModelConfig q2 = ModelConfig::from_json(R"({"model_type": "qwen2", )" + base + R"(, "sliding_window": 16})");
  EXPECT_EQ(q2.layer_window, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(q2.head_dim, 8);
}

TEST(LoaderErrors, UntiedWithoutLmHead) {
  std::string dir = make_model("untied");
  auto cfg = nlohmann::json::parse(read_file(dir + "/config.json"));
  cfg["tie_word_embeddings"] = false;
  write(dir + "/config.json", cfg.dump());
  std::string e = load_error(dir);
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
}
