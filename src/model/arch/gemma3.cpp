// Gemma 3 (text: Gemma3ForCausalLM; llama.cpp src/models/gemma3.cpp): embeddings scaled by
// sqrt(hidden_size), sandwich norms (an RMSNorm on the attention output and on the MLP output
// before each residual add), q/k norms, RMSNorm weights as 1 + w, a GELU-tanh gated MLP,
// attention scale query_pre_attn_scalar^-0.5, and sliding-window layers (five of every six)
// that rotate with their own RoPE base.
#include <cmath>

#include "../arch.h"
#include "../blocks.h"
#include "../gguf.h"

namespace kvboost::arch {

namespace {

using blocks::LayerPass;
using cfgjson::get_int;
using cfgjson::get_num;

void layer(LayerPass& p) {
  blocks::input_norm(p);
  blocks::qkv_projection(p);
  blocks::qk_norm(p);
  blocks::rope(p, /*local=*/true);  // sliding layers: the local base (llama.cpp get_rope_freq_base)
  if (!blocks::write_kv(p)) return;
  blocks::attention(p);
  blocks::output_projection(p);
  blocks::post_norm(p, p.L.post_attn_norm);  // attn_post_norm before the residual add
  blocks::residual_norm(p);                  // x += attn; h = pre_feedforward_layernorm(x)
  blocks::gated_mlp(p, p.c.hidden_act == "silu" ? blocks::Activation::Silu : blocks::Activation::GeluTanh);
  blocks::post_norm(p, p.L.post_mlp_norm);  // ffn_post_norm before its add
  blocks::end_layer(p);
}

// Gemma's norms have their own names (gguf-py tensor_mapping.py): HF post_attention_layernorm
// is the attention output's norm (GGUF post_attention_norm), the MLP's input norm is
// pre_feedforward_layernorm (GGUF ffn_norm).
const std::vector<LayerTensor> kTensors = {
    {Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"},
    {Role::PostAttnNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {Role::MlpNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {Role::PostMlpNorm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {Role::Wq, "self_attn.q_proj.weight", "attn_q.weight"},
    {Role::Wk, "self_attn.k_proj.weight", "attn_k.weight"},
    {Role::Wv, "self_attn.v_proj.weight", "attn_v.weight"},
    {Role::Wo, "self_attn.o_proj.weight", "attn_output.weight"},
    {Role::QBias, "self_attn.q_proj.bias", "attn_q.bias", When::AttentionBias},
    {Role::KBias, "self_attn.k_proj.bias", "attn_k.bias", When::AttentionBias},
    {Role::VBias, "self_attn.v_proj.bias", "attn_v.bias", When::AttentionBias},
    {Role::OBias, "self_attn.o_proj.bias", "attn_output.bias", When::AttentionBias},
    {Role::QNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"},
    {Role::KNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"},
    {Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"},
    {Role::Up, "mlp.up_proj.weight", "ffn_up.weight"},
    {Role::Down, "mlp.down_proj.weight", "ffn_down.weight"},
};

// The multimodal checkpoints say gemma3 with the text model's fields under text_config.
void check_json(const nlohmann::json& j, const std::string& source) {
  if (j.contains("text_config") && !j.contains("hidden_size"))
    fail(source, ": a multimodal Gemma 3 config (fields under \"text_config\") is not supported; "
         "text-only checkpoints (model_type gemma3_text) are");
}

void configure(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.attention_bias = cfgjson::get_bool(j, "attention_bias", source, false);
  c.qk_norm = true;
  // Gemma's config names the activation hidden_activation (hidden_act is a legacy field).
  const char* act_key = j.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
  c.hidden_act = cfgjson::get_str(j, act_key, source, "gelu_pytorch_tanh");
  // (silu is accepted too, as Hugging Face's ACT2FN would run it.)
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "silu")
    fail(source, ": ", act_key, " \"", c.hidden_act, "\" is not supported (gelu_pytorch_tanh)");
  // Hugging Face Gemma3TextModel: embeddings * sqrt(hidden_size), sandwich norms, q/k norms,
  // RMSNorm weights as 1 + w, attention scale query_pre_attn_scalar^-0.5, local RoPE base
  // for the sliding layers.
  c.embed_scale = std::sqrt(float(c.hidden_size));
  c.sandwich_norms = true;
  c.norm_weight_offset = 1.0f;
  c.query_pre_attn_scalar = get_num(j, "query_pre_attn_scalar", source, double(c.head_dim));
  if (!(c.query_pre_attn_scalar > 0)) fail(source, ": query_pre_attn_scalar must be positive");
  c.rope_local_theta = get_num(j, "rope_local_base_freq", source, 10000.0);
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
    if (get_num(j, cap, source, 0.0) != 0.0)
      fail(source, ": ", cap, " = ", j[cap].dump(), " is not supported (Gemma 3 has none)");
}

// Every sliding_window_pattern-th layer is global, the others slide (llama.cpp
// llama_hparams::set_swa_pattern: layer il slides iff il % n < n - 1).
void default_windows(const nlohmann::json& j, const std::string& source, int64_t window, ModelConfig& c) {
  const int64_t pattern = get_int(j, "sliding_window_pattern", source, 6);
  for (int64_t i = 0; i < c.n_layers; ++i)
    if (i % pattern < pattern - 1) c.layer_window[size_t(i)] = window;
}

// llama.cpp src/models/gemma3.cpp (load_arch_hparams): sliding window from
// attention.sliding_window, every 6th layer global unless attention.sliding_window_pattern
// says otherwise, local RoPE base rope.freq_base_swa (default 10000), attention scale
// 1/sqrt(key_length) (27B: 1/sqrt(n_embd / n_head)), optional final logit softcapping.
void gguf_config(const gguf::File& f, nlohmann::json& j) {
  const std::string a = "gemma3.";
  const int64_t window = f.get_int(a + "attention.sliding_window", 0);
  if (window > 0) {
    if (const gguf::Value* p = f.find(a + "attention.sliding_window_pattern"); p && p->type == gguf::ValueType::ARRAY)
      fail(f.path(), ": metadata \"", a, "attention.sliding_window_pattern\" as a per-layer array is not supported");
    j["sliding_window"] = window;
    j["sliding_window_pattern"] = f.get_int(a + "attention.sliding_window_pattern", 6);
  }
  j["rope_local_base_freq"] = f.get_float(a + "rope.freq_base_swa", 10000.0);
  const int64_t n_head = j["num_attention_heads"].get<int64_t>();
  const int64_t head_dim = j.contains("head_dim") ? j["head_dim"].get<int64_t>() : j["hidden_size"].get<int64_t>() / n_head;
  j["query_pre_attn_scalar"] = j["num_hidden_layers"].get<int64_t>() == 62 ? j["hidden_size"].get<int64_t>() / n_head : head_dim;
  j["final_logit_softcapping"] = f.get_float(a + "final_logit_softcapping", 0.0);
  j["hidden_activation"] = "gelu_pytorch_tanh";
}

}  // namespace

const Arch kGemma3 = [] {
  Arch a;
  a.model_type = "gemma3";
  a.alias = "gemma3_text";  // the text-only checkpoints (270M, 1B: Gemma3ForCausalLM)
  a.gguf_arch = "gemma3";
  a.tie_default = true;
  a.gguf_norms_offset_applied = true;  // llama.cpp's converter stores 1 + w
  a.tensors = kTensors;
  a.check_json = check_json;
  a.configure = configure;
  a.default_windows = default_windows;
  a.gguf_config = gguf_config;
  a.layer = layer;
  return a;
}();

}  // namespace kvboost::arch
