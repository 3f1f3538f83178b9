// The layer tensors of the device weight layout and their tensor-parallel slices
// (layer_entries.h; every build).
#include "layer_entries.h"

#include "../model/arch.h"

namespace kvboost::gpu::dev {

std::vector<LayerEntry> layer_entries(const ModelConfig& c, int64_t l, const TpPlan* tp) {
  using arch::Role;
  const arch::Arch* a = arch::find(c.model_type);
  if (!a) fail("GPU decoder: model_type \"", c.model_type, "\" has no architecture");
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  // The rank's ranges (everything at world 1).
  const bool split = tp && tp->world > 1;
  const int64_t q0 = split ? tp->q0 : 0, q1 = split ? tp->q1 : nq, k0 = split ? tp->k0 : 0, k1 = split ? tp->k1 : nkv;
  const int64_t i0 = split ? tp->i0 : 0, i1 = split ? tp->i1 : I;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  std::vector<LayerEntry> out;
  // A slice of rows [r0, r1) and columns [c0, c1) of a [fr, fc] tensor (fc 0: a vector).
  auto add = [&](int id, const std::string& name, int64_t fr, int64_t fc, int64_t r0, int64_t r1, int64_t c0,
                 int64_t c1) { out.push_back({id, name, r1 - r0, c1 - c0, fr, fc, r0, c0}); };
  auto vec = [&](int id, const std::string& name, int64_t n) { add(id, name, n, 0, 0, n, 0, 0); };
  for (const arch::LayerTensor& t : a->tensors) {
    if (t.when == arch::When::AttentionBias && !c.attention_bias) continue;
    const std::string name = p + t.hf;
    switch (t.role) {
      case Role::Wq: add(kWq, name, nq, H, q0, q1, 0, H); break;
      case Role::Wk: add(kWk, name, nkv, H, k0, k1, 0, H); break;
      case Role::Wv: add(kWv, name, nkv, H, k0, k1, 0, H); break;
      case Role::Wo: add(kWo, name, H, nq, 0, H, q0, q1); break;
      case Role::Gate: add(kGate, name, I, H, i0, i1, 0, H); break;
      case Role::Up: add(kUp, name, I, H, i0, i1, 0, H); break;
      case Role::Down: add(kDown, name, H, I, 0, H, i0, i1); break;
      case Role::AttnNorm: vec(kAttnNorm, name, H); break;
      case Role::MlpNorm: vec(kMlpNorm, name, H); break;
      case Role::QNorm: vec(kQNorm, name, hd); break;
      case Role::KNorm: vec(kKNorm, name, hd); break;
      case Role::QBias: add(kQBias, name, nq, 0, q0, q1, 0, 0); break;
      case Role::KBias: add(kKBias, name, nkv, 0, k0, k1, 0, 0); break;
      case Role::VBias: add(kVBias, name, nkv, 0, k0, k1, 0, 0); break;
      case Role::OBias:
        if (!split || tp->o_bias) vec(kOBias, name, H);  // added once: the all-reduce sums every rank's output
        break;
      case Role::PostAttnNorm:
      case Role::PostMlpNorm:
        fail("GPU decoder: model_type ", c.model_type, " has sandwich norms (", t.hf, "), not supported on the GPU yet");
    }
  }
  return out;
}

}  // namespace kvboost::gpu::dev
