// The model runner under tensor parallelism (runner.h, tp_ranks.h): each method on every rank
// at once. The K/V of a row are split by heads: rank r holds columns [plan.k0, plan.k1) of the
// whole row of n_kv_heads * head_dim, so a chunk's rows are scattered to the ranks by columns on
// the way in and gathered from them on the way out, and what the chunk store keeps is the same
// as without TP.
#include <algorithm>
#include <cstring>

#include "runner.h"

namespace kvboost {

namespace {

// Columns [c0, c1) of n rows of `width` floats, densely into dst [n, c1 - c0].
void take_cols(const float* src, int64_t n, int64_t width, int64_t c0, int64_t c1, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * (c1 - c0), src + i * width + c0, size_t(c1 - c0) * sizeof(float));
}

// The reverse: src [n, c1 - c0] into columns [c0, c1) of dst's rows of `width`.
void put_cols(const float* src, int64_t n, int64_t width, int64_t c0, int64_t c1, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width + c0, src + i * (c1 - c0), size_t(c1 - c0) * sizeof(float));
}

// A cold tier under TP: the ranks' pagers meet at the rank's barrier (kv::PagerSync).
struct CommSync final : kv::PagerSync {
  explicit CommSync(dist::Comm& c) : comm(c) {}
  void wait() override { comm.barrier(); }
  dist::Comm& comm;
};

}  // namespace

void ModelRunner::tp_copy_block(const kv::CopyOp& c) {
  tp_->run([&](int r) {
    TpRanks::Rank& k = tp_->rank(r);
    if (k.dev) k.dev->copy_block(c.src, c.dst);
    else k.store->copy_block(c.src, c.dst);
  });
}

void ModelRunner::tp_copy_in(kv::SeqId seq, const reuse::CopyIn& c, const kv::ChunkShape& shape) {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim, L = cfg.n_layers;
  const kv::Chunk& ch = *c.chunk;
  const int64_t len = int64_t(ch.tokens.size()), delta = c.begin - ch.pos0, t0 = std::max<int64_t>(0, c.from - c.begin);
  if (len <= t0) return;
  resident_rows(seq, c.begin + t0, len - t0);
  // Every layer's rows, whole, once; each rank takes its columns.
  kbuf_.resize(size_t(L * len * nkv)), vbuf_.resize(size_t(L * len * nkv));
  for (int64_t l = 0; l < L; ++l) kv::chunk_get_layer(ch, shape, l, kbuf_.data() + l * len * nkv, vbuf_.data() + l * len * nkv);
  const std::span<const kv::BlockId> table = kv_.block_table(seq);
  const int64_t n = len - t0;
  tp_->run([&](int r) {
    TpRanks::Rank& k = tp_->rank(r);
    const int64_t c0 = k.plan.k0, c1 = k.plan.k1, w = c1 - c0;
    std::vector<float> kr(size_t(n * w)), vr(size_t(n * w));
    const kv::KvLayout lay = k.store ? k.store->layout(table.data()) : kv::KvLayout{};
    for (int64_t l = 0; l < L; ++l) {
      take_cols(kbuf_.data() + (l * len + t0) * nkv, n, nkv, c0, c1, kr.data());
      take_cols(vbuf_.data() + (l * len + t0) * nkv, n, nkv, c0, c1, vr.data());
      if (k.dev) {
        k.dev->write_rows(l, table, c.begin + t0, n, kr.data(), vr.data());
        k.dev->rotate_keys(l, table, c.begin + t0, n, delta);
      } else {
        lay.write_rows(l, c.begin + t0, n, kr.data(), vr.data());
        lay.rotate_keys(l, c.begin + t0, n, model_.rope_inv_freq(l).data(), delta);
      }
    }
  });
}

void ModelRunner::tp_read_chunk(kv::SeqId seq, int64_t begin, int64_t len, const kv::ChunkShape& shape,
                                kv::Chunk& out) {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim, L = cfg.n_layers;
  if (len <= 0) return;
  resident_rows(seq, begin, len);
  kbuf_.resize(size_t(L * len * nkv)), vbuf_.resize(size_t(L * len * nkv));
  const std::span<const kv::BlockId> table = kv_.block_table(seq);
  tp_->run([&](int r) {  // each rank fills its columns of every layer's rows
    TpRanks::Rank& k = tp_->rank(r);
    const int64_t c0 = k.plan.k0, c1 = k.plan.k1, w = c1 - c0;
    std::vector<float> kr(size_t(len * w)), vr(size_t(len * w));
    const kv::KvLayout lay = k.store ? k.store->layout(table.data()) : kv::KvLayout{};
    for (int64_t l = 0; l < L; ++l) {
      if (k.dev) k.dev->read_rows(l, table, begin, len, kr.data(), vr.data());
      else lay.read_rows(l, begin, len, kr.data(), vr.data());
      put_cols(kr.data(), len, nkv, c0, c1, kbuf_.data() + l * len * nkv);
      put_cols(vr.data(), len, nkv, c0, c1, vbuf_.data() + l * len * nkv);
    }
  });
  for (int64_t l = 0; l < L; ++l) kv::chunk_put_layer(out, shape, l, kbuf_.data() + l * len * nkv, vbuf_.data() + l * len * nkv);
}

