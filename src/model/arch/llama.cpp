// Llama (and Mistral, which is llama-shaped): pre-norm attention with RoPE and grouped-query
// heads, then a SwiGLU MLP. config.json attention_bias adds q/k/v/o biases; Mistral's
// sliding_window applies to every layer.
#include "../arch.h"
#include "../blocks.h"

namespace kvboost::arch {

using blocks::LayerPass;

void llama_layer(LayerPass& p) {
  blocks::input_norm(p);
  blocks::qkv_projection(p);
  blocks::rope(p, /*local=*/false);
  if (!blocks::write_kv(p)) return;
  blocks::attention(p);
  blocks::output_projection(p);
  blocks::residual_norm(p);  // x += attn; h = norm(x)
  blocks::gated_mlp(p, blocks::Activation::Silu);
  blocks::end_layer(p);
}

namespace {

// Hugging Face LlamaForCausalLM names; llama.cpp's GGUF names (gguf-py tensor_mapping.py).
const std::vector<LayerTensor> kLlamaTensors = {
    {Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"},
    {Role::MlpNorm, "post_attention_layernorm.weight", "ffn_norm.weight"},
    {Role::Wq, "self_attn.q_proj.weight", "attn_q.weight"},
    {Role::Wk, "self_attn.k_proj.weight", "attn_k.weight"},
    {Role::Wv, "self_attn.v_proj.weight", "attn_v.weight"},
    {Role::Wo, "self_attn.o_proj.weight", "attn_output.weight"},
    {Role::QBias, "self_attn.q_proj.bias", "attn_q.bias", When::AttentionBias},
    {Role::KBias, "self_attn.k_proj.bias", "attn_k.bias", When::AttentionBias},
    {Role::VBias, "self_attn.v_proj.bias", "attn_v.bias", When::AttentionBias},
    {Role::OBias, "self_attn.o_proj.bias", "attn_output.bias", When::AttentionBias},
    {Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"},
    {Role::Up, "mlp.up_proj.weight", "ffn_up.weight"},
    {Role::Down, "mlp.down_proj.weight", "ffn_down.weight"},
};

void configure(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.attention_bias = cfgjson::get_bool(j, "attention_bias", source, false);
  cfgjson::require_silu(j, source, c);
}

void mistral_windows(const nlohmann::json&, const std::string&, int64_t window, ModelConfig& c) {
  for (auto& w : c.layer_window) w = window;
}

}  // namespace

const Arch kLlama = [] {
  Arch a;
  a.model_type = "llama";
  a.gguf_arch = "llama";
  a.gguf_permuted_qk = true;  // convert_hf_to_gguf.py LlamaModel permutes Q/K for its RoPE
  a.tensors = kLlamaTensors;
  a.configure = configure;
  a.layer = llama_layer;
  return a;
}();

// Mistral GGUF files say general.architecture llama (llama.cpp converts them as llama).
const Arch kMistral = [] {
  Arch a;
  a.model_type = "mistral";
  a.tensors = kLlamaTensors;
  a.configure = configure;
  a.default_windows = mistral_windows;
  a.layer = llama_layer;
  return a;
}();

}  // namespace kvboost::arch
