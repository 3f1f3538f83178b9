// Tensor-parallel forward on the shared blocks (kvboost/model.h TpShard; Megatron-LM's split:
// Shoeybi et al. 2019, section 3). Per layer, each rank runs its architecture's own layer
// function (arch/*.cpp, built from the blocks of blocks.h) on its shard — its heads' Q/K/V rows
// and Wo columns, its slice of gate/up rows and down columns — and the two row-parallel
// projections (O, down) produce partial sums that the blocks complete with comm.all_reduce_sum
// (LayerPass::tp) before they join the residual stream. Every other step (norms, residual adds,
// the head) is replicated, so all ranks keep identical activations.
#include <cstring>

#include "blocks.h"
#include "kvboost/dist.h"

namespace kvboost {

namespace {

// Rows [r0, r1) of a row-major matrix: a view into the model's bytes.
Weight row_slice(const Weight& w, int64_t r0, int64_t r1) {
  Weight s = w;
  s.data = static_cast<const uint8_t*>(w.data) + size_t(r0) * size_t(kernels::wtype_row_bytes(w.type, w.cols));
  s.rows = r1 - r0;
  return s;
}

// Columns [c0, c1) of every row, copied into `store`.
Weight col_slice(const Weight& w, int64_t c0, int64_t c1, std::vector<uint8_t>& store, const char* name, int64_t l) {
  const std::string what = "layer " + std::to_string(l) + " " + name;
  store.resize(tp_slice_bytes(w.type, w.cols, 0, w.rows, c0, c1, what));
  tp_copy_slice(w.data, w.type, w.cols, 0, w.rows, c0, c1, store.data(), what);
  Weight s = w;
  s.data = store.data();
  s.cols = c1 - c0;
  return s;
}

std::vector<float> vec_slice(const std::vector<float>& v, int64_t a, int64_t b) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + a, v.begin() + b);
}

}  // namespace

TpPlan tp_plan(const ModelConfig& c, int rank, int world) {
  const std::string& mt = c.model_type;
  if (world < 1 || rank < 0 || rank >= world) fail("tensor parallel: rank ", rank, " of world ", world);
  if (mt != "llama" && mt != "mistral" && mt != "qwen2" && mt != "qwen3")
    fail("tensor parallel: model_type \"", mt, "\" is not supported (llama, mistral, qwen2, qwen3)");
  if (c.n_heads % world != 0 || c.n_kv_heads % world != 0)
    fail("tensor parallel: ", c.n_heads, " attention heads and ", c.n_kv_heads, " K/V heads do not split over ", world,
         " ranks (both must be multiples of the world size)");
  if (c.intermediate_size < world)
    fail("tensor parallel: intermediate_size ", c.intermediate_size, " is smaller than the world size ", world);
  TpPlan p;
  p.rank = rank, p.world = world;
  p.config = c;
  const int64_t hd = c.head_dim, nh = c.n_heads / world, nkv = c.n_kv_heads / world;
  p.i0 = c.intermediate_size * rank / world, p.i1 = c.intermediate_size * (rank + 1) / world;
  p.config.n_heads = nh;
  p.config.n_kv_heads = nkv;
  p.config.intermediate_size = p.i1 - p.i0;
  p.q0 = rank * nh * hd, p.q1 = p.q0 + nh * hd, p.k0 = rank * nkv * hd, p.k1 = p.k0 + nkv * hd;
  p.o_bias = rank == 0;
  return p;
}

size_t tp_slice_bytes(kernels::WType type, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                      const std::string& what) {
  const int64_t blk = kernels::wtype_block_elems(type);
  if (r0 < 0 || r1 < r0 || c0 < 0 || c1 < c0 || c1 > cols)
    fail("tensor parallel: ", what, ": rows ", r0, "..", r1, " x columns ", c0, "..", c1, " of a ", cols, "-column matrix");
  if (c0 % blk != 0 || c1 % blk != 0 || cols % blk != 0)
    fail("tensor parallel: ", what, " (", kernels::wtype_name(type), ", blocks of ", blk,
         " columns) cannot be split at columns ", c0, "..", c1, ": use a world size that keeps the split at block boundaries");
  return size_t(r1 - r0) * size_t(kernels::wtype_row_bytes(type, c1 - c0));
}

void tp_copy_slice(const void* src, kernels::WType type, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   void* dst, const std::string& what) {
  tp_slice_bytes(type, cols, r0, r1, c0, c1, what);
  const size_t row = size_t(kernels::wtype_row_bytes(type, cols));
  const size_t off = size_t(kernels::wtype_row_bytes(type, c0)), len = size_t(kernels::wtype_row_bytes(type, c1 - c0));
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (int64_t r = r0; r < r1; ++r) std::memcpy(d + size_t(r - r0) * len, s + size_t(r) * row + off, len);
}

TpShard::~TpShard() = default;

