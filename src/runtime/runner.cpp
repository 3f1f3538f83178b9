// The model runner (runner.h): plan rows -> SeqBatch / KvView -> Model::forward_batch and
// Model::forward_blend.
#include "runner.h"

#include <algorithm>

namespace kvboost {

ModelRunner::ModelRunner(const Model& model, kv::KvCacheManager& kv, kv::PagedKvStorage& store, bool cold_tier)
    : model_(model), kv_(kv), store_(store), cold_(cold_tier) {}

KvView ModelRunner::view(kv::SeqId seq, int64_t n_past) const {
  KvView v;
  static_cast<kv::KvLayout&>(v) = store_.layout(kv_.block_table(seq).data());
  v.n_past = n_past;
  // Half the hot pool per attention range leaves room for the blocks being written.
  if (cold_) v.pager = kv::Pager(kv_, seq, std::max<int64_t>(1, store_.n_blocks() / 2));
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
