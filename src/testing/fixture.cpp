// Random-weight model directories in Hugging Face layout, for tests, benchmarks and the
// offline demo. Weights are drawn from a seeded generator, so a spec always yields the same
// bytes; tensors are generated and written one at a time (a 1B-parameter fixture needs no
// more memory than its largest tensor).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "awq.h"
#include "kvboost/common.h"
#include "kvboost/model_files.h"
#include "testing/fixture.h"
#include "kvboost/tokenizer.h"

namespace kvboost {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double((next() >> 11) + 1) * (1.0 / 9007199254740993.0); }
  void normal2(float* out) {  // Box-Muller
    const double r = std::sqrt(-2.0 * std::log(uniform())), a = 2 * M_PI * uniform();
    out[0] = float(r * std::cos(a));
    out[1] = float(r * std::sin(a));
  }
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  float mean, std;
  bool is_vector;  // norms/biases: always written as the model dtype too (as HF checkpoints do)
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// The values of one generated tensor, in f32. Each tensor has its own stream, so sharding and
// quantization do not change the values.
std::vector<float> generate(const TensorSpec& t, uint64_t seed) {
  Rng rng{seed ^ std::hash<std::string>{}(t.name)};
  const int64_t n = numel(t.shape);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {
    float z[2];
    rng.normal2(z);
    for (int j = 0; j < 2 && i + j < n; ++j) v[size_t(i + j)] = t.mean + t.std * z[j];
  }
  return v;
}

// One tensor of an output file: safetensors dtype, shape, and a function producing its bytes
// (called when the file is written, one tensor at a time).
struct OutTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::function<std::vector<char>()> bytes;
  uint64_t nbytes() const {
    const int64_t es = dtype == "F32" || dtype == "I32" ? 4 : 2;
    return uint64_t(numel(shape) * es);
  }
};

void write_file(const std::string& path, const std::vector<OutTensor>& ts) {
  ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& t : ts) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // keep the data 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, ": cannot create");
  uint64_t hl = h.size();
  char lenbuf[8];
  for (int i = 0; i < 8; ++i) lenbuf[i] = char((hl >> (8 * i)) & 0xff);
  out.write(lenbuf, 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& t : ts) {
    const std::vector<char> buf = t.bytes();
    if (buf.size() != t.nbytes()) fail(path, ": internal error: tensor ", t.name, " has ", buf.size(), " bytes");
    out.write(buf.data(), std::streamsize(buf.size()));
  }
  if (!out) fail(path, ": write failed");
}

