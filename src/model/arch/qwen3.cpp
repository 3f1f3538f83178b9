// Qwen3: the Llama layer with a per-head RMSNorm on q and k before RoPE; attention_bias (off
// in the released checkpoints) covers q/k/v/o.
#include "../arch.h"
#include "../blocks.h"

namespace kvboost::arch {

void qwen_windows(const nlohmann::json& j, const std::string& source, int64_t window, ModelConfig& c);  // qwen2.cpp

namespace {

using blocks::LayerPass;

void layer(LayerPass& p) {
  blocks::input_norm(p);
  blocks::qkv_projection(p);
  blocks::qk_norm(p);
  blocks::rope(p, /*local=*/false);
  if (!blocks::write_kv(p)) return;
  blocks::attention(p);
  blocks::output_projection(p);
  blocks::residual_norm(p);
  blocks::gated_mlp(p, blocks::Activation::Silu);
  blocks::end_layer(p);
}

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
    {Role::OBias, "self_attn.o_proj.bias", "attn_output.bias", When::AttentionBias},
    {Role::QNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"},
    {Role::KNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"},
    {Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"},
    {Role::Up, "mlp.up_proj.weight", "ffn_up.weight"},
    {Role::Down, "mlp.down_proj.weight", "ffn_down.weight"},
};

void configure(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.attention_bias = cfgjson::get_bool(j, "attention_bias", source, false);
  c.qk_norm = true;
  cfgjson::require_silu(j, source, c);
}

}  // namespace

const Arch kQwen3 = [] {
  Arch a;
  a.model_type = "qwen3";
  a.gguf_arch = "qwen3";
  a.tensors = kTensors;
  a.configure = configure;
  a.default_windows = qwen_windows;
  a.layer = layer;
  return a;
}();

}  // namespace kvboost::arch
