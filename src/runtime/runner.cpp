// The model runner (runner.h): plan rows -> SeqBatch / KvView -> Model::forward_batch and
// Model::forward_blend.
#include "runner.h"

#include <algorithm>
#include <cstring>

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

void ModelRunner::copy_in(kv::SeqId seq, const reuse::CopyIn& c, const kv::ChunkShape& shape) {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  const kv::Chunk& ch = *c.chunk;
  const int64_t len = int64_t(ch.tokens.size()), delta = c.begin - ch.pos0, t0 = std::max<int64_t>(0, c.from - c.begin);
  const kv::KvLayout kvl = store_.layout(kv_.block_table(seq).data());
  kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    kv::chunk_get_layer(ch, shape, l, kbuf_.data(), vbuf_.data());
    kvl.write_rows(l, c.begin + t0, len - t0, kbuf_.data() + t0 * nkv, vbuf_.data() + t0 * nkv);
    kvl.rotate_keys(l, c.begin + t0, len - t0, model_.rope_inv_freq(l).data(), delta);
  }
}

void ModelRunner::read_chunk(kv::SeqId seq, int64_t begin, int64_t len, const kv::ChunkShape& shape, kv::Chunk& out) {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  const kv::KvLayout kvl = store_.layout(kv_.block_table(seq).data());
  kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    kvl.read_rows(l, begin, len, kbuf_.data(), vbuf_.data());
    kv::chunk_put_layer(out, shape, l, kbuf_.data(), vbuf_.data());
  }
}

std::vector<float> ModelRunner::snapshot_rows(kv::SeqId seq, std::span<const int64_t> rows) const {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  std::vector<float> out(rows.size() * size_t(cfg.n_layers) * size_t(2 * nkv));
  float* o = out.data();
  const kv::KvLayout lay = store_.layout(kv_.block_table(seq).data());
  for (int64_t p : rows)
    for (int64_t l = 0; l < cfg.n_layers; ++l, o += 2 * nkv) {
      std::memcpy(o, lay.k_row(l, p), size_t(nkv) * sizeof(float));
      std::memcpy(o + nkv, lay.v_row(l, p), size_t(nkv) * sizeof(float));
    }
  return out;
}

float ModelRunner::deviation(kv::SeqId seq, std::span<const int64_t> rows, std::span<const float> snapshot) const {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  const kv::KvLayout lay = store_.layout(kv_.block_table(seq).data());
  const float* cached = snapshot.data();
  double sum = 0;
  int64_t n_terms = 0;
  for (int64_t p : rows) {
    for (int64_t l = 0; l < cfg.n_layers; ++l, cached += 2 * nkv) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* fresh = kv ? lay.v_row(l, p) : lay.k_row(l, p);
        const float* old = cached + kv * nkv;
        double d = 0, f = 0;
        for (int64_t j = 0; j < nkv; ++j) d += double(fresh[j] - old[j]) * double(fresh[j] - old[j]), f += double(fresh[j]) * double(fresh[j]);
        sum += f > 0 ? d / f : 0;
      }
      ++n_terms;
    }
  }
  return float(sum / double(std::max<int64_t>(1, n_terms)));
}

BlendStats ModelRunner::run_blend(const PlannedBlend& b, double* ms) {
  const double t0 = now_ms();
  const BlendStats bs = model_.forward_blend(b.tokens, b.n, view(b.seq, b.n_past), b.opts, b.logits);
  *ms = now_ms() - t0;
  return bs;
}

}  // namespace kvboost