// f32 values -> the bytes of a plain tensor of `dtype` (f32 | f16 | bf16), and the f32 values
// those bytes hold.
std::vector<char> encode(const std::vector<float>& v, const std::string& dtype) {
  const int64_t es = dtype == "f32" ? 4 : 2;
  std::vector<char> buf(v.size() * size_t(es));
  for (size_t i = 0; i < v.size(); ++i) {
    if (es == 4) {
      std::memcpy(&buf[i * 4], &v[i], 4);
    } else {
      const uint16_t hv = dtype == "f16" ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(&buf[i * 2], &hv, 2);
    }
  }
  return buf;
}
float round_to(float v, const std::string& dtype) {
  if (dtype == "f16") return f16_to_f32(f32_to_f16(v));
  if (dtype == "bf16") return bf16_to_f32(f32_to_bf16(v));
  return v;
}
template <typename T>
std::vector<char> raw_bytes(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// The projections AWQ quantizes (embeddings and lm_head never are).
bool is_projection(const std::string& name) {
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight"})
    if (ends_with(name, p)) return true;
  return false;
}

struct AwqTensors {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
};

// What each file of the model holds: plain tensors in `dtype` (mode Plain), AWQ projections
// plus plain tensors (Awq), or everything in f32 as the AWQ model exactly represents it
// (AwqDequant).
enum class Mode { Plain, Awq, AwqDequant };

std::vector<OutTensor> out_tensors(const std::vector<TensorSpec>& ts, const FixtureSpec& s, Mode mode) {
  // The three AWQ tensors of a layer are written one after the other: quantize once for them.
  auto cache = std::make_shared<std::pair<std::string, AwqTensors>>();
  const uint64_t seed = s.seed;
  const int64_t gs = s.group_size;
  auto quantized = [cache, seed, gs](const TensorSpec& t) -> const AwqTensors& {
    if (cache->first != t.name) {
      const int64_t out = t.shape[0], in = t.shape[1];
      AwqTensors q;
      q.qweight.resize(size_t(in * out / 8));
      q.qzeros.resize(size_t(in / gs * out / 8));
      q.scales.resize(size_t(in / gs * out));
      awq::quantize(generate(t, seed).data(), out, in, gs, q.qweight.data(), q.qzeros.data(), q.scales.data());
      cache->first = t.name;
      cache->second = std::move(q);
    }
    return cache->second;
  };
  std::vector<OutTensor> out;
  for (const TensorSpec& t : ts) {
    const std::string prefix = t.name.substr(0, t.name.rfind('.'));
    const bool quant = mode != Mode::Plain && is_projection(t.name) && !awq::not_converted(
        awq::Config{4, gs, true, "gemm", s.awq_not_convert}, prefix);
    if (quant) {
      const int64_t o = t.shape[0], in = t.shape[1];
      if (gs <= 0 || gs % 32 != 0) fail("fixture: AWQ group size ", gs, " is not a positive multiple of 32");
      if (in % gs != 0 || o % 8 != 0)
        fail("fixture: ", t.name, " [", o, ", ", in, "] cannot be AWQ-quantized with group size ", gs,
             " (in features must be a multiple of it, out features of 8)");
    }
    if (quant && mode == Mode::Awq) {
      const int64_t o = t.shape[0], in = t.shape[1];
      out.push_back({prefix + ".qweight", "I32", {in, o / 8}, [=] { return raw_bytes(quantized(t).qweight); }});
      out.push_back({prefix + ".qzeros", "I32", {in / gs, o / 8}, [=] { return raw_bytes(quantized(t).qzeros); }});
      out.push_back({prefix + ".scales", "F16", {in / gs, o}, [=] { return raw_bytes(quantized(t).scales); }});
    } else if (quant) {  // AwqDequant
      const int64_t o = t.shape[0], in = t.shape[1];
      out.push_back({t.name, "F32", t.shape, [=] {
                       const AwqTensors& q = quantized(t);
                       std::vector<float> w(size_t(o * in));
                       awq::dequantize(q.qweight.data(), q.qzeros.data(), q.scales.data(), in, o, gs, w.data());
                       return raw_bytes(w);
                     }});
    } else if (mode == Mode::AwqDequant) {
      const std::string dt = s.dtype;
      out.push_back({t.name, "F32", t.shape, [=] {
                       std::vector<float> v = generate(t, seed);
                       for (float& x : v) x = round_to(x, dt);
                       return raw_bytes(v);
                     }});
    } else {
      const std::string dt = s.dtype;
      out.push_back({t.name, dt == "f32" ? "F32" : dt == "f16" ? "F16" : "BF16", t.shape,
                     [=] { return encode(generate(t, seed), dt); }});
    }
  }
  return out;
}

void write_weights(const std::string& dir, const std::vector<OutTensor>& ts, int shards) {
  namespace fs = std::filesystem;
  fs::remove(path_join(dir, "model.safetensors"));
  fs::remove(path_join(dir, "model.safetensors.index.json"));
  if (shards <= 1) {
    write_file(path_join(dir, "model.safetensors"), ts);
    return;
  }
  ordered_json index;
  uint64_t total = 0;
  for (const auto& t : ts) total += t.nbytes();
  index["metadata"] = {{"total_size", total}};
  const size_t per = (ts.size() + size_t(shards) - 1) / size_t(shards);
  for (int sh = 0; sh < shards; ++sh) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", sh + 1, shards);
    std::vector<OutTensor> part(ts.begin() + std::min(ts.size(), sh * per),
                                ts.begin() + std::min(ts.size(), (sh + 1) * per));
    write_file(path_join(dir, name), part);
    for (const auto& t : part) index["weight_map"][t.name] = name;
  }
  std::ofstream(path_join(dir, "model.safetensors.index.json")) << index.dump(2) << "\n";
}

}  // namespace

