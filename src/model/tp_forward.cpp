// Tensor-parallel forward on the shared blocks (kvboost/model.h TpShard; Megatron-LM's split:
// Shoeybi et al. 2019, section 3). Per layer, each rank runs its architecture's own layer
// function (arch/*.cpp, built from the blocks of blocks.h) on its shard — its heads' Q/K/V rows
// and Wo columns, its slice of gate/up rows and down columns — and the two row-parallel
// projections (O, down) produce partial sums that the blocks complete with comm.all_reduce_sum
// (LayerPass::tp) before they join the residual stream. Every other step (norms, residual adds,
// the head) is replicated, so all ranks keep identical activations.
#include <cstring>
#include <optional>

#include "blocks.h"
#include "kvboost/dist.h"
#include "layer_stream.h"

namespace kvboost {

namespace detail {

// A TP group's pass over a layer-streamed model (TpShard::create_group): rank 0's
// LayerStreamer::Pass and the slot of the layer it acquired, read by every rank between the
// barriers of ShardLayers.
struct TpFeed {
  std::optional<stream::LayerStreamer::Pass> pass;
  const std::vector<const uint8_t*>* slot = nullptr;
};

}  // namespace detail

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

// Rows [r0, r1) x columns [c0, c1) as a shape only (a streamed layer's bytes come per pass).
Weight slice_shape(const Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const char* name, int64_t l) {
  tp_slice_bytes(w.type, w.cols, r0, r1, c0, c1, "layer " + std::to_string(l) + " " + name);  // its Errors
  Weight s = w;
  s.data = nullptr;
  s.rows = r1 - r0;
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
  if (m.impl_->stream)
    fail("tensor parallel: the model is layer-streamed (LoadOptions::weight_budget): its shards share the streamer "
         "(TpShard::create_group, ranks as threads of one process) or it loads resident");
  return make(m, rank, world, nullptr);
}

std::vector<std::unique_ptr<TpShard>> TpShard::create_group(const Model& m, int world) {
  tp_plan(m.config(), 0, world);  // its Errors before any shard
  const auto feed = m.impl_->stream ? std::make_shared<detail::TpFeed>() : nullptr;
  std::vector<std::unique_ptr<TpShard>> out;
  for (int r = 0; r < world; ++r) out.push_back(make(m, r, world, feed));
  return out;
}

std::unique_ptr<TpShard> TpShard::make(const Model& m, int rank, int world, std::shared_ptr<detail::TpFeed> feed) {
  const ModelConfig& c = m.config();
  const detail::ModelImpl& mi = *m.impl_;
  const TpPlan plan = tp_plan(c, rank, world);
  std::unique_ptr<TpShard> t(new TpShard());
  t->model_ = &m;
  t->rank_ = rank;
  t->world_ = world;
  t->cfg_ = plan.config;
  t->plan_ = plan;
  t->feed_ = std::move(feed);
  const bool streamed = mi.stream != nullptr;
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
    // Streamed: the shapes only, the bytes are bound per pass (ShardLayers).
    const auto rows = [&](const Weight& w, int64_t r0, int64_t r1, const char* name) {
      return streamed ? slice_shape(w, r0, r1, 0, w.cols, name, l) : row_slice(w, r0, r1);
    };
    const auto cols = [&](const Weight& w, int64_t c0, int64_t c1, size_t store, const char* name) {
      return streamed ? slice_shape(w, 0, w.rows, c0, c1, name, l) : col_slice(w, c0, c1, t->store_[store], name, l);
    };
    S.wq = rows(L.wq, q0, q1, "q_proj");
    S.wk = rows(L.wk, k0, k1, "k_proj");
    S.wv = rows(L.wv, k0, k1, "v_proj");
    S.wo = cols(L.wo, q0, q1, size_t(2 * l), "o_proj");
    S.w_gate = rows(L.w_gate, i0, i1, "gate_proj");
    S.w_up = rows(L.w_up, i0, i1, "up_proj");
    S.w_down = cols(L.w_down, i0, i1, size_t(2 * l + 1), "down_proj");
    t->layers_.push_back(std::move(S));
  }
  return t;
}

