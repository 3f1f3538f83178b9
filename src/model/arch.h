// The architectures the decoder runs, each a descriptor defined in its own file under
// src/model/arch/ (llama.cpp's src/models/<arch>.cpp shape): the config.json / GGUF metadata it
// reads beyond the shared fields, its per-layer tensor-name table (Hugging Face safetensors
// names and GGUF names), and its decoder layer built from the shared blocks of blocks.h.
// docs/architecture.md "Adding an architecture" lists the steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/model.h"

namespace kvboost {
namespace gguf {
class File;
}
namespace blocks {
struct LayerPass;
}

namespace arch {

// What a per-layer tensor is to the decoder (detail::LayerWeights has one member per role).
enum class Role : uint8_t {
  AttnNorm,      // [H]  RMSNorm before attention
  PostAttnNorm,  // [H]  RMSNorm of the attention output (sandwich norms)
  MlpNorm,       // [H]  RMSNorm before the MLP
  PostMlpNorm,   // [H]  RMSNorm of the MLP output (sandwich norms)
  Wq, Wk, Wv, Wo,              // [n_heads*hd, H], [n_kv*hd, H], [n_kv*hd, H], [H, n_heads*hd]
  QBias, KBias, VBias, OBias,  // [n_heads*hd], [n_kv*hd], [n_kv*hd], [H]
  QNorm, KNorm,                // [hd]  per-head RMSNorm of q and k before RoPE
  Gate, Up, Down,              // [I, H], [I, H], [H, I]
};

// Whether a table entry is bound: always, or only when config.attention_bias says so.
enum class When : uint8_t { Always, AttentionBias };

// One per-layer tensor: model.layers.N.<hf> in safetensors, blk.N.<gguf> in GGUF files.
// Bound in table order (the first missing one is the one an error names).
struct LayerTensor {
  Role role;
  const char* hf;
  const char* gguf;
  When when = When::Always;
};

struct Arch {
  const char* model_type;        // config.json model_type (ModelConfig::model_type)
  const char* alias = nullptr;   // another model_type spelling that means this one
  const char* gguf_arch = nullptr;  // GGUF general.architecture; nullptr: no GGUF files of its own
  bool tie_default = false;      // tie_word_embeddings when config.json does not say
  // llama.cpp's converter permuted the Q/K rows (and biases) of this architecture's GGUF files
  // for its interleaved RoPE (see gguf_model.cpp).
  bool gguf_permuted_qk = false;
  // The GGUF norms already hold the offset ModelConfig::norm_weight_offset would add (Gemma's
  // 1 + w is stored by the converter).
  bool gguf_norms_offset_applied = false;
  std::vector<LayerTensor> tensors;
  // Checks on the raw config.json before the shared fields are read (optional).
  void (*check_json)(const nlohmann::json& j, const std::string& source) = nullptr;
  // The architecture's fields after the shared ones are read: attention_bias, qk_norm,
  // hidden_act and anything of its own (required).
  void (*configure)(const nlohmann::json& j, const std::string& source, ModelConfig& c) = nullptr;
  // Per-layer sliding windows when config.json has no layer_types (window: its sliding_window,
  // 0 when absent; layer_window arrives all 0). Optional: no sliding layers.
  void (*default_windows)(const nlohmann::json& j, const std::string& source, int64_t window,
                          ModelConfig& c) = nullptr;
  // GGUF metadata beyond the shared keys, as the config.json fields configure() reads (optional).
  void (*gguf_config)(const gguf::File& f, nlohmann::json& j) = nullptr;
  // One decoder layer over a pass's rows (required).
  void (*layer)(blocks::LayerPass& p) = nullptr;
};

// Every architecture, in supported_model_types() order (src/model/arch/registry.cpp).
const std::vector<const Arch*>& all();
// By model_type or alias; nullptr when none.
const Arch* find(const std::string& model_type);
// By GGUF general.architecture; Error naming the file and the supported values otherwise.
const Arch& find_gguf(const std::string& gguf_arch, const std::string& path);
// The table entry of a role; nullptr when the architecture has no such tensor.
const LayerTensor* tensor(const Arch& a, Role r);

// The descriptors (one per file under src/model/arch/).
extern const Arch kLlama, kMistral, kQwen2, kQwen3, kGemma3;

// The Llama layer (norm, attention, norm, SwiGLU MLP), shared by the architectures that differ
// from llama only in their tensors and config (mistral, qwen2).
void llama_layer(blocks::LayerPass& p);

}  // namespace arch

// config.json helpers shared by config.cpp and the architecture files (errors name source,
// field and value).
namespace cfgjson {
int64_t get_int(const nlohmann::json& j, const char* key, const std::string& source,
                std::optional<int64_t> def = std::nullopt, int64_t min_value = 1);
double get_num(const nlohmann::json& j, const char* key, const std::string& source, double def);
bool get_bool(const nlohmann::json& j, const char* key, const std::string& source, bool def);
std::string get_str(const nlohmann::json& j, const char* key, const std::string& source, const std::string& def);
// hidden_act must be silu (the SwiGLU families).
void require_silu(const nlohmann::json& j, const std::string& source, ModelConfig& c);
}  // namespace cfgjson

}  // namespace kvboost
