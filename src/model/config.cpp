// config.json / generation_config.json -> ModelConfig, with Hugging Face's defaults per
// model_type and errors that name the file, field and value.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "arch.h"
#include "kvboost/model.h"

namespace kvboost {

using nlohmann::json;

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> t;
    for (const arch::Arch* a : arch::all()) t.push_back(a->model_type);
    return t;
  }();
  return types;
}

namespace {

json parse(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e512
    fail(source, ": malformed JSON: ", e.what());
  }
}

}  // namespace

namespace cfgjson {

int64_t get_int(const json& j, const char* key, const std::string& source, std::optional<int64_t> def,
                int64_t min_value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    fail(source, ": missing field \"", key, "\"");
  }
  if (!it->is_number_integer()) fail(source, ": field \"", key, "\" must be an integer, got ", it->dump());
  int64_t v = it->get<int64_t>();
  if (v < min_value) fail(source, ": field \"", key, "\" = ", v, " is out of range (minimum ", min_value, ")");
  return v;
}

double get_num(const json& j, const char* key, const std::string& source, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) fail(source, ": field \"", key, "\" must be a number, got ", it->dump());
  return it->get<double>();
}

std::string get_str(const json& j, const char* key, const std::string& source, const std::string& def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_string()) fail(source, ": field \"", key, "\" must be a string, got ", it->dump());
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& source, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) fail(source, ": field \"", key, "\" must be true or false, got ", it->dump());
  return it->get<bool>();
}

void require_silu(const json& j, const std::string& source, ModelConfig& c) {
  c.hidden_act = get_str(j, "hidden_act", source, "silu");
  if (c.hidden_act != "silu") fail(source, ": hidden_act \"", c.hidden_act, "\" is not supported (silu)");
}

}  // namespace cfgjson

namespace {

using cfgjson::get_bool;
using cfgjson::get_int;
using cfgjson::get_num;
using cfgjson::get_str;

std::vector<int32_t> get_ids(const json& j, const char* key, const std::string& source) {
  std::vector<int32_t> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (it->is_number_integer()) {
    out.push_back(it->get<int32_t>());
  } else if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_number_integer()) fail(source, ": field \"", key, "\" must hold integers, got ", e.dump());
      out.push_back(e.get<int32_t>());
    }
  } else {
    fail(source, ": field \"", key, "\" must be an integer or a list, got ", it->dump());
  }
  return out;
}

}  // namespace

