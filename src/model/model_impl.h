// What a Model holds behind its handle (kvboost/model.h keeps only the config and this): the
// bound weights, the architecture, RoPE tables and the optional layer streamer. Filled by
// load.cpp (binding) and prepare.cpp (head quantization, packing, prefault, streaming); read
// by forward.cpp and blend.cpp.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "arch.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"

namespace kvboost {
namespace stream {
class LayerStreamer;
}

namespace detail {

// One decoder layer's weights; a vector is empty when the architecture (or config) has no
// such tensor.
struct LayerWeights {
  std::vector<float> attn_norm, mlp_norm, q_norm, k_norm, q_bias, k_bias, v_bias, o_bias;
  std::vector<float> post_attn_norm, post_mlp_norm;  // sandwich norms (gemma3)
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t window = 0;  // sliding-window size, 0 = full attention
};

// The matrices a layer streams, in the order the streamer is given them.
constexpr int kLayerMats = 7;
inline std::array<Weight*, kLayerMats> layer_mats(LayerWeights& L) {
  return {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
}
inline std::array<const Weight*, kLayerMats> layer_mats(const LayerWeights& L) {
  return {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
}
constexpr arch::Role kLayerMatRoles[kLayerMats] = {arch::Role::Wq, arch::Role::Wk,   arch::Role::Wv,
                                                   arch::Role::Wo, arch::Role::Gate, arch::Role::Up,
                                                   arch::Role::Down};

struct ModelImpl {
  const arch::Arch* arch = nullptr;
  std::string dir;
  WeightFiles files;
  Weight embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm_store;
  std::vector<uint8_t> lm_head_store;  // the head quantized at load (head_quant), or empty
  // LoadOptions::pack_weights: the packed copies the Weights' `packed` point at.
  std::vector<std::unique_ptr<kernels::PackedWeight>> packed;
  std::vector<float> inv_freq;        // [head_dim / 2]
  std::vector<float> inv_freq_local;  // sliding layers' (rope_local_theta), or empty
  std::unique_ptr<stream::LayerStreamer> stream;  // null: every layer resident
  uint64_t resident_bytes = 0;
  ~ModelImpl();
};

// ---- weight binding (load.cpp) ----
kernels::WType wtype_of(const TensorInfo& t);
// By shape and type: streamed layers (data bound per pass) count the same as resident ones.
inline size_t matrix_bytes(const Weight& w) {
  return size_t(w.rows) * size_t(kernels::wtype_row_bytes(w.type, w.cols));
}

// ---- weight preparation (prepare.cpp), in the order load runs them ----
// LoadOptions::head_quant: the head converted into blocks the quantized matmul reads.
void quantize_head(ModelImpl& m, const LoadOptions& opt, bool awq);
// LoadOptions::weight_budget: plans the layer streamer (no-op when every layer fits).
void setup_streaming(ModelImpl& m, const ModelConfig& c, const LoadOptions& opt);
// LoadOptions::pack_weights: returns the bytes packed.
size_t pack_weights(ModelImpl& m, const LoadOptions& opt);
// LoadOptions::prefault: touches what stays read in the stored layout.
void prefault(const ModelImpl& m, const LoadOptions& opt, size_t packed_bytes);
// Gives back the memory of an untied float head that quantize_head replaced.
void drop_float_head(ModelImpl& m, const ModelConfig& c, const void* float_head);

// Hugging Face's inv_freq, in float32 as torch computes it, with llama3 / linear scaling.
std::vector<float> compute_inv_freq(const ModelConfig& c, double theta);

}  // namespace detail
}  // namespace kvboost
