// The shared blocks every architecture's decoder layer is built from (src/model/arch/*.cpp):
// norms, Q/K/V projections, q/k norm, RoPE, the K/V write into the caller's paged pools,
// attention, the output projection and the gated MLPs. A layer function calls them in its
// order; each block is the kernels' free functions over the pass's activations (Work).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "model_impl.h"

namespace kvboost::dist {
class Comm;  // kvboost/dist.h
}

namespace kvboost::blocks {

// A contiguous run of positions of one sequence among the rows of a pass: attention is one
// kernel call per run (queries pos0 .. pos0 + n - 1 over keys [0, pos0 + n)).
struct Run {
  int64_t seq, row0, n, pos0;
};

// The token rows one pass computes: which sequence and position each row is.
struct Rows {
  std::vector<int64_t> seq, pos;
  std::vector<Run> runs;
  int64_t size() const { return int64_t(pos.size()); }
  void add(int64_t s, int64_t p) {
    const int64_t r = size();
    seq.push_back(s);
    pos.push_back(p);
    if (!runs.empty() && runs.back().seq == s && runs.back().pos0 + runs.back().n == p)
      ++runs.back().n;
    else
      runs.push_back(Run{s, r, 1, p});
  }
};

// Activations of one pass: x [n, H] is the residual stream; the rest is scratch.
// pending: h holds the last layer's MLP output, not yet added to x. The add is fused into the
// next RMSNorm that reads x (the next layer's input norm, or the final norm of the logit rows:
// kernels::add_rms_norm), which saves a pass over x per layer; residual_row() applies it to the
// rows whose x is read directly.
struct Work {
  std::vector<float> x, h, q, k, v, att, gate, up, cos, sin, part, lse, lse_part;
  bool pending = false;
  std::vector<float> cos_local, sin_local;  // sliding layers with their own RoPE base (gemma3)
  // The current layer's matrices (in layer_mats order) when streamed: they live in a slot of
  // the streamer for this layer only. nullptr: the resident ones of the layer.
  const Weight* mats = nullptr;
  void resize(const ModelConfig& c, int64_t n, bool paged_in);
  // Row r of the residual stream into out [H], with a pending add applied.
  void residual_row(int64_t r, int64_t H, float* out) const {
    const float* xr = &x[size_t(r * H)];
    if (!pending) {
      std::memcpy(out, xr, size_t(H) * sizeof(float));
      return;
    }
    const float* hr = &h[size_t(r * H)];
    for (int64_t i = 0; i < H; ++i) out[i] = xr[i] + hr[i];
  }
};

using BeforeWrite = std::function<void(const float* k, const float* v)>;

// One decoder layer over a pass's rows: what an architecture's layer function works on.
struct LayerPass {
  const ModelConfig& c;
  int64_t l;
  const detail::LayerWeights& L;
  const Weight &wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down;  // streamed or resident
  const SeqBatch* seqs;
  const Rows& rows;
  Work& w;
  // When set, sees the fresh post-RoPE K/V of every row before they overwrite the slots
  // (CacheBlend's deviation check).
  const BeforeWrite* before_write;
  bool kv_only;  // stop after writing K/V (no queries, attention or MLP)
  int64_t n;     // rows
  float eps;
  // Tensor parallelism (TpShard): the layer's weights are one rank's shard, and the row-parallel
  // projections' partial sums are all-reduced over it at the end of output_projection and of
  // gated_mlp, before anything (a residual add, a post norm) reads them. Null: the whole model.
  dist::Comm* tp = nullptr;
};

// y [M, w.rows] = x [M, w.cols] · wᵀ (+ bias [w.rows]), in whichever layout the weight is held.
inline void linear(const float* x, const Weight& w, const float* bias, float* y, int64_t M) {
  if (w.packed) kernels::matmul_packed(x, *w.packed, bias, y, M);
  else kernels::matmul(x, w.data, w.type, bias, y, M, w.rows, w.cols);
}

// h = RMSNorm(x) with the layer's input norm; the previous layer's pending MLP output joins
// the residual stream here, fused with the norm.
void input_norm(LayerPass& p);
// q (unless kv_only), k, v = h · W (+ the biases the layer has).
void qkv_projection(LayerPass& p);
// Per-head RMSNorm of q (unless kv_only) and k (qwen3, gemma3).
void qk_norm(LayerPass& p);
// Rotate-half RoPE of q (unless kv_only) and k at the rows' positions; local: the sliding
// layers' own base (Work::cos_local) when the layer slides and that table exists.
void rope(LayerPass& p, bool local);
// before_write, then every row's K/V into its slot (so that a run attends to rows of earlier
// runs). Returns false when the pass stops here (kv_only).
bool write_kv(LayerPass& p);
// Attention of every run over its sequence's K/V into Work::att; the K/V of a cold tier are
// paged in range by range and merged by log-sum-exp. Scale 1/sqrt(query_pre_attn_scalar or
// head_dim); the layer's sliding window applies.
void attention(LayerPass& p);
// h = att · Wo (+ o bias); summed over the ranks under tensor parallelism.
void output_projection(LayerPass& p);
// h = RMSNorm(h) with `weight` in place (sandwich norms' post norms).
void post_norm(LayerPass& p, const std::vector<float>& weight);
// x += h; h = RMSNorm(x) with the layer's MLP input norm.
void residual_norm(LayerPass& p);
enum class Activation { Silu, GeluTanh };
// h = down(act(gate(h)) * up(h)); summed over the ranks under tensor parallelism.
void gated_mlp(LayerPass& p, Activation act);
// The layer's output h joins the residual stream in the next norm (see Work).
inline void end_layer(LayerPass& p) { p.w.pending = true; }

// ---- the pass around the layers (forward.cpp) ----
void rope_tables(const std::vector<float>& inv_freq, const std::vector<float>& inv_freq_local, const Rows& rows,
                 Work& w);
void check_tokens(const ModelConfig& c, const int32_t* tokens, int64_t n);
// x: [n, hidden] f32 (embedding scale applied).
void embed(const detail::ModelImpl& m, const ModelConfig& c, const int32_t* tokens, int64_t n, float* x);
// Layer l through its architecture's layer function (streamed matrices from Work::mats).
void run_layer(const detail::ModelImpl& m, const ModelConfig& c, int64_t l, const SeqBatch* seqs, const Rows& rows,
               Work& w, const BeforeWrite* before_write, bool kv_only = false);
// A layer's matrices with data in the streamer's slot (shapes and types as bound at load).
const Weight* bind_streamed(const detail::LayerWeights& L, const std::vector<const uint8_t*>& p, Weight* out);

// The pass over a batch of sequences (Model::forward_batch, TpShard::forward_batch): the views
// with `c`'s row width and every sequence's rows (Errors: a sequence without tokens, positions
// not increasing, tokens outside the vocabulary); the embeddings and RoPE tables of the rows;
// the logits each sequence asks for (SeqBatch::logits, n_logits) from the residual stream.
std::vector<SeqBatch> batch_rows(const ModelConfig& c, const SeqBatch* in, int64_t n_seqs, Rows& rows, bool* paged_in);
void embed_batch(const detail::ModelImpl& mi, const ModelConfig& c, const SeqBatch* seqs, int64_t n_seqs,
                 const Rows& rows, Work& w);
void batch_logits(const detail::ModelImpl& mi, const ModelConfig& c, const SeqBatch* seqs, int64_t n_seqs,
                  const Work& w);

// CacheBlend's compaction after a selection (Model::forward_blend, TpShard::forward_blend): the
// rows `keep` marks -- token indices tok[r], positions n_past + tok[r] -- and their residuals
// become the pass's rows, Work (of c's shapes; w.mats kept) and RoPE tables; tok keeps theirs.
void keep_rows(const detail::ModelImpl& mi, const ModelConfig& c, const std::vector<uint8_t>& keep, int64_t n_past,
               std::vector<int64_t>& tok, Rows& rows, Work& w);

// The view with the model's row width filled in (KvView leaves it 0 by default); Error naming
// the sequence when the view was built for another row width.
KvView model_view(const ModelConfig& c, const KvView& kv, int64_t seq);

}  // namespace kvboost::blocks
