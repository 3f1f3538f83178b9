// The forward pass: embedding, the layers (each through its architecture's layer function,
// src/model/arch/, over the blocks of blocks.h; streamed matrices bound per layer), the final
// norm and the logits of the requested rows. CacheBlend's selective recompute is blend.cpp.
#include <algorithm>
#include <cmath>
#include <optional>

#include "blocks.h"
#include "layer_stream.h"

namespace kvboost {

using blocks::Rows;
using blocks::Work;

KvCache::KvCache(const ModelConfig& cfg, int64_t capacity)
    : capacity_(capacity), layer_stride_(capacity * cfg.n_kv_heads * cfg.head_dim), n_kv_heads_(cfg.n_kv_heads),
      head_dim_(cfg.head_dim) {
  k_.assign(size_t(layer_stride_ * cfg.n_layers), 0.0f);
  v_.assign(size_t(layer_stride_ * cfg.n_layers), 0.0f);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    k_ptrs_.push_back(k_.data() + l * layer_stride_);
    v_ptrs_.push_back(v_.data() + l * layer_stride_);
  }
}

KvView KvCache::view() const {
  KvView v;
  v.k_pools = k_ptrs_.data();
  v.v_pools = v_ptrs_.data();
  v.block_table = &block0_;
  v.block_size = capacity_;
  v.n_kv_heads = n_kv_heads_, v.head_dim = head_dim_;
  v.n_past = size_;
  return v;
}

void Model::forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits) const {
  if (kv.size() + n > kv.capacity())
    fail("forward: ", kv.size() + n, " tokens exceed the KV cache capacity of ", kv.capacity());
  forward(tokens, n, kv.view(), logits, all_logits);
  kv.set_size(kv.size() + n);
}

namespace blocks {

void rope_table(const std::vector<float>& inv_freq, const Rows& rows, std::vector<float>& cos,
                std::vector<float>& sin) {
  const int64_t half = int64_t(inv_freq.size());
  cos.resize(size_t(rows.size() * half)), sin.resize(size_t(rows.size() * half));
  for (int64_t t = 0; t < rows.size(); ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = float(rows.pos[size_t(t)]) * inv_freq[size_t(i)];
      cos[size_t(t * half + i)] = float(std::cos(double(ang)));
      sin[size_t(t * half + i)] = float(std::sin(double(ang)));
    }
}

// inv_freq_local: empty unless sliding layers use another RoPE base.
void rope_tables(const std::vector<float>& inv_freq, const std::vector<float>& inv_freq_local, const Rows& rows,
                 Work& w) {
  rope_table(inv_freq, rows, w.cos, w.sin);
  if (!inv_freq_local.empty()) rope_table(inv_freq_local, rows, w.cos_local, w.sin_local);
}

void check_tokens(const ModelConfig& c, const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id ", tokens[i], " is outside the vocabulary [0, ", c.vocab_size, ")");
}

const Weight* bind_streamed(const detail::LayerWeights& L, const std::vector<const uint8_t*>& p, Weight* out) {
  const auto src = detail::layer_mats(L);
  for (int i = 0; i < detail::kLayerMats; ++i) {
    out[i] = *src[size_t(i)];
    out[i].data = p[size_t(i)];
  }
  return out;
}

void run_layer(const detail::ModelImpl& m, const ModelConfig& c, int64_t l, const SeqBatch* seqs, const Rows& rows,
               Work& w, const BeforeWrite* before_write, bool kv_only) {
  const detail::LayerWeights& L = m.layers[size_t(l)];
  const Weight* s = w.mats;  // streamed matrices, else the resident ones
  LayerPass p{c,
              l,
              L,
              s ? s[0] : L.wq,
              s ? s[1] : L.wk,
              s ? s[2] : L.wv,
              s ? s[3] : L.wo,
              s ? s[4] : L.w_gate,
              s ? s[5] : L.w_up,
              s ? s[6] : L.w_down,
              seqs,
              rows,
              w,
              before_write,
              kv_only,
              rows.size(),
              float(c.rms_norm_eps)};
  m.arch->layer(p);
}

void embed(const detail::ModelImpl& m, const ModelConfig& c, const int32_t* tokens, int64_t n, float* x) {
  const int64_t H = c.hidden_size;
  // One row at a time: a quantized table is dequantized only for the tokens looked up.
  const size_t row_bytes = size_t(kernels::wtype_row_bytes(m.embed.type, H));
  for (int64_t t = 0; t < n; ++t) {
    if (m.embed.packed)  // a tied table kept only packed (LoadOptions::pack_weights)
      kernels::packed_row(*m.embed.packed, tokens[t], x + t * H);
    else
      kernels::to_f32(static_cast<const uint8_t*>(m.embed.data) + size_t(tokens[t]) * row_bytes, m.embed.type,
                      x + t * H, H);
  }
  if (c.embed_scale != 1.0f)  // gemma3: * sqrt(hidden_size), in f32 as llama.cpp's ggml_scale
    for (int64_t i = 0; i < n * H; ++i) x[i] *= c.embed_scale;
}

}  // namespace blocks