FixtureSpec fixture_preset(const std::string& name) {
  FixtureSpec s;
  if (name == "tiny") {
    s.init_std = 0.08f;
    return s;
  }
  if (name == "qwen2.5-0.5b") {
    s.arch = "qwen2";
    s.dtype = "bf16";
    s.hidden = 896, s.intermediate = 4864, s.layers = 24, s.heads = 14, s.kv_heads = 2;
    s.vocab = 151936, s.max_pos = 32768, s.tie = true, s.rope_theta = 1000000.0;
    return s;
  }
  if (name == "qwen2.5-1.5b") {  // ~3.1 GB in bf16: larger than memory on small machines
    s.arch = "qwen2";
    s.dtype = "bf16";
    s.hidden = 1536, s.intermediate = 8960, s.layers = 28, s.heads = 12, s.kv_heads = 2;
    s.vocab = 151936, s.max_pos = 32768, s.tie = true, s.rope_theta = 1000000.0;
    return s;
  }
  if (name == "llama3.2-1b") {
    s.arch = "llama";
    s.dtype = "bf16";
    s.hidden = 2048, s.intermediate = 8192, s.layers = 16, s.heads = 32, s.kv_heads = 8, s.head_dim = 64;
    s.vocab = 128256, s.max_pos = 131072, s.tie = true, s.rope_theta = 500000.0;
    s.rope_scaling = "llama3";
    return s;
  }
  fail("unknown fixture preset \"", name, "\" (known: tiny, qwen2.5-0.5b, qwen2.5-1.5b, llama3.2-1b)");
}

