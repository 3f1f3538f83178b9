// The model runner (runner.h): plan rows -> SeqBatch / KvView -> Model::forward_batch and
// Model::forward_blend on the CPU, or plan rows -> gpu::PagedSeq -> gpu::PagedRunner on a CUDA
// device (the CPU code is unchanged; each method picks its backend once).
#include "runner.h"

#include <algorithm>
#include <cstring>

namespace kvboost {

ModelRunner::ModelRunner(const Model& model, kv::KvCacheManager& kv, kv::PagedKvStorage& store, bool cold_tier,
                         const kernels::Device& device, int64_t rows_hint, uint64_t vram_budget, int tp)
    : model_(model), kv_(kv), store_(store), cold_(cold_tier), device_(device) {
  if (device.is_cpu() && vram_budget > 0)
    fail("vram_budget (--vram-budget) ", vram_budget, " bytes is for a CUDA device (--device cuda); on the CPU, "
         "layer streaming is weight_budget (--weight-budget)");
  if (tp < 1) fail("tp ", tp, " must be at least 1");
  if (tp > 1) {
    if (cold_tier && !device.is_cpu())
      fail("tensor parallelism (tp ", tp, ") over CUDA devices with a cold tier (cold_dir, --kv-cold-dir) is not "
           "supported: each device's pools would need a spill chain of their own");
    tp_ = std::make_unique<TpRanks>(model, tp, store, device, rows_hint, vram_budget);
    return;
  }
  if (device.is_cpu()) return;
  gpu::PagedRunnerOptions o;
  o.device = device.index;
  o.pool = gpu::PoolLayout{store.n_layers(), store.n_blocks(), store.block_size(), store.n_kv_heads(), store.head_dim()};
  o.rows_hint = rows_hint;
  o.vram_budget = vram_budget;
  dev_ = gpu::PagedRunner::create(model, o);
}

ModelRunner::~ModelRunner() = default;

bool ModelRunner::on_device() const { return dev_ != nullptr || (tp_ && tp_->on_device()); }
int ModelRunner::tp() const { return tp_ ? tp_->world() : 1; }
kv::HotTier& ModelRunner::hot_tier() { return tp_ ? tp_->hot_tier() : static_cast<kv::HotTier&>(store_); }

void ModelRunner::attach_device_cold_tier(kv::ColdStore* disk, size_t host_bytes) {
  if (!dev_) fail("attach_device_cold_tier: the runner is on the CPU (its cold tier is the host pools')");
  dev_hot_ = std::make_unique<gpu::DeviceHotTier>(*dev_);
  const size_t bb = dev_hot_->block_bytes();
  // Striped by one layer's K (or V) of a block: page-ins of adjacent slots into adjacent blocks
  // merge into one copy per layer and K/V.
  dev_cold_ = std::make_unique<kv::HostColdStore>(bb, kv::HostColdStore::slots_for_budget(host_bytes, bb),
                                                  dev_->spill_copy(), disk, size_t(store_.block_floats()) * sizeof(float));
  kv_.attach_cold_tier(dev_hot_.get(), dev_cold_.get());
}

// The device's attention kernels take a sequence's whole block table (no per-range paging as the
// CPU's kv::Pager does between attention ranges), so a device pass needs all of it resident.
// Under TP on the CPU, passes page by ranges (synchronised pagers); the K/V copies outside a
// pass (copy-in, read-out, probe rows) make their rows resident here first.
void ModelRunner::resident(kv::SeqId seq, int64_t first, int64_t n) const {
  if (!dev_cold_ && !(tp_ && cold_)) return;
  const int64_t n_table = int64_t(kv_.block_table(seq).size());
  if (n < 0) first = 0, n = n_table;
  n = std::min(n, n_table - first);
  if (n > 0 && !kv_.ensure_resident(seq, first, n))
    fail(dev_ ? "device " + device_.name() : "tensor parallelism", ": KV memory exhausted: sequence ", seq,
         " needs blocks [", first, ", ", first + n, ") resident but the ", dev_ ? "device" : "hot", " KV pool holds ",
         kv_.pool().n_blocks(), " blocks (raise kv_budget_bytes, --kv-budget)");
}

void ModelRunner::resident_rows(kv::SeqId seq, int64_t begin, int64_t n) const {
  if (n <= 0) return;
  const int64_t bs = kv_.block_size();
  resident(seq, begin / bs, (begin + n - 1) / bs - begin / bs + 1);
}

void ModelRunner::resident(std::span<const kv::SeqId> seqs) const {
  if (!dev_cold_) return;
  for (kv::SeqId s : seqs) resident(s);
  // A later sequence's page-in may have spilled an earlier one's blocks (LRU picks other
  // sequences' first, so only when the pass's tables do not fit together).
  int64_t need = 0;
  bool cold = false;
  for (kv::SeqId s : seqs) {
    const auto t = kv_.block_table(s);
    need += int64_t(t.size());
    cold = cold || std::find(t.begin(), t.end(), kv::kColdBlock) != t.end();
  }
  if (cold)
    fail("device ", device_.name(), ": KV memory exhausted: the pass's ", seqs.size(), " sequences need ", need,
         " blocks resident together but the device KV pool holds ", kv_.pool().n_blocks(),
         " (raise kv_budget_bytes, --kv-budget, or lower max_batch)");
}

KvView ModelRunner::view(kv::SeqId seq, int64_t n_past) const {
  if (tp_) fail("tensor parallelism: the K/V are split over ", tp_->world(), " ranks; there is no one view of them");
  if (dev_) fail("device ", device_.name(), ": the K/V live on the device; there is no host view of them");
  KvView v;
  static_cast<kv::KvLayout&>(v) = store_.layout(kv_.block_table(seq).data());
  v.n_past = n_past;
  // Half the hot pool per attention range leaves room for the blocks being written.
  if (cold_) v.pager = kv::Pager(kv_, seq, std::max<int64_t>(1, store_.n_blocks() / 2));
  return v;
}

double ModelRunner::run_batch(std::vector<PlannedRows>& rows) {
  if (tp_) return tp_run_batch(rows);
  if (dev_) {
    pass_seqs_.clear();
    for (const PlannedRows& p : rows) pass_seqs_.push_back(p.seq);
    resident(pass_seqs_);  // before any table is read: paging in changes them
    dev_batch_.assign(rows.size(), gpu::PagedSeq{});
    for (size_t i = 0; i < rows.size(); ++i) {
      const PlannedRows& p = rows[i];
      gpu::PagedSeq& b = dev_batch_[i];
      b.tokens = p.tokens.data();
      b.n = int64_t(p.tokens.size());
      if (p.decode) b.n_past = p.n_past;
      else b.positions = p.positions.data();
      b.block_table = kv_.block_table(p.seq);
      b.logits = p.logits;
      b.n_logits = p.n_logits;
    }
    const double t0 = now_ms();
    dev_->forward_batch(dev_batch_.data(), int64_t(dev_batch_.size()));
    return now_ms() - t0;
  }
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
  if (tp_) return tp_copy_in(seq, c, shape);
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  const kv::Chunk& ch = *c.chunk;
  const int64_t len = int64_t(ch.tokens.size()), delta = c.begin - ch.pos0, t0 = std::max<int64_t>(0, c.from - c.begin);
  if (dev_) {  // the same rows into the device pools, keys re-rotated there
    resident_rows(seq, c.begin + t0, len - t0);
    const std::span<const kv::BlockId> table = kv_.block_table(seq);
    kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      kv::chunk_get_layer(ch, shape, l, kbuf_.data(), vbuf_.data());
      dev_->write_rows(l, table, c.begin + t0, len - t0, kbuf_.data() + t0 * nkv, vbuf_.data() + t0 * nkv);
      dev_->rotate_keys(l, table, c.begin + t0, len - t0, delta);
    }
    return;
  }
  const kv::KvLayout kvl = store_.layout(kv_.block_table(seq).data());
  kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    kv::chunk_get_layer(ch, shape, l, kbuf_.data(), vbuf_.data());
    kvl.write_rows(l, c.begin + t0, len - t0, kbuf_.data() + t0 * nkv, vbuf_.data() + t0 * nkv);
    kvl.rotate_keys(l, c.begin + t0, len - t0, model_.rope_inv_freq(l).data(), delta);
  }
}