using namespace blocks;

void Model::forward(const int32_t* tokens, int64_t n, const KvView& kv, float* logits, bool all_logits) const {
  if (n <= 0) fail("forward: no tokens");
  SeqBatch s;
  s.tokens = tokens;
  s.n = n;
  s.kv = kv;
  s.logits = logits;
  s.n_logits = all_logits ? n : 1;
  forward_batch(&s, 1);
}

void Model::forward_batch(const SeqBatch* in, int64_t n_seqs) const {
  const ModelConfig& c = cfg_;
  Rows rows;
  bool paged_in = false;
  const std::vector<SeqBatch> batch = batch_rows(c, in, n_seqs, rows, &paged_in);
  const SeqBatch* seqs = batch.data();
  const int64_t n = rows.size();
  if (n == 0) return;
  const detail::ModelImpl& mi = *impl_;
  Work w;
  w.resize(c, n, paged_in);
  embed_batch(mi, c, seqs, n_seqs, rows, w);
  std::optional<stream::LayerStreamer::Pass> pass;  // streaming: one pass over every layer
  if (mi.stream) pass.emplace(*mi.stream);
  Weight mats[detail::kLayerMats];
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (pass) w.mats = bind_streamed(mi.layers[size_t(l)], pass->acquire(l), mats);
    run_layer(mi, c, l, seqs, rows, w, nullptr);
    if (pass) pass->release();
  }
  w.mats = nullptr;
  pass.reset();  // the next pass may start while the logits are computed
  batch_logits(mi, c, seqs, n_seqs, w);
}

namespace blocks {

std::vector<SeqBatch> batch_rows(const ModelConfig& c, const SeqBatch* in, int64_t n_seqs, Rows& rows, bool* paged_in) {
  std::vector<SeqBatch> batch(in, in + std::max<int64_t>(0, n_seqs));  // views with the model's row width
  for (int64_t s = 0; s < n_seqs; ++s) {
    SeqBatch& b = batch[size_t(s)];
    if (b.n <= 0) fail("forward: sequence ", s, " of the batch has no tokens");
    b.kv = model_view(c, b.kv, s);
    check_tokens(c, b.tokens, b.n);
    for (int64_t i = 0; i < b.n; ++i) {
      const int64_t p = b.positions ? b.positions[i] : b.kv.n_past + i;
      if (b.positions && i > 0 && p <= b.positions[i - 1])
        fail("forward: positions of sequence ", s, " are not increasing at index ", i);
      rows.add(s, p);
    }
    *paged_in = *paged_in || b.kv.pager.active();
  }
  return batch;
}

void embed_batch(const detail::ModelImpl& mi, const ModelConfig& c, const SeqBatch* seqs, int64_t n_seqs,
                 const Rows& rows, Work& w) {
  const int64_t H = c.hidden_size;
  for (int64_t s = 0, row = 0; s < n_seqs; row += seqs[s].n, ++s)
    embed(mi, c, seqs[s].tokens, seqs[s].n, &w.x[size_t(row * H)]);
  rope_tables(mi.inv_freq, mi.inv_freq_local, rows, w);
}

void batch_logits(const detail::ModelImpl& mi, const ModelConfig& c, const SeqBatch* seqs, int64_t n_seqs,
                  const Work& w) {
  const int64_t H = c.hidden_size;
  // Logits: the requested rows of every sequence in one matmul.
  std::vector<int64_t> src;
  for (int64_t s = 0, row = 0; s < n_seqs; row += seqs[s].n, ++s)
    if (seqs[s].logits)
      for (int64_t i = seqs[s].n - std::clamp<int64_t>(seqs[s].n_logits, 0, seqs[s].n); i < seqs[s].n; ++i)
        src.push_back(row + i);
  if (src.empty()) return;
  const int64_t m = int64_t(src.size());
  std::vector<float> xs(size_t(m * H));
  for (int64_t i = 0; i < m; ++i) w.residual_row(src[size_t(i)], H, &xs[size_t(i * H)]);  // the last layer's add, for these rows only
  kernels::rms_norm(xs.data(), mi.final_norm_store.data(), xs.data(), m, H, float(c.rms_norm_eps));
  const bool direct = n_seqs == 1;  // one sequence: straight into its buffer
  std::vector<float> out(direct ? 0 : size_t(m * c.vocab_size));
  float* y = direct ? seqs[0].logits : out.data();
  linear(xs.data(), mi.lm_head, nullptr, y, m);
  if (direct) return;
  for (int64_t s = 0, i = 0; s < n_seqs; ++s) {
    if (!seqs[s].logits) continue;
    const int64_t k = std::clamp<int64_t>(seqs[s].n_logits, 0, seqs[s].n);
    std::memcpy(seqs[s].logits, &out[size_t(i * c.vocab_size)], size_t(k * c.vocab_size) * sizeof(float));
    i += k;
  }
}

}  // namespace blocks

}  // namespace kvboost