void write_fixture_model(const std::string& dir, const FixtureSpec& s) {
  namespace fs = std::filesystem;
  if (s.arch != "llama" && s.arch != "mistral" && s.arch != "qwen2" && s.arch != "qwen3")
    fail("fixture: unknown arch \"", s.arch, "\"");
  if (s.dtype != "f32" && s.dtype != "f16" && s.dtype != "bf16") fail("fixture: unknown dtype \"", s.dtype, "\"");
  if (s.heads % s.kv_heads) fail("fixture: heads must be a multiple of kv_heads");
  if (!s.dequant_dir.empty() && s.quant.empty()) fail("fixture: a dequantized reference needs a quantization (awq)");
  fs::create_directories(dir);

  // Tokenizer first: its size decides the vocabulary when none is given.
  int64_t vocab = s.vocab;
  std::optional<int32_t> bos, eos;
  if (!s.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      const std::string src = path_join(s.tokenizer_dir, f);
      if (!file_exists(src)) continue;
      const std::string dst = path_join(dir, f);
      fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
      // the source may be read-only (../shared); the copy belongs to the fixture
      fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    }
  } else if (!s.tokenizer_kind.empty()) {
    const int64_t tv = std::min<int64_t>(vocab > 0 ? vocab : 512, 4096);
    std::ofstream(path_join(dir, "tokenizer.json")) << make_fixture_tokenizer_json(s.tokenizer_kind, int(tv), s.seed);
    std::ofstream(path_join(dir, "tokenizer_config.json")) << make_fixture_tokenizer_config_json(s.tokenizer_kind);
  }
  if (file_exists(path_join(dir, "tokenizer.json"))) {
    Tokenizer tok = Tokenizer::from_dir(dir);
    if (vocab == 0) vocab = tok.vocab_size();
    if (vocab < tok.vocab_size()) fail("fixture: vocab ", vocab, " is smaller than the tokenizer's ", tok.vocab_size());
    bos = tok.bos_id();
    eos = tok.eos_id();
  }
  if (vocab == 0) vocab = 512;

  const int64_t hd = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  ordered_json cfg;
  const char* cls = s.arch == "llama" ? "LlamaForCausalLM" : s.arch == "mistral" ? "MistralForCausalLM"
                  : s.arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
  cfg["architectures"] = {cls};
  cfg["model_type"] = s.arch;
  cfg["hidden_size"] = s.hidden;
  cfg["intermediate_size"] = s.intermediate;
  cfg["num_hidden_layers"] = s.layers;
  cfg["num_attention_heads"] = s.heads;
  cfg["num_key_value_heads"] = s.kv_heads;
  if (s.head_dim > 0 || s.arch == "qwen3") cfg["head_dim"] = hd;
  cfg["vocab_size"] = vocab;
  cfg["max_position_embeddings"] = s.max_pos;
  cfg["rms_norm_eps"] = 1e-6;
  cfg["rope_theta"] = s.rope_theta;
  cfg["hidden_act"] = "silu";
  cfg["tie_word_embeddings"] = s.tie;
  cfg["torch_dtype"] = s.dtype == "f32" ? "float32" : s.dtype == "f16" ? "float16" : "bfloat16";
  if (s.arch != "qwen2") cfg["attention_bias"] = false;  // qwen2 always biases q/k/v
  if (bos) cfg["bos_token_id"] = *bos;
  if (eos) cfg["eos_token_id"] = *eos;
  if (s.rope_scaling == "llama3") {
    cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
    // A small original context so the scaled bands matter even for short test prompts.
    if (s.max_pos > 64 * 32 && s.hidden >= 512) cfg["rope_scaling"]["original_max_position_embeddings"] = 8192;
  } else if (!s.rope_scaling.empty()) {
    fail("fixture: unknown rope scaling \"", s.rope_scaling, "\"");
  }
  if (s.arch == "mistral") cfg["sliding_window"] = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
  if (s.arch == "qwen2" || s.arch == "qwen3") {
    cfg["use_sliding_window"] = s.sliding_window > 0;
    cfg["sliding_window"] = s.sliding_window > 0 ? s.sliding_window : 4096;
    cfg["max_window_layers"] = s.sliding_window > 0 ? 0 : s.layers;
  } else if (s.sliding_window > 0 && s.arch != "mistral") {
    fail("fixture: sliding_window needs arch mistral, qwen2 or qwen3");
  }
  if (s.quant == "awq") {
    // As transformers writes an AutoAWQ checkpoint's config.json.
    cfg["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", s.group_size},
                                  {"zero_point", true}, {"version", "gemm"},
                                  {"modules_to_not_convert", s.awq_not_convert.empty() ? json(nullptr) : json(s.awq_not_convert)}};
    cfg["torch_dtype"] = s.dtype == "f32" ? "float32" : s.dtype == "f16" ? "float16" : "bfloat16";
  } else if (!s.quant.empty()) {
    fail("fixture: unknown quantization \"", s.quant, "\" (known: awq)");
  }
  std::ofstream(path_join(dir, "config.json")) << cfg.dump(2) << "\n";
  ordered_json gen;
  if (bos) gen["bos_token_id"] = *bos;
  if (eos) gen["eos_token_id"] = *eos;
  gen["do_sample"] = false;
  std::ofstream(path_join(dir, "generation_config.json")) << gen.dump(2) << "\n";

  const float sd = s.init_std;
  std::vector<TensorSpec> ts;
  ts.push_back({"model.embed_tokens.weight", {vocab, s.hidden}, 0, sd, false});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back({p + "input_layernorm.weight", {s.hidden}, 1, 0.1f, true});
    ts.push_back({p + "self_attn.q_proj.weight", {s.heads * hd, s.hidden}, 0, sd, false});
    ts.push_back({p + "self_attn.k_proj.weight", {s.kv_heads * hd, s.hidden}, 0, sd, false});
    ts.push_back({p + "self_attn.v_proj.weight", {s.kv_heads * hd, s.hidden}, 0, sd, false});
    ts.push_back({p + "self_attn.o_proj.weight", {s.hidden, s.heads * hd}, 0, sd, false});
    if (s.arch == "qwen2") {
      ts.push_back({p + "self_attn.q_proj.bias", {s.heads * hd}, 0, 0.5f, true});
      ts.push_back({p + "self_attn.k_proj.bias", {s.kv_heads * hd}, 0, 0.5f, true});
      ts.push_back({p + "self_attn.v_proj.bias", {s.kv_heads * hd}, 0, 0.5f, true});
    }
    if (s.arch == "qwen3") {
      ts.push_back({p + "self_attn.q_norm.weight", {hd}, 1, 0.2f, true});
      ts.push_back({p + "self_attn.k_norm.weight", {hd}, 1, 0.2f, true});
    }
    ts.push_back({p + "post_attention_layernorm.weight", {s.hidden}, 1, 0.1f, true});
    ts.push_back({p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, 0, sd, false});
    ts.push_back({p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, 0, sd, false});
    ts.push_back({p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, 0, sd, false});
  }
  ts.push_back({"model.norm.weight", {s.hidden}, 1, 0.1f, true});
  if (!s.tie) ts.push_back({"lm_head.weight", {vocab, s.hidden}, 0, sd, false});

  if (s.quant.empty()) {
    write_weights(dir, out_tensors(ts, s, Mode::Plain), s.shards);
    return;
  }
  write_weights(dir, out_tensors(ts, s, Mode::Awq), s.shards);
  if (s.dequant_dir.empty()) return;
  // The reference: the same directory with f32 weights equal to what the AWQ model holds.
  fs::create_directories(s.dequant_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
    if (file_exists(path_join(dir, f)))
      fs::copy_file(path_join(dir, f), path_join(s.dequant_dir, f), fs::copy_options::overwrite_existing);
  cfg.erase("quantization_config");
  cfg["torch_dtype"] = "float32";
  std::ofstream(path_join(s.dequant_dir, "config.json")) << cfg.dump(2) << "\n";
  write_weights(s.dequant_dir, out_tensors(ts, s, Mode::AwqDequant), s.shards);
}