void ModelRunner::read_chunk(kv::SeqId seq, int64_t begin, int64_t len, const kv::ChunkShape& shape, kv::Chunk& out) {
  if (tp_) return tp_read_chunk(seq, begin, len, shape, out);
  const ModelConfig& cfg = model_.config();
  const int64_t nkv = cfg.n_kv_heads * cfg.head_dim;
  if (dev_) {
    resident_rows(seq, begin, len);
    kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      dev_->read_rows(l, kv_.block_table(seq), begin, len, kbuf_.data(), vbuf_.data());
      kv::chunk_put_layer(out, shape, l, kbuf_.data(), vbuf_.data());
    }
    return;
  }
  const kv::KvLayout kvl = store_.layout(kv_.block_table(seq).data());
  kbuf_.resize(size_t(len * nkv)), vbuf_.resize(size_t(len * nkv));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    kvl.read_rows(l, begin, len, kbuf_.data(), vbuf_.data());
    kv::chunk_put_layer(out, shape, l, kbuf_.data(), vbuf_.data());
  }
}

std::vector<float> ModelRunner::snapshot_rows(kv::SeqId seq, std::span<const int64_t> rows) const {
  if (tp_) return tp_snapshot_rows(seq, rows);
  if (dev_) {
    resident(seq);
    return dev_->snapshot_rows(kv_.block_table(seq), rows);
  }
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
  if (dev_ || tp_) {  // the rows now, fetched from the device / the ranks in the snapshot's layout; the same sums
    resident(seq);
    const std::vector<float> now = tp_ ? tp_snapshot_rows(seq, rows) : dev_->snapshot_rows(kv_.block_table(seq), rows);
    double sum = 0;
    const int64_t n_terms = int64_t(rows.size()) * cfg.n_layers;
    for (int64_t i = 0; i < 2 * n_terms; ++i) {
      const float* fresh = now.data() + i * nkv;
      const float* old = snapshot.data() + i * nkv;
      double d = 0, f = 0;
      for (int64_t j = 0; j < nkv; ++j) d += double(fresh[j] - old[j]) * double(fresh[j] - old[j]), f += double(fresh[j]) * double(fresh[j]);
      sum += f > 0 ? d / f : 0;
    }
    return float(sum / double(std::max<int64_t>(1, n_terms)));
  }
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

int64_t ModelRunner::device_passes() const {
  if (tp_ && tp_->on_device()) return tp_->rank(0).dev->passes();
  return dev_ ? dev_->passes() : 0;
}

BlendStats ModelRunner::run_blend(const PlannedBlend& b, double* ms) {
  const double t0 = now_ms();
  const BlendStats bs = tp_ ? tp_run_blend(b) : dev_ ? dev_->forward_blend(b.tokens, b.n, b.n_past, kv_.block_table(b.seq), b.opts, b.logits)
                             : model_.forward_blend(b.tokens, b.n, view(b.seq, b.n_past), b.opts, b.logits);
  *ms = now_ms() - t0;
  return bs;
}

}  // namespace kvboost