namespace {

ModelConfig config_from_json(const std::string& config_json, const std::string& generation_config_json,
                             const std::string& source) {
  json j = parse(config_json, source);
  if (!j.is_object()) fail(source, ": expected a JSON object");
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) fail(source, ": missing field \"model_type\"");
  c.model_type = mt->get<std::string>();
  // The architecture (src/model/arch/): its aliases (Gemma 3's text-only checkpoints say
  // gemma3_text) and its own checks on the raw config.
  const arch::Arch* a = arch::find(c.model_type);
  if (a) c.model_type = a->model_type;
  if (a && a->check_json) a->check_json(j, source);
  if (!a) {
    std::string list;
    for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    fail(source, ": unsupported model_type \"", c.model_type, "\" (supported: ", list, ")");
  }
  c.hidden_size = get_int(j, "hidden_size", source);
  c.intermediate_size = get_int(j, "intermediate_size", source);
  c.n_layers = get_int(j, "num_hidden_layers", source);
  c.n_heads = get_int(j, "num_attention_heads", source);
  c.n_kv_heads = get_int(j, "num_key_value_heads", source, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    fail(source, ": num_attention_heads = ", c.n_heads, " is not a multiple of num_key_value_heads = ", c.n_kv_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = get_int(j, "head_dim", source);
  } else {
    if (c.hidden_size % c.n_heads != 0)
      fail(source, ": hidden_size = ", c.hidden_size, " is not divisible by num_attention_heads = ", c.n_heads);
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim % 2 != 0) fail(source, ": head_dim = ", c.head_dim, " must be even for RoPE");
  c.vocab_size = get_int(j, "vocab_size", source);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", source, 2048);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", source, 1e-6);
  c.rope_theta = get_num(j, "rope_theta", source, 10000.0);
  // Sane limits before anything is sized by these numbers (a GGUF block_count of 2^28 used to end
  // in a bare std::bad_alloc), and hyper-parameters the math cannot work with.
  const std::pair<const char*, std::pair<int64_t, int64_t>> limits[] = {
      {"hidden_size", {c.hidden_size, 1 << 16}},
      {"intermediate_size", {c.intermediate_size, 1 << 18}},
      {"num_hidden_layers", {c.n_layers, 1 << 10}},
      {"num_attention_heads", {c.n_heads, 1 << 10}},
      {"num_key_value_heads", {c.n_kv_heads, 1 << 10}},
      {"head_dim", {c.head_dim, 1 << 12}},
      {"vocab_size", {c.vocab_size, 1 << 24}},
      {"max_position_embeddings", {c.max_position_embeddings, int64_t(1) << 24}},
  };
  for (const auto& [key, vl] : limits)
    if (vl.first > vl.second)
      fail(source, ": field \"", key, "\" = ", vl.first, " is out of range (maximum ", vl.second, ")");
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail(source, ": field \"rope_theta\" = ", c.rope_theta, " must be a positive finite number");
  if (!(c.rms_norm_eps > 0) || !(c.rms_norm_eps < 1))
    fail(source, ": field \"rms_norm_eps\" = ", c.rms_norm_eps, " must be in (0, 1)");
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, a->tie_default);
  if (get_bool(j, "mlp_bias", source, false)) fail(source, ": mlp_bias = true is not supported");
  a->configure(j, source, c);  // attention_bias, qk_norm, hidden_act, the architecture's own

  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) fail(source, ": rope_scaling must be an object or null");
    const std::string rsrc = source + " rope_scaling";
    std::string type = get_str(*rs, "rope_type", rsrc, get_str(*rs, "type", rsrc, "default"));
    c.rope_scaling.type = type;
    c.rope_scaling.factor = get_num(*rs, "factor", source + " rope_scaling", 1.0);
    if (type == "llama3") {
      c.rope_scaling.low_freq_factor = get_num(*rs, "low_freq_factor", source, 1.0);
      c.rope_scaling.high_freq_factor = get_num(*rs, "high_freq_factor", source, 4.0);
      c.rope_scaling.original_max_position_embeddings =
          get_int(*rs, "original_max_position_embeddings", source + " rope_scaling", 8192);
      if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
        fail(source, ": rope_scaling high_freq_factor must exceed low_freq_factor");
    } else if (type != "default" && type != "linear") {
      fail(source, ": rope_scaling type \"", type, "\" is not supported (supported: default, linear, llama3)");
    }
    if (!(c.rope_scaling.factor > 0)) fail(source, ": rope_scaling factor must be positive");
  }

  // Sliding-window attention, per layer, as Hugging Face decides it.
  c.layer_window.assign(size_t(c.n_layers), 0);
  int64_t window = 0;
  auto sw = j.find("sliding_window");
  if (sw != j.end() && sw->is_number_integer()) window = sw->get<int64_t>();
  if (auto lt = j.find("layer_types"); lt != j.end() && lt->is_array()) {
    if (int64_t(lt->size()) != c.n_layers)
      fail(source, ": layer_types has ", lt->size(), " entries for ", c.n_layers, " layers");
    for (int64_t i = 0; i < c.n_layers; ++i)
      if ((*lt)[size_t(i)] == "sliding_attention") c.layer_window[size_t(i)] = window;
  } else if (a->default_windows) {
    a->default_windows(j, source, window, c);
  }

  if (auto b = get_ids(j, "bos_token_id", source); !b.empty()) c.bos_token_id = b[0];
  c.eos_token_ids = get_ids(j, "eos_token_id", source);

  if (!generation_config_json.empty()) {
    const std::string gsrc = "generation_config.json";
    json g = parse(generation_config_json, gsrc);
    if (g.is_object()) {
      auto eos = get_ids(g, "eos_token_id", gsrc);
      if (!eos.empty()) c.eos_token_ids = eos;
      if (auto b = get_ids(g, "bos_token_id", gsrc); !b.empty()) c.bos_token_id = b[0];
      c.generation.do_sample = get_bool(g, "do_sample", gsrc, false);
      c.generation.temperature = float(get_num(g, "temperature", gsrc, 1.0));
      c.generation.top_p = float(get_num(g, "top_p", gsrc, 1.0));
      const double top_k = get_num(g, "top_k", gsrc, 50);  // GenerationConfig default
      if (!(top_k >= 0 && top_k <= double(1 << 24)))
        fail(gsrc, ": field \"top_k\" = ", top_k, " is out of range (0 to ", 1 << 24, ")");
      c.generation.top_k = int(top_k);
      c.generation.repetition_penalty = float(get_num(g, "repetition_penalty", gsrc, 1.0));
    }
  }
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& config_json,
                                   const std::string& generation_config_json,
                                   const std::string& source) {
  try {
    return config_from_json(config_json, generation_config_json, source);
  } catch (const json::exception& e) {  // a field of a type no check above expected
    fail(source, ": ", e.what());
  }
}

ModelConfig ModelConfig::from_dir(const std::string& dir) {
  const std::string cfg_path = path_join(dir, "config.json");
  if (!file_exists(cfg_path)) fail(cfg_path, ": missing (is ", dir, " a Hugging Face model directory?)");
  std::string gen;
  const std::string gen_path = path_join(dir, "generation_config.json");
  if (file_exists(gen_path)) gen = read_file(gen_path);
  try {
    return from_json(read_file(cfg_path), gen, cfg_path);
  } catch (const Error& e) {
    std::string msg = e.what();
    // generation_config errors name the bare file; give its full path
    if (msg.rfind("generation_config.json", 0) == 0) throw Error(gen_path + msg.substr(22));
    throw;
  }
}

}  // namespace kvboost