std::vector<float> ModelRunner::tp_snapshot_rows(kv::SeqId seq, std::span<const int64_t> rows) const {
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim, L = cfg.n_layers, n = int64_t(rows.size());
  std::vector<float> out(size_t(n * L * 2 * nkv));
  resident(seq);
  const std::span<const kv::BlockId> table = kv_.block_table(seq);
  tp_->run([&](int r) {
    TpRanks::Rank& k = tp_->rank(r);
    const int64_t c0 = k.plan.k0, c1 = k.plan.k1, w = c1 - c0;
    if (k.dev) {  // [row][layer][K w, V w]
      const std::vector<float> part = k.dev->snapshot_rows(table, rows);
      for (int64_t i = 0; i < n * L; ++i) {
        std::memcpy(&out[size_t(i * 2 * nkv + c0)], &part[size_t(i * 2 * w)], size_t(w) * sizeof(float));
        std::memcpy(&out[size_t(i * 2 * nkv + nkv + c0)], &part[size_t(i * 2 * w + w)], size_t(w) * sizeof(float));
      }
      return;
    }
    const kv::KvLayout lay = k.store->layout(table.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t l = 0; l < L; ++l) {
        float* o = &out[size_t((i * L + l) * 2 * nkv)];
        std::memcpy(o + c0, lay.k_row(l, rows[size_t(i)]), size_t(w) * sizeof(float));
        std::memcpy(o + nkv + c0, lay.v_row(l, rows[size_t(i)]), size_t(w) * sizeof(float));
      }
  });
  return out;
}

double ModelRunner::tp_run_batch(std::vector<PlannedRows>& rows) {
  const int64_t V = model_.config().vocab_size;
  const double t0 = now_ms();
  tp_->run([&](int r) {
    TpRanks::Rank& k = tp_->rank(r);
    if (k.dev) {
      std::vector<gpu::PagedSeq> b(rows.size());
      std::vector<std::vector<float>> scratch(rows.size());  // ranks 1 ..: the logits they are sent
      for (size_t i = 0; i < rows.size(); ++i) {
        const PlannedRows& p = rows[i];
        b[i].tokens = p.tokens.data();
        b[i].n = int64_t(p.tokens.size());
        if (p.decode) b[i].n_past = p.n_past;
        else b[i].positions = p.positions.data();
        b[i].block_table = kv_.block_table(p.seq);
        b[i].n_logits = p.n_logits;
        b[i].logits = p.logits;
        if (r > 0 && p.logits) {
          scratch[i].resize(size_t(std::clamp<int64_t>(p.n_logits, 0, b[i].n) * V));
          b[i].logits = scratch[i].data();
        }
      }
      k.dev->forward_batch(b.data(), int64_t(b.size()));
      return;
    }
    std::vector<SeqBatch> b(rows.size());
    CommSync sync(k.comm);
    for (size_t i = 0; i < rows.size(); ++i) {
      const PlannedRows& p = rows[i];
      b[i].tokens = p.tokens.data();
      b[i].n = int64_t(p.tokens.size());
      KvView v;
      static_cast<kv::KvLayout&>(v) = k.store->layout(kv_.block_table(p.seq).data());
      // A cold tier: rank 0 pages in for every rank, the ranks meeting at each range (as
      // ModelRunner::view: half the hot pool per attention range).
      if (cold_) v.pager = kv::Pager(kv_, p.seq, std::max<int64_t>(1, store_.n_blocks() / 2), &sync, r == 0);
      if (p.decode) v.n_past = p.n_past;
      else b[i].positions = p.positions.data();
      b[i].kv = v;
      b[i].logits = r == 0 ? p.logits : nullptr;  // the head is replicated: rank 0's logits are everyone's
      b[i].n_logits = p.n_logits;
    }
    k.shard->forward_batch(b.data(), int64_t(b.size()), k.comm);
  });
  return now_ms() - t0;
}

BlendStats ModelRunner::tp_run_blend(const PlannedBlend& b) {
  const int64_t V = model_.config().vocab_size;
  BlendStats st;
  resident(b.seq);
  tp_->run([&](int r) {
    TpRanks::Rank& k = tp_->rank(r);
    std::vector<float> scratch(r == 0 ? 0 : size_t(V));
    float* logits = r == 0 ? b.logits : scratch.data();
    BlendStats s;
    if (k.dev) {
      s = k.dev->forward_blend(b.tokens, b.n, b.n_past, kv_.block_table(b.seq), b.opts, logits);
    } else {
      KvView v;
      static_cast<kv::KvLayout&>(v) = k.store->layout(kv_.block_table(b.seq).data());
      v.n_past = b.n_past;
      s = k.shard->forward_blend(b.tokens, b.n, v, b.opts, logits, k.comm);
    }
    if (r == 0) st = s;
  });
  return st;
}

}  // namespace kvboost