std::unique_ptr<TpShard> TpShard::create(const Model& m, int rank, int world) {
  const ModelConfig& c = m.config();
  const detail::ModelImpl& mi = *m.impl_;
  const TpPlan plan = tp_plan(c, rank, world);
  if (mi.stream) fail("tensor parallel: the model is layer-streamed (LoadOptions::weight_budget); load it resident");
  std::unique_ptr<TpShard> t(new TpShard());
  t->model_ = &m;
  t->rank_ = rank;
  t->world_ = world;
  t->cfg_ = plan.config;
  const int64_t q0 = plan.q0, q1 = plan.q1, k0 = plan.k0, k1 = plan.k1, i0 = plan.i0, i1 = plan.i1;
  t->store_.resize(size_t(2 * c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const detail::LayerWeights& L = mi.layers[size_t(l)];
    for (const Weight* w : detail::layer_mats(L))
      if (w->packed)
        fail("tensor parallel: layer ", l, " holds packed matrices; load the model with LoadOptions::pack_weights = false");
    detail::LayerWeights S = L;  // norms (q/k, sandwich ones too) and the window whole; the rest sliced
    S.q_bias = vec_slice(L.q_bias, q0, q1);
    S.k_bias = vec_slice(L.k_bias, k0, k1);
    S.v_bias = vec_slice(L.v_bias, k0, k1);
    if (!plan.o_bias) S.o_bias.clear();  // added once, on rank 0: the all-reduce sums every rank's output
    S.wq = row_slice(L.wq, q0, q1);
    S.wk = row_slice(L.wk, k0, k1);
    S.wv = row_slice(L.wv, k0, k1);
    S.wo = col_slice(L.wo, q0, q1, t->store_[size_t(2 * l)], "o_proj", l);
    S.w_gate = row_slice(L.w_gate, i0, i1);
    S.w_up = row_slice(L.w_up, i0, i1);
    S.w_down = col_slice(L.w_down, i0, i1, t->store_[size_t(2 * l + 1)], "down_proj", l);
    t->layers_.push_back(std::move(S));
  }
  return t;
}

namespace {

// Layer l of a shard over `rows`: the architecture's own layer function (arch/*.cpp) on the
// shard's weights and shapes, with LayerPass::tp set, so that the blocks all-reduce the O and
// down projections' partial sums. before_write / kv_only as blocks::LayerPass (kv_only: the
// layer stops after the K/V write, before any all-reduce).
void tp_layer(const detail::ModelImpl& mi, const ModelConfig& cfg, const detail::LayerWeights& L, int64_t l,
              const SeqBatch* s, const blocks::Rows& rows, blocks::Work& w, const blocks::BeforeWrite* before_write,
              bool kv_only, dist::Comm& comm) {
  blocks::LayerPass p{cfg, l, L, L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down, s, rows, w, before_write, kv_only,
                      rows.size(), float(cfg.rms_norm_eps)};
  p.tp = &comm;
  mi.arch->layer(p);
}

void check_comm(const dist::Comm& comm, int rank, int world) {
  if (comm.world() != world || comm.rank() != rank)
    fail("tensor parallel: shard ", rank, "/", world, " run with communicator rank ", comm.rank(), "/", comm.world());
}

}  // namespace

void TpShard::forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits,
                      dist::Comm& comm) const {
  check_comm(comm, rank_, world_);
  if (n <= 0) fail("forward: no tokens");
  if (kv.size() + n > kv.capacity())
    fail("forward: ", kv.size() + n, " tokens exceed the KV cache capacity of ", kv.capacity());
  const ModelConfig& full = model_->config();
  const detail::ModelImpl& mi = *model_->impl_;
  const int64_t H = full.hidden_size;
  blocks::check_tokens(full, tokens, n);
  blocks::Rows rows;
  for (int64_t i = 0; i < n; ++i) rows.add(0, kv.size() + i);
  SeqBatch s;
  s.tokens = tokens;
  s.n = n;
  s.kv = kv.view();
  blocks::Work w;
  w.resize(cfg_, n, false);
  blocks::embed(mi, full, tokens, n, w.x.data());
  blocks::rope_tables(mi.inv_freq, mi.inv_freq_local, rows, w);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) tp_layer(mi, cfg_, layers_[size_t(l)], l, &s, rows, w, nullptr, false, comm);
  kv.set_size(kv.size() + n);
  if (!logits) return;
  const int64_t m = all_logits ? n : 1;
  std::vector<float> xs(size_t(m * H));
  for (int64_t i = 0; i < m; ++i) w.residual_row(n - m + i, H, &xs[size_t(i * H)]);
  kernels::rms_norm(xs.data(), mi.final_norm_store.data(), xs.data(), m, H, float(full.rms_norm_eps));
  blocks::linear(xs.data(), mi.lm_head, nullptr, logits, m);
}

