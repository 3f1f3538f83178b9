// Qwen2 / Qwen2.5: the Llama layer with biases on the q/k/v projections (always; no o_proj
// bias), and optional sliding windows on the layers from max_window_layers on.
#include "../arch.h"
#include "../blocks.h"

namespace kvboost::arch {

namespace {

const std::vector<LayerTensor> kTensors = {
    {Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"},
    {Role::MlpNorm, "post_attention_layernorm.weight", "ffn_norm.weight"},
    {Role::Wq, "self_attn.q_proj.weight", "attn_q.weight"},
    {Role::Wk, "self_attn.k_proj.weight", "attn_k.weight"},
    {Role::Wv, "self_attn.v_proj.weight", "attn_v.weight"},
    {Role::Wo, "self_attn.o_proj.weight", "attn_output.weight"},
    {Role::QBias, "self_attn.q_proj.bias", "attn_q.bias", When::AttentionBias},
    {Role::KBias, "self_attn.k_proj.bias", "attn_k.bias", When::AttentionBias},
    {Role::VBias, "self_attn.v_proj.bias", "attn_v.bias", When::AttentionBias},
    {Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"},
    {Role::Up, "mlp.up_proj.weight", "ffn_up.weight"},
    {Role::Down, "mlp.down_proj.weight", "ffn_down.weight"},
};

void configure(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.attention_bias = true;  // Qwen2Attention: q/k/v_proj bias=True whatever config.json says
  cfgjson::require_silu(j, source, c);
}

}  // namespace

// Qwen2 / Qwen3: use_sliding_window turns on windows from layer max_window_layers on.
void qwen_windows(const nlohmann::json& j, const std::string& source, int64_t window, ModelConfig& c) {
  if (cfgjson::get_bool(j, "use_sliding_window", source, false) && window > 0) {
    const int64_t from = cfgjson::get_int(j, "max_window_layers", source, c.n_layers, 0);
    for (int64_t i = from; i < c.n_layers; ++i) c.layer_window[size_t(i)] = window;
  }
}

const Arch kQwen2 = [] {
  Arch a;
  a.model_type = "qwen2";
  a.gguf_arch = "qwen2";
  a.tensors = kTensors;
  a.configure = configure;
  a.default_windows = qwen_windows;
  a.layer = llama_layer;
  return a;
}();

}  // namespace kvboost::arch
