// The model runner (runner.h): plan rows -> SeqBatch / KvView -> Model::forward_batch and
// Model::forward_blend.
#include "runner.h"

#include <algorithm>

namespace kvboost {

ModelRunner::ModelRunner(const Model& model, kv::KvCacheManager& kv, kv::PagedKvStorage& store, bool cold_tier)
    : model_(model), kv_(kv), store_(store), cold_(cold_tier) {
  for (int64_t l = 0; l < model.config().n_layers; ++l) {
    k_pools_.push_back(store.k_pool(l));
    v_pools_.push_back(store.v_pool(l));
  }
}

KvView ModelRunner::view(kv::SeqId seq, int64_t n_past) const {
  KvView v;
  v.k_pools = k_pools_.data();
  v.v_pools = v_pools_.data();
  v.block_table = kv_.block_table(seq).data();
  v.block_size = store_.block_size();
  v.n_past = n_past;
  if (cold_) {
    // Half the hot pool per attention range leaves room for the blocks being written.
    v.range_blocks = std::max<int64_t>(1, store_.n_blocks() / 2);
    kv::KvCacheManager* kv = &kv_;
    const int64_t n_hot = store_.n_blocks();
    v.page_in = [kv, seq, n_hot](int64_t first, int64_t n) {
      if (!kv->ensure_resident(seq, first, n))
        fail("KV memory exhausted: cannot page in ", n, " blocks (hot pool of ", n_hot, " blocks)");
      return kv->block_table(seq).data();
    };
  }
  return v;
}

double ModelRunner::run_batch(std::vector<PlannedRows>& rows) {
  batch_.assign(rows.size(), SeqBatch{});
  for (size_t i = 0; i < rows.size(); ++i) {
    const PlannedRows& p = rows[i];
    SeqBatch& b = batch_[i];
    b.tokens = p.tokens.data();
    b.n = int64_t(p.tokens.size());
    if (p.decode) {
      b.kv = view(p.seq, p.n_past);
    } else {
      b.positions = p.positions.data();
      b.kv = view(p.seq, 0);
    }
    b.logits = p.logits;
    b.n_logits = p.n_logits;
  }
  const double t0 = now_ms();
  model_.forward_batch(batch_.data(), int64_t(batch_.size()));
  return now_ms() - t0;
}

BlendStats ModelRunner::run_blend(const PlannedBlend& b, double* ms) {
  const double t0 = now_ms();
  const BlendStats bs = model_.forward_blend(b.tokens, b.n, view(b.seq, b.n_past), b.opts, b.logits);
  *ms = now_ms() - t0;
  return bs;
}

}  // namespace kvboost
