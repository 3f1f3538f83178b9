// The bad-input catalog (issue 23): generated broken files of every format the engine reads --
// safetensors, config.json, GGUF, tokenizer.json, chunk-store files, and model directories with
// impossible contents -- each of which must be refused with kvboost::Error whose message names the
// problem. No other exception (std::bad_alloc, json errors, std::out_of_range) and no crash.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "gguf.h"
#include "gguf_builder.h"
#include "kvboost/kv.h"
#include "kvboost/model.h"
#include "kvboost/tokenizer.h"
#include "kvboost/model_files.h"
#include "testing/fixture.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;

struct Case {
  std::string what;
  std::function<void()> run;
  std::string says;  // the message must contain this (case-sensitive; "a|b": either)
};

std::string write_bytes(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return p;
}

// ---- safetensors ---------------------------------------------------------------------------

std::string safetensors(const json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

json good_header() {
  return json{{"a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
              {"b", {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {16, 24}}}}};
}

void add_safetensors_cases(std::vector<Case>& cases, const std::string& dir) {
  const std::string data(24, '\0');
  const std::string good = safetensors(good_header(), data);
  int k = 0;
  auto file_case = [&](const std::string& what, const std::string& bytes, const std::string& says) {
    const std::string p = write_bytes(dir, "st" + std::to_string(k++) + ".safetensors", bytes);
    cases.push_back({"safetensors: " + what, [p] { (void)WeightFiles::open_file(p); }, says});
  };
  // Truncations: inside the length, inside the header, inside the data.
  for (size_t cut : {size_t(0), size_t(3), size_t(7)}) file_case("cut at " + std::to_string(cut), good.substr(0, cut), "truncated");
  for (size_t cut : {size_t(9), size_t(20), size_t(40), good.size() - 24 - 1})
    file_case("cut in the header at " + std::to_string(cut), good.substr(0, cut), "header");
  for (size_t drop : {size_t(1), size_t(8), size_t(23)})
    file_case("data short by " + std::to_string(drop), good.substr(0, good.size() - drop), "outside the data section");
  {
    std::string huge = good;
    const uint64_t n = uint64_t(1) << 62;
    std::memcpy(huge.data(), &n, 8);
    file_case("header length 2^62", huge, "header length");
  }
  file_case("header not JSON", safetensors(json(), "").replace(8, 4, "{{{{"), "corrupt safetensors header");
  file_case("header an array", safetensors(json::array({1, 2}), ""), "not a JSON object");
  auto mutate = [&](const std::string& what, const std::function<void(json&)>& f, const std::string& says) {
    json h = good_header();
    f(h);
    file_case(what, safetensors(h, data), says);
  };
  mutate("dtype missing", [](json& h) { h["a"].erase("dtype"); }, "dtype, shape and data_offsets");
  mutate("dtype a number", [](json& h) { h["a"]["dtype"] = 5; }, "dtype must be a string");
  mutate("unknown dtype", [](json& h) { h["a"]["dtype"] = "F128"; }, "unknown dtype");
  mutate("shape not a list", [](json& h) { h["a"]["shape"] = 4; }, "shape must be a list");
  mutate("negative dimension", [](json& h) { h["a"]["shape"] = {-2, 2}; }, "bad shape entry");
  mutate("huge dimension", [](json& h) { h["a"]["shape"] = {int64_t(1) << 50, 2}; }, "too large");
  mutate("huge shape product", [](json& h) { h["a"]["shape"] = {1 << 30, 1 << 30, 1 << 30}; }, "too large");
  mutate("offsets reversed", [](json& h) { h["a"]["data_offsets"] = {16, 0}; }, "data_offsets");
  mutate("offsets past the end", [](json& h) { h["b"]["data_offsets"] = {16, 4000}; }, "outside the data section");
  mutate("offsets negative", [](json& h) { h["a"]["data_offsets"] = {-1, 15}; }, "non-negative");
  mutate("offsets of three", [](json& h) { h["a"]["data_offsets"] = {0, 8, 16}; }, "data_offsets");
  mutate("span does not match the shape", [](json& h) { h["a"]["shape"] = {2, 3}; }, "shape and dtype need");
  mutate("overlapping tensors", [](json& h) { h["b"]["data_offsets"] = {8, 16}; }, "overlap");
  mutate("entry not an object", [](json& h) { h["a"] = "x"; }, "dtype, shape and data_offsets");
  {
    // A key given twice in the header text (JSON allows writing it; the second would shadow).
    std::string h = good_header().dump();
    h.insert(1, "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},");
    while (h.size() % 8) h += ' ';
    std::string out(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    file_case("duplicate header key", out + h + data, "appears twice");
  }
}

// ---- config.json ---------------------------------------------------------------------------

json good_config() {
  return json{{"model_type", "llama"},         {"hidden_size", 64},        {"intermediate_size", 128},
              {"num_hidden_layers", 2},        {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"vocab_size", 512},             {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},
              {"max_position_embeddings", 256}};
}

void add_config_cases(std::vector<Case>& cases) {
  auto cfg_case = [&](const std::string& what, const std::string& text, const std::string& says) {
    cases.push_back({"config.json: " + what, [text] { (void)ModelConfig::from_json(text, "", "config.json"); }, says});
  };
  cfg_case("not JSON", "{\"model_type\": ", "malformed JSON");
  cfg_case("an array", "[1]", "JSON object");
  // Found by fuzz_config in CI (2026-12-01): a number past double's range made nlohmann throw
  // out_of_range, which only parse_error was caught for, so it escaped as a non-kvboost error.
  cfg_case("a number past double's range", "{\"model_type\": \"llama\", \"rms_norm_eps\": 1e0512}", "malformed JSON");
  const char* ints[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"};
  for (const char* f : ints) {
    json c = good_config();
    c.erase(f);
    cfg_case(std::string(f) + " missing", c.dump(), f);
    for (const json& bad : {json(0), json(-3), json("12"), json(1.5)}) {
      json d = good_config();
      d[f] = bad;
      cfg_case(std::string(f) + " = " + bad.dump(), d.dump(), f);
    }
  }
  // Sizes that would make the loader allocate absurd amounts (a GGUF block_count of 2^28).
  const std::pair<const char*, int64_t> huge[] = {{"num_hidden_layers", int64_t(1) << 28},
                                                  {"hidden_size", int64_t(1) << 40},
                                                  {"vocab_size", int64_t(1) << 31},
                                                  {"intermediate_size", int64_t(1) << 33},
                                                  {"max_position_embeddings", int64_t(1) << 40}};
  for (const auto& [f, v] : huge) {
    json c = good_config();
    c[f] = v;
    cfg_case(std::string(f) + " = " + std::to_string(v), c.dump(), f);
  }
  for (const json& theta : {json(0.0), json(-1.0), json("big")}) {
    json c = good_config();
    c["rope_theta"] = theta;
    cfg_case("rope_theta = " + theta.dump(), c.dump(), "rope_theta");
  }
  for (const json& eps : {json(0.0), json(-1e-6), json(2.0)}) {
    json c = good_config();
    c["rms_norm_eps"] = eps;
    cfg_case("rms_norm_eps = " + eps.dump(), c.dump(), "rms_norm_eps");
  }
  {
    json c = good_config();
    c["num_key_value_heads"] = 3;
    cfg_case("heads not a multiple of kv heads", c.dump(), "num_key_value_heads");
    c = good_config();
    c["num_key_value_heads"] = 0;
    cfg_case("zero kv heads", c.dump(), "num_key_value_heads");
    c = good_config();
    c["head_dim"] = 7;
    cfg_case("odd head_dim", c.dump(), "head_dim");
    c = good_config();
    c["hidden_size"] = 66;
    cfg_case("hidden_size not divisible by heads", c.dump(), "hidden_size");
    c = good_config();
    c["model_type"] = "gpt-neox";
    cfg_case("unsupported model_type", c.dump(), "model_type");
    c = good_config();
    c.erase("model_type");
    cfg_case("model_type missing", c.dump(), "model_type");
    c = good_config();
    c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    cfg_case("rope_scaling yarn", c.dump(), "rope_scaling");
    c = good_config();
    c["rope_scaling"] = {{"type", "linear"}, {"factor", 0.0}};
    cfg_case("rope_scaling factor 0", c.dump(), "factor");
    c = good_config();
    c["hidden_act"] = "relu";
    cfg_case("unsupported activation", c.dump(), "hidden_act");
    c = good_config();
    c["mlp_bias"] = true;
    cfg_case("mlp_bias", c.dump(), "mlp_bias");
    // Found by fuzz_config in CI (2026-12-06): a string field holding another type made
    // nlohmann's value() throw type_error, which escaped as a non-kvboost error.
    c = good_config();
    c["hidden_act"] = 3;
    cfg_case("hidden_act a number", c.dump(), "hidden_act");
    c = good_config();
    c["rope_scaling"] = {{"type", 4}, {"factor", 2.0}};
    cfg_case("rope_scaling type a number", c.dump(), "type");
    c = good_config();
    c["rope_scaling"] = {{"rope_type", json::array()}, {"factor", 2.0}};
    cfg_case("rope_scaling rope_type a list", c.dump(), "rope_type");
    c = good_config();
    c["model_type"] = "gemma3_text";
    c["hidden_activation"] = false;
    cfg_case("gemma3 hidden_activation a bool", c.dump(), "hidden_activation");
  }
  const std::string good = good_config().dump();
  for (const json& k : {json(1e30), json(-5), json("many")})
    cases.push_back({"generation_config.json: top_k = " + k.dump(),
                     [good, k] { (void)ModelConfig::from_json(good, json{{"top_k", k}}.dump(), "config.json"); },
                     "top_k"});
}

// ---- GGUF ----------------------------------------------------------------------------------

std::string gguf_llama(const std::function<void(test::Builder&)>& extra_kv, uint32_t version = 3,
                       int64_t block_count = 1, int64_t heads = 2) {
  test::Builder b(version);
  b.kv_str("general.architecture", "llama");
  b.kv_u64("llama.block_count", uint64_t(block_count));
  b.kv_u32("llama.embedding_length", 8);
  b.kv_u32("llama.feed_forward_length", 16);
  b.kv_u64("llama.attention.head_count", uint64_t(heads));
  b.kv_u32("llama.attention.head_count_kv", 1);
  extra_kv(b);
  std::vector<float> emb(8 * 4, 0.5f);
  b.tensor("token_embd.weight", kernels::GgmlType::F32, {8, 4}, emb.data(), emb.size() * 4);
  const std::vector<uint8_t> bytes = b.finish();
  return std::string(bytes.begin(), bytes.end());
}

void add_gguf_cases(std::vector<Case>& cases, const std::string& dir) {
  int k = 0;
  auto file_case = [&](const std::string& what, const std::string& bytes, const std::string& says) {
    const std::string p = write_bytes(dir, "g" + std::to_string(k++) + ".gguf", bytes);
    cases.push_back({"gguf: " + what, [p] { (void)ModelConfig::from_gguf(p); }, says});
  };
  const std::string good = gguf_llama([](test::Builder&) {});
  ASSERT_NO_THROW((void)ModelConfig::from_gguf(write_bytes(dir, "good.gguf", good))) << "the base file must load";
  {
    std::string b = good;
    b[0] = 'X';
    file_case("bad magic", b, "not a GGUF file");
  }
  file_case("version 1", gguf_llama([](test::Builder&) {}, 1), "version 1");
  file_case("version 9", gguf_llama([](test::Builder&) {}, 9), "version");
  for (size_t cut : {size_t(4), size_t(12), size_t(30), size_t(60), size_t(100), size_t(150), good.size() - 64,
                     good.size() - 1})
    if (cut < good.size()) file_case("cut at " + std::to_string(cut), good.substr(0, cut), "truncated|cannot fit");
  {
    std::string b = good;
    const uint64_t n = uint64_t(1) << 60;
    std::memcpy(b.data() + 16, &n, 8);  // metadata count
    file_case("2^60 metadata entries", b, "cannot fit in the file");
    b = good;
    std::memcpy(b.data() + 8, &n, 8);  // tensor count
    file_case("2^60 tensors", b, "cannot fit in the file");
  }
  file_case("block_count 2^28", gguf_llama([](test::Builder&) {}, 3, int64_t(1) << 28), "num_hidden_layers");
  file_case("block_count 0", gguf_llama([](test::Builder&) {}, 3, 0), "num_hidden_layers");
  file_case("head_count 0", gguf_llama([](test::Builder&) {}, 3, 1, 0), "num_attention_heads");
  file_case("rope.freq_base 0", gguf_llama([](test::Builder& b) { b.kv_f32("llama.rope.freq_base", 0.0f); }),
            "rope_theta");
  file_case("rope.freq_base NaN",
            gguf_llama([](test::Builder& b) { b.kv_f32("llama.rope.freq_base", std::nanf("")); }), "rope_theta");
  file_case("alignment 3", gguf_llama([](test::Builder& b) { b.kv_u32("general.alignment", 3); }), "alignment");
  file_case("duplicate key", gguf_llama([](test::Builder& b) { b.kv_u32("llama.block_count", 1); }), "appears twice");
  file_case("architecture a number", gguf_llama([](test::Builder& b) { b.kv_u32("general.architecture", 1); }),
            "appears twice");
  file_case("unsupported rope scaling",
            gguf_llama([](test::Builder& b) { b.kv_str("llama.rope.scaling.type", "yarn"); }), "rope.scaling.type");
  file_case("key_length != value_length", gguf_llama([](test::Builder& b) {
              b.kv_u32("llama.attention.key_length", 4);
              b.kv_u32("llama.attention.value_length", 8);
            }),
            "value_length");
}

// ---- tokenizer.json ------------------------------------------------------------------------

void add_tokenizer_cases(std::vector<Case>& cases) {
  const json good = json::parse(make_fixture_tokenizer_json("bytelevel", 300));
  auto tok_case = [&](const std::string& what, const std::string& text, const std::string& says) {
    cases.push_back({"tokenizer.json: " + what, [text] { (void)Tokenizer::from_json(text, "", "tokenizer.json"); }, says});
  };
  tok_case("not JSON", "{\"model\": {", "tokenizer.json");
  tok_case("an array", "[]", "tokenizer.json");
  auto mutate = [&](const std::string& what, const std::function<void(json&)>& f, const std::string& says) {
    json t = good;
    f(t);
    tok_case(what, t.dump(), says);
  };
  mutate("model missing", [](json& t) { t.erase("model"); }, "model");
  mutate("unknown model type", [](json& t) { t["model"]["type"] = "WordLevelX"; }, "model");
  mutate("vocab not an object", [](json& t) { t["model"]["vocab"] = json::array(); }, "vocab");
  mutate("vocab id a string", [](json& t) { t["model"]["vocab"]["zzq"] = "7"; }, "id is not an integer");
  mutate("negative vocab id", [](json& t) { t["model"]["vocab"]["zzq"] = -4; }, "negative id");
  mutate("vocab id 10^8", [](json& t) { t["model"]["vocab"]["zzq"] = 100000000; }, "out of range");
  mutate("vocab id 10^9", [](json& t) { t["model"]["vocab"]["zzq"] = 1000000000; }, "out of range");
  mutate("vocab id 2^40", [](json& t) { t["model"]["vocab"]["zzq"] = int64_t(1) << 40; }, "out of range");
  mutate("merge of unknown tokens", [](json& t) { t["model"]["merges"].push_back("qqqq zzzz"); }, "merges");
  mutate("added token id 10^9",
         [](json& t) { t["added_tokens"].push_back({{"id", 1000000000}, {"content", "<x>"}, {"special", true}}); },
         "added_tokens");
  mutate("added token id negative",
         [](json& t) { t["added_tokens"].push_back({{"id", -1}, {"content", "<x>"}, {"special", true}}); },
         "added_tokens");
  mutate("added token without content", [](json& t) { t["added_tokens"].push_back({{"id", 5}}); }, "added_tokens");
  mutate("added_tokens not a list", [](json& t) { t["added_tokens"] = 3; }, "added_tokens");
  mutate("unknown pre_tokenizer", [](json& t) { t["pre_tokenizer"] = {{"type", "Nope"}}; }, "pre_tokenizer");
  mutate("unknown normalizer", [](json& t) { t["normalizer"] = {{"type", "Nope"}}; }, "normalizer");
  mutate("unknown decoder", [](json& t) { t["decoder"] = {{"type", "Nope"}}; }, "decoder");
}

// ---- chunk-store files ---------------------------------------------------------------------

void add_chunk_cases(std::vector<Case>& cases, const std::string& dir) {
  const kv::ChunkShape shape{2, 2, 8};
  const uint64_t model = kv::chunk_root("catalog", "\x01model");
  kv::Chunk c;
  c.tokens = {1, 2, 3, 4};
  c.keys = kv::ChunkKeys{1, 2, 3};
  kv::chunk_init(c, shape, kv::KvQuant::kF32, 4);
  std::vector<float> k(size_t(4 * shape.row()), 0.25f);
  for (int64_t l = 0; l < shape.n_layers; ++l) kv::chunk_put_layer(c, shape, l, k.data(), k.data());
  const std::string good_path = dir + "/good.kvc";
  kv::write_chunk_file(good_path, c, shape, model);
  std::ifstream in(good_path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int n = 0;
  auto file_case = [&](const std::string& what, const std::string& bytes, const std::string& says) {
    const std::string p = write_bytes(dir, "c" + std::to_string(n++) + ".kvc", bytes);
    cases.push_back({"chunk file: " + what, [=] { (void)kv::read_chunk_file(p, shape, model); }, says});
  };
  for (size_t cut : {size_t(0), size_t(5), size_t(40), good.size() / 2, good.size() - 1})
    file_case("cut at " + std::to_string(cut), good.substr(0, cut), "truncated");
  {
    std::string b = good;
    b[0] ^= 1;
    file_case("bad magic", b, "bad magic");
  }
  for (size_t at : {good.size() - 1, good.size() - 17, good.size() / 2 + 3}) {
    std::string b = good;
    b[at] ^= 0x10;
    file_case("bit flip at " + std::to_string(at), b, "checksum mismatch");
  }
  cases.push_back({"chunk file: another shape", [=] { (void)kv::read_chunk_file(good_path, kv::ChunkShape{3, 2, 8}, model); },
                   "does not match"});
  cases.push_back({"chunk file: another model", [=] { (void)kv::read_chunk_file(good_path, shape, model + 1); },
                   "another model"});
  // A FIFO must not block the reader, nor a symlink redirect it.
  const std::string fifo = dir + "/fifo.kvc";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  cases.push_back({"chunk file: a FIFO", [=] { (void)kv::read_chunk_file(fifo, shape, model); }, "not a regular file"});
  const std::string link = dir + "/link.kvc";
  ASSERT_EQ(::symlink(good_path.c_str(), link.c_str()), 0);
  cases.push_back({"chunk file: a symlink", [=] { (void)kv::read_chunk_file(link, shape, model); }, "cannot open"});
  cases.push_back({"chunk file: a directory", [=] { (void)kv::read_chunk_file(dir, shape, model); }, "not a regular file"});
}

// ---- model directories ---------------------------------------------------------------------

void add_model_cases(std::vector<Case>& cases) {
  // The tiny fixture with one weight set to NaN / Inf: refused at load with the tensor's name.
  for (const char* which : {"model.norm.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      const std::string d = test::make_temp_dir("bad_weights");
      write_fixture_model(d, fixture_preset("tiny"));
      WeightFiles f = WeightFiles::open_dir(d);
      const TensorInfo* t = f.find(which);
      ASSERT_NE(t, nullptr) << which;
      const std::string dtype = t->dtype;
      // Patch the file: the tensor's first element, found by its data_offsets in the header.
      const std::string path = t->file;
      std::ifstream in(path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      uint64_t hlen = 0;
      std::memcpy(&hlen, bytes.data(), 8);
      const json h = json::parse(bytes.substr(8, hlen));
      const uint64_t begin = h[which]["data_offsets"][0];
      char* at = bytes.data() + 8 + hlen + begin;
      if (dtype == "F32") {
        std::memcpy(at, &bad, 4);
      } else {
        const uint16_t v = dtype == "BF16" ? (std::isnan(bad) ? 0x7FC0 : 0x7F80) : (std::isnan(bad) ? 0x7E00 : 0x7C00);
        std::memcpy(at, &v, 2);
      }
      std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
      cases.push_back({std::string("model: ") + which + " = " + std::to_string(bad),
                       [d] { (void)Model::load(d); }, "non-finite"});
    }
  }
}

TEST(BadInputCatalog, EveryBrokenFileIsAClearError) {
  const std::string dir = test::make_temp_dir("bad_input_catalog");
  std::vector<Case> cases;
  add_safetensors_cases(cases, dir);
  add_config_cases(cases);
  add_gguf_cases(cases, dir);
  add_tokenizer_cases(cases);
  add_chunk_cases(cases, dir);
  add_model_cases(cases);
  EXPECT_GE(cases.size(), 100u);
  int clear = 0;
  for (const Case& c : cases) {
    try {
      c.run();
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      bool named = false;
      for (size_t p = 0; p <= c.says.size();) {
        const size_t q = std::min(c.says.find('|', p), c.says.size());
        named = named || m.find(c.says.substr(p, q - p)) != std::string::npos;
        p = q + 1;
      }
      if (named) ++clear;
      else ADD_FAILURE() << c.what << ": the message should say '" << c.says << "': " << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.what << ": not a kvboost::Error but " << typeid(e).name() << ": " << e.what();
    }
  }
  std::printf("bad-input catalog: %zu cases, %d refused with a clear message\n", cases.size(), clear);
}

}  // namespace
}  // namespace kvboost