void TpShard::forward_batch(const SeqBatch* in, int64_t n_seqs, dist::Comm& comm) const {
  check_comm(comm, rank_, world_);
  blocks::Rows rows;
  bool paged_in = false;
  const std::vector<SeqBatch> batch = blocks::batch_rows(cfg_, in, n_seqs, rows, &paged_in);
  if (paged_in) fail("tensor parallel: K/V in a cold tier are not supported");
  const SeqBatch* seqs = batch.data();
  if (rows.size() == 0) return;
  const detail::ModelImpl& mi = *model_->impl_;
  blocks::Work w;
  w.resize(cfg_, rows.size(), false);
  blocks::embed_batch(mi, cfg_, seqs, n_seqs, rows, w);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) tp_layer(mi, cfg_, layers_[size_t(l)], l, seqs, rows, w, nullptr, false, comm);
  blocks::batch_logits(mi, cfg_, seqs, n_seqs, w);
}

// Model::forward_blend (blend.cpp) on the shard: the same schedule, the rows' deviations summed
// over the ranks' K/V heads before each selection, so every rank keeps the same rows.
BlendStats TpShard::forward_blend(const int32_t* tokens, int64_t n, const KvView& view, const BlendOptions& opt,
                                  float* logits, dist::Comm& comm) const {
  check_comm(comm, rank_, world_);
  if (n <= 0) fail("forward_blend: no tokens");
  const ModelConfig& full = model_->config();
  const detail::ModelImpl& mi = *model_->impl_;
  const int64_t H = full.hidden_size, nkv = cfg_.n_kv_heads * cfg_.head_dim;
  const KvView kv = blocks::model_view(cfg_, view, 0);
  if (kv.pager) fail("forward_blend: K/V in a cold tier are not supported (use selective repair)");
  blocks::check_tokens(full, tokens, n);
  SeqBatch seq;
  seq.kv = kv;
  blocks::Rows rows;
  for (int64_t i = 0; i < n; ++i) rows.add(0, kv.n_past + i);
  blocks::Work w;
  w.resize(cfg_, n, false);
  blocks::embed(mi, full, tokens, n, w.x.data());
  blocks::rope_tables(mi.inv_freq, mi.inv_freq_local, rows, w);
  const BlendSchedule sched(opt, n, cfg_.n_layers);
  const int64_t check = sched.check_layer();
  BlendStats st;
  for (int64_t l = 0; l < check; ++l) tp_layer(mi, cfg_, layers_[size_t(l)], l, &seq, rows, w, nullptr, false, comm);
  std::vector<int64_t> tok(static_cast<size_t>(n));  // token index of each current row
  for (int64_t t = 0; t < n; ++t) tok[size_t(t)] = t;
  int64_t n_kept = sched.n_candidates();
  std::vector<float> sums, dev;  // [rows, 4] this rank's partial sums, then every rank's
  int64_t measured_layer = 0;
  const blocks::BeforeWrite measure = [&](const float* k, const float* v) {
    sums.assign(tok.size() * 4, 0.0f);
    for (size_t r = 0; r < tok.size(); ++r) {
      if (!sched.is_candidate(tok[r])) continue;
      const int64_t p = kv.n_past + tok[r];
      double d[4];
      BlendSchedule::deviation_sums(k + int64_t(r) * nkv, v + int64_t(r) * nkv, kv.k_row(measured_layer, p),
                                    kv.v_row(measured_layer, p), nkv, d);
      for (int i = 0; i < 4; ++i) sums[r * 4 + size_t(i)] = float(d[i]);
    }
  };
  st.n_full_layers = check;
  for (int64_t l = check; l < cfg_.n_layers; ++l) {
    const detail::LayerWeights& L = layers_[size_t(l)];
    if (sched.selects_at(l, n_kept)) {
      measured_layer = l;
      tp_layer(mi, cfg_, L, l, &seq, rows, w, &measure, /*kv_only=*/true, comm);
      comm.all_reduce_sum(sums.data(), int64_t(sums.size()));
      dev.assign(tok.size(), 0.0f);
      for (size_t r = 0; r < tok.size(); ++r) {
        const double d[4] = {sums[r * 4], sums[r * 4 + 1], sums[r * 4 + 2], sums[r * 4 + 3]};
        if (sched.is_candidate(tok[r])) dev[r] = BlendSchedule::deviation_of_sums(d);
      }
      int64_t n_sel = 0;
      blocks::keep_rows(mi, cfg_, sched.select(l, tok, dev, &n_sel), kv.n_past, tok, rows, w);
      n_kept = n_sel;
    }
    tp_layer(mi, cfg_, L, l, &seq, rows, w, nullptr, false, comm);
    st.n_row_layers += rows.size();
  }
  st.n_selected = n_kept;
  st.n_rows_late = rows.size();
  std::vector<float> last(static_cast<size_t>(H)), normed(static_cast<size_t>(H));
  w.residual_row(rows.size() - 1, H, last.data());
  kernels::rms_norm(last.data(), mi.final_norm_store.data(), normed.data(), 1, H, float(full.rms_norm_eps));
  blocks::linear(normed.data(), mi.lm_head, nullptr, logits, 1);
  return st;
}

}  // namespace kvboost