namespace {

// Layer l of a shard over `rows`: the architecture's own layer function (arch/*.cpp) on the
// shard's weights and shapes, with LayerPass::tp set, so that the blocks all-reduce the O and
// down projections' partial sums. before_write / kv_only as blocks::LayerPass (kv_only: the
// layer stops after the K/V write, before any all-reduce).
void tp_layer(const detail::ModelImpl& mi, const ModelConfig& cfg, const detail::LayerWeights& L, const Weight* m,
              int64_t l, const SeqBatch* s, const blocks::Rows& rows, blocks::Work& w,
              const blocks::BeforeWrite* before_write, bool kv_only, dist::Comm& comm) {
  blocks::LayerPass p{cfg, l, L, m[0], m[1], m[2], m[3], m[4], m[5], m[6], s, rows, w, before_write, kv_only,
                      rows.size(), float(cfg.rms_norm_eps)};
  p.tp = &comm;
  mi.arch->layer(p);
}

// The weights of one pass over a shard's layers, in order: the resident slices, or for a
// streamed model (the group's TpFeed) each layer's slices of the slot rank 0 acquired for the
// group. bind(l) returns layer l's seven matrices (detail::layer_mats order); done() after the
// layer's last use. Rank 0 acquires between barriers so no rank reads a slot before it is read
// and none sees it released before all are done; its Pass drains what a failed pass left.
class ShardLayers {
 public:
  ShardLayers(const detail::ModelImpl& mi, const std::vector<detail::LayerWeights>& layers, const TpPlan& plan,
              detail::TpFeed* feed, dist::Comm& comm)
      : mi_(mi), layers_(layers), plan_(plan), feed_(feed), comm_(comm) {
    if (feed_ && comm_.rank() == 0) feed_->pass.emplace(*mi_.stream);
  }
  ~ShardLayers() {
    if (feed_ && comm_.rank() == 0) feed_->slot = nullptr, feed_->pass.reset();
  }
  ShardLayers(const ShardLayers&) = delete;
  ShardLayers& operator=(const ShardLayers&) = delete;

  const Weight* bind(int64_t l) {
    const detail::LayerWeights& S = layers_[size_t(l)];
    const auto shard = detail::layer_mats(S);
    for (int i = 0; i < detail::kLayerMats; ++i) mats_[i] = *shard[size_t(i)];
    if (!feed_) return mats_;
    if (comm_.rank() == 0) feed_->slot = &feed_->pass->acquire(l);
    comm_.barrier();  // the slot is read
    const std::vector<const uint8_t*>& p = *feed_->slot;
    const auto full = detail::layer_mats(mi_.layers[size_t(l)]);
    const int64_t row0[detail::kLayerMats] = {plan_.q0, plan_.k0, plan_.k0, 0, plan_.i0, plan_.i0, 0};
    for (int i = 0; i < detail::kLayerMats; ++i)
      mats_[i].data = p[size_t(i)] + size_t(row0[i]) * size_t(kernels::wtype_row_bytes(full[size_t(i)]->type, full[size_t(i)]->cols));
    cols(3, *full[3], plan_.q0, plan_.q1, p[3], "o_proj", l);
    cols(6, *full[6], plan_.i0, plan_.i1, p[6], "down_proj", l);
    return mats_;
  }
  void done() {
    if (!feed_) return;
    comm_.barrier();  // every rank is done with the slot
    if (comm_.rank() == 0) feed_->slot = nullptr, feed_->pass->release();
  }

 private:
  void cols(int i, const Weight& full, int64_t c0, int64_t c1, const uint8_t* src, const char* name, int64_t l) {
    std::vector<uint8_t>& buf = buf_[i == 3 ? 0 : 1];
    const std::string what = "layer " + std::to_string(l) + " " + name;
    buf.resize(tp_slice_bytes(full.type, full.cols, 0, full.rows, c0, c1, what));
    tp_copy_slice(src, full.type, full.cols, 0, full.rows, c0, c1, buf.data(), what);
    mats_[i].data = buf.data();
  }
  const detail::ModelImpl& mi_;
  const std::vector<detail::LayerWeights>& layers_;
  const TpPlan& plan_;
  detail::TpFeed* feed_;
  dist::Comm& comm_;
  Weight mats_[detail::kLayerMats];
  std::vector<uint8_t> buf_[2];  // the rank's columns of Wo and down
};

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
  {
    ShardLayers ws(mi, layers_, plan_, feed_.get(), comm);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      tp_layer(mi, cfg_, layers_[size_t(l)], ws.bind(l), l, &s, rows, w, nullptr, false, comm);
      ws.done();
    }
  }
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
  const SeqBatch* seqs = batch.data();
  if (rows.size() == 0) return;
  const detail::ModelImpl& mi = *model_->impl_;
  blocks::Work w;
  w.resize(cfg_, rows.size(), paged_in);
  blocks::embed_batch(mi, cfg_, seqs, n_seqs, rows, w);
  {
    ShardLayers ws(mi, layers_, plan_, feed_.get(), comm);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      tp_layer(mi, cfg_, layers_[size_t(l)], ws.bind(l), l, seqs, rows, w, nullptr, false, comm);
      ws.done();
    }
  }
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
  ShardLayers ws(mi, layers_, plan_, feed_.get(), comm);
  for (int64_t l = 0; l < check; ++l) {
    tp_layer(mi, cfg_, layers_[size_t(l)], ws.bind(l), l, &seq, rows, w, nullptr, false, comm);
    ws.done();
  }
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
    const Weight* m = ws.bind(l);
    if (sched.selects_at(l, n_kept)) {
      measured_layer = l;
      tp_layer(mi, cfg_, L, m, l, &seq, rows, w, &measure, /*kv_only=*/true, comm);
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
    tp_layer(mi, cfg_, L, m, l, &seq, rows, w, nullptr, false, comm);
    ws.done();
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
