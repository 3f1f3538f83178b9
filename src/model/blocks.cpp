// The shared decoder blocks (blocks.h). Each is the same kernel calls, in the same order, that
// the one flag-driven decoder made before the per-architecture split: logits are bit-identical.
#include "blocks.h"

#include "kvboost/dist.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvboost::blocks {

namespace {
const float* bias(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

}  // namespace

KvView model_view(const ModelConfig& c, const KvView& kv, int64_t seq) {
  KvView v = kv;
  if (v.n_kv_heads == 0 && v.head_dim == 0) v.n_kv_heads = c.n_kv_heads, v.head_dim = c.head_dim;
  if (v.n_kv_heads != c.n_kv_heads || v.head_dim != c.head_dim)
    fail("forward: the K/V view of sequence ", seq, " has rows of ", v.n_kv_heads, " heads x ", v.head_dim,
         " but the model's are ", c.n_kv_heads, " x ", c.head_dim);
  if (!v.k_pools || !v.v_pools || !v.block_table || v.block_size <= 0)
    fail("forward: the K/V view of sequence ", seq, " has no pools, no block table or block size ", v.block_size);
  return v;
}

void Work::resize(const ModelConfig& c, int64_t n, bool paged_in) {
  const int64_t H = c.hidden_size, nq = c.n_heads * c.head_dim, nkv = c.n_kv_heads * c.head_dim;
  x.resize(size_t(n * H)), h.resize(size_t(n * H)), q.resize(size_t(n * nq));
  k.resize(size_t(n * nkv)), v.resize(size_t(n * nkv)), att.resize(size_t(n * nq));
  gate.resize(size_t(n * c.intermediate_size)), up.resize(size_t(n * c.intermediate_size));
  cos.resize(size_t(n * c.head_dim / 2)), sin.resize(size_t(n * c.head_dim / 2));
  if (paged_in) part.resize(size_t(n * nq)), lse.resize(size_t(n * c.n_heads)), lse_part.resize(lse.size());
}

void input_norm(LayerPass& p) {
  Work& w = p.w;
  const int64_t H = p.c.hidden_size;
  if (w.pending) kernels::add_rms_norm(w.x.data(), w.h.data(), p.L.attn_norm.data(), w.h.data(), p.n, H, p.eps);
  else kernels::rms_norm(w.x.data(), p.L.attn_norm.data(), w.h.data(), p.n, H, p.eps);
  w.pending = false;
}

void qkv_projection(LayerPass& p) {
  Work& w = p.w;
  if (!p.kv_only) linear(w.h.data(), p.wq, bias(p.L.q_bias), w.q.data(), p.n);
  linear(w.h.data(), p.wk, bias(p.L.k_bias), w.k.data(), p.n);
  linear(w.h.data(), p.wv, bias(p.L.v_bias), w.v.data(), p.n);
}

void qk_norm(LayerPass& p) {
  Work& w = p.w;
  const int64_t hd = p.c.head_dim;
  if (!p.kv_only) kernels::rms_norm(w.q.data(), p.L.q_norm.data(), w.q.data(), p.n * p.c.n_heads, hd, p.eps);
  kernels::rms_norm(w.k.data(), p.L.k_norm.data(), w.k.data(), p.n * p.c.n_kv_heads, hd, p.eps);
}

void rope(LayerPass& p, bool local) {
  Work& w = p.w;
  const bool use_local = local && p.L.window > 0 && !w.cos_local.empty();
  const float* cos = use_local ? w.cos_local.data() : w.cos.data();
  const float* sin = use_local ? w.sin_local.data() : w.sin.data();
  if (!p.kv_only) kernels::rope_rotate_half(w.q.data(), cos, sin, p.n, p.c.n_heads, p.c.head_dim);
  kernels::rope_rotate_half(w.k.data(), cos, sin, p.n, p.c.n_kv_heads, p.c.head_dim);
}

bool write_kv(LayerPass& p) {
  Work& w = p.w;
  if (p.before_write) (*p.before_write)(w.k.data(), w.v.data());
  const int64_t nkv = p.c.n_kv_heads * p.c.head_dim, l = p.l;
  for (const Run& r : p.rows.runs) {
    const KvView& kv = p.seqs[r.seq].kv;
    const int64_t bs = kv.block_size;
    // A cold tier: the run's blocks are made resident before the layer writes them.
    const kv::KvLayout dst = kv.pager ? kv.with_table(kv.pager.make_resident(
                                            {r.pos0 / bs, (r.pos0 + r.n - 1) / bs - r.pos0 / bs + 1}))
                                      : kv::KvLayout(kv);
    dst.write_rows(l, r.pos0, r.n, &w.k[size_t(r.row0 * nkv)], &w.v[size_t(r.row0 * nkv)]);
  }
  return !p.kv_only;
}

void attention(LayerPass& p) {
  const ModelConfig& c = p.c;
  Work& w = p.w;
  const int64_t l = p.l, hd = c.head_dim, nq = c.n_heads * hd, window = p.L.window;
  // Gemma 3 scales by 1/sqrt(query_pre_attn_scalar) (llama.cpp gemma3.cpp: f_attention_scale).
  const float scale = 1.0f / std::sqrt(float(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(hd)));
  for (const Run& r : p.rows.runs) {
    const KvView& kv = p.seqs[r.seq].kv;
    const int64_t bs = kv.block_size, end = r.pos0 + r.n;
    float* att = &w.att[size_t(r.row0 * nq)];
    const float* q = &w.q[size_t(r.row0 * nq)];
    if (!kv.pager) {
      kernels::paged_attention(q, kv.k_pool(l), kv.v_pool(l), kv.block_table, att, r.n, r.pos0, end, bs, c.n_heads,
                               c.n_kv_heads, hd, window, scale);
      continue;
    }
    // K/V in the pager's ranges of blocks, each made resident before use, merged by log-sum-exp.
    float* lse = &w.lse[size_t(r.row0 * c.n_heads)];
    float* part = &w.part[size_t(r.row0 * nq)];
    float* lse_part = &w.lse_part[size_t(r.row0 * c.n_heads)];
    const int64_t n_blocks = (end + bs - 1) / bs, n_ranges = kv.pager.n_ranges(n_blocks);
    std::fill(lse, lse + r.n * c.n_heads, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n_ranges; ++i) {
      const kv::BlockRange br = kv.pager.range(l, i, n_blocks);
      const int64_t k0 = br.first * bs, k1 = std::min(end, (br.first + br.n) * bs);
      if (window > 0 && k1 <= r.pos0 - window + 1) continue;  // outside every query's window
      const int32_t* table = kv.pager.make_resident(br);
      kernels::paged_attention_lse(q, kv.k_pool(l), kv.v_pool(l), table + br.first, part, lse_part, r.n,
                                   r.pos0 - k0, k1 - k0, bs, c.n_heads, c.n_kv_heads, hd, window, scale);
      kernels::attention_merge(att, lse, part, lse_part, r.n * c.n_heads, hd);
    }
  }
}

void output_projection(LayerPass& p) {
  linear(p.w.att.data(), p.wo, bias(p.L.o_bias), p.w.h.data(), p.n);
  if (p.tp) p.tp->all_reduce_sum(p.w.h.data(), p.n * p.c.hidden_size);  // the rank's heads' share of O
}

void post_norm(LayerPass& p, const std::vector<float>& weight) {
  kernels::rms_norm(p.w.h.data(), weight.data(), p.w.h.data(), p.n, p.c.hidden_size, p.eps);
}

void residual_norm(LayerPass& p) {
  Work& w = p.w;
  kernels::add_rms_norm(w.x.data(), w.h.data(), p.L.mlp_norm.data(), w.h.data(), p.n, p.c.hidden_size, p.eps);
}

void gated_mlp(LayerPass& p, Activation act) {
  Work& w = p.w;
  const int64_t I = p.c.intermediate_size;
  linear(w.h.data(), p.w_gate, nullptr, w.gate.data(), p.n);
  linear(w.h.data(), p.w_up, nullptr, w.up.data(), p.n);
  if (act == Activation::GeluTanh)
    kernels::gelu_tanh_mul(w.gate.data(), w.up.data(), w.gate.data(), p.n * I);
  else
    kernels::silu_mul(w.gate.data(), w.up.data(), w.gate.data(), p.n * I);
  linear(w.gate.data(), p.w_down, nullptr, w.h.data(), p.n);
  if (p.tp) p.tp->all_reduce_sum(w.h.data(), p.n * p.c.hidden_size);  // its intermediate slice's share of down
}

}  // namespace kvboost::blocks