// ---- a larger model grown around a small one (fixture.h, GrownSpec) ----------------------------

namespace {
// A base tensor's values in f32 (F32 / F16 / BF16).
std::vector<float> base_values(const WeightFiles& w, const std::string& name, const std::string& dir) {
  const TensorInfo* t = w.find(name);
  if (!t) fail(dir, ": grown model: the base has no tensor ", name);
  const size_t n = size_t(numel(t->shape));
  std::vector<float> v(n);
  if (t->dtype == "F32") {
    std::memcpy(v.data(), t->data, n * 4);
  } else if (t->dtype == "F16" || t->dtype == "BF16") {
    const auto* h = static_cast<const uint16_t*>(t->data);
    for (size_t i = 0; i < n; ++i) v[i] = t->dtype == "F16" ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
  } else {
    fail(dir, ": grown model: tensor ", name, " has dtype ", t->dtype, " (F32, F16 or BF16 expected)");
  }
  return v;
}
}  // namespace

void write_grown_model(const std::string& dir, const GrownSpec& g) {
  namespace fs = std::filesystem;
  if (g.dtype != "f32" && g.dtype != "f16" && g.dtype != "bf16") fail("grown model: unknown dtype \"", g.dtype, "\"");
  if (g.extra_layers < 0) fail("grown model: extra_layers = ", g.extra_layers, " is negative");
  const std::string cfg_path = path_join(g.base_dir, "config.json");
  if (!file_exists(cfg_path)) fail(cfg_path, ": not found (grown model base)");
  ordered_json cfg = ordered_json::parse(read_file(cfg_path));
  if (cfg.value("model_type", "") != "llama") fail(cfg_path, ": grown model: model_type must be llama");
  const int64_t H = cfg.at("hidden_size").get<int64_t>(), I0 = cfg.at("intermediate_size").get<int64_t>();
  const int64_t L0 = cfg.at("num_hidden_layers").get<int64_t>(), nh = cfg.at("num_attention_heads").get<int64_t>();
  const int64_t nkv = cfg.value("num_key_value_heads", nh), hd = cfg.value("head_dim", H / nh);
  const int64_t I = g.intermediate > 0 ? g.intermediate : I0;
  if (I < I0) fail("grown model: intermediate ", I, " is below the base's ", I0);
  const auto w = std::make_shared<WeightFiles>(WeightFiles::open_dir(g.base_dir));
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                        "tokenizer.model"}) {
    const std::string src = path_join(g.base_dir, f);
    if (!file_exists(src)) continue;
    const std::string dst = path_join(dir, f);
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
    fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  }
  const std::string dt = g.dtype, sdt = dt == "f32" ? "F32" : dt == "f16" ? "F16" : "BF16", base = g.base_dir;
  std::vector<OutTensor> ts;
  auto copy = [&](const std::string& name, std::vector<int64_t> shape) {
    ts.push_back({name, sdt, shape, [=] { return encode(base_values(*w, name, base), dt); }});
  };
  // [rows, cols] of the base padded with zeros to [rows2, cols2] (the base in the top-left).
  auto padded = [&](const std::string& name, int64_t rows, int64_t cols, int64_t rows2, int64_t cols2) {
    ts.push_back({name, sdt, {rows2, cols2}, [=] {
                    const std::vector<float> v = base_values(*w, name, base);
                    std::vector<float> o(size_t(rows2 * cols2), 0.0f);
                    for (int64_t r = 0; r < rows; ++r)
                      std::memcpy(&o[size_t(r * cols2)], &v[size_t(r * cols)], size_t(cols) * 4);
                    return encode(o, dt);
                  }});
  };
  const uint64_t seed = g.seed;
  auto random = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    const TensorSpec t{name, shape, mean, std, shape.size() == 1};
    ts.push_back({name, sdt, shape, [=] { return encode(generate(t, seed), dt); }});
  };
  copy("model.embed_tokens.weight", {cfg.at("vocab_size").get<int64_t>(), H});
  for (int64_t l = 0; l < L0 + g.extra_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (l < L0) {
      for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"}) copy(p + n, {H});
      copy(p + "self_attn.q_proj.weight", {nh * hd, H});
      copy(p + "self_attn.k_proj.weight", {nkv * hd, H});
      copy(p + "self_attn.v_proj.weight", {nkv * hd, H});
      copy(p + "self_attn.o_proj.weight", {H, nh * hd});
      padded(p + "mlp.gate_proj.weight", I0, H, I, H);
      padded(p + "mlp.up_proj.weight", I0, H, I, H);
      padded(p + "mlp.down_proj.weight", H, I0, H, I);
    } else {
      const float s = g.init_std, r = g.init_std * g.residual_scale;
      for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"}) random(p + n, {H}, 1.0f, 0.0f);
      random(p + "self_attn.q_proj.weight", {nh * hd, H}, 0.0f, s);
      random(p + "self_attn.k_proj.weight", {nkv * hd, H}, 0.0f, s);
      random(p + "self_attn.v_proj.weight", {nkv * hd, H}, 0.0f, s);
      random(p + "self_attn.o_proj.weight", {H, nh * hd}, 0.0f, r);
      random(p + "mlp.gate_proj.weight", {I, H}, 0.0f, s);
      random(p + "mlp.up_proj.weight", {I, H}, 0.0f, s);
      random(p + "mlp.down_proj.weight", {H, I}, 0.0f, r);
    }
  }
  copy("model.norm.weight", {H});
  if (w->find("lm_head.weight")) copy("lm_head.weight", {cfg.at("vocab_size").get<int64_t>(), H});
  write_weights(dir, ts, 1);
  cfg["num_hidden_layers"] = L0 + g.extra_layers;
  cfg["intermediate_size"] = I;
  cfg["torch_dtype"] = dt == "f32" ? "float32" : dt == "f16" ? "float16" : "bfloat16";
  cfg["kvboost_grown"] = {{"base", fs::path(g.base_dir).filename().string()}, {"extra_layers", g.extra_layers},
                          {"residual_scale", g.residual_scale}, {"seed", g.seed}};
  std::ofstream(path_join(dir, "config.json")) << cfg.dump(2) << "\n";
}

}  // namespace kvboost
