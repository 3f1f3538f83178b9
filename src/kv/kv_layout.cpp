// The K/V layout (kvboost/kv_layout.h): row copy-in/out and key re-rotation over the block
// table, one run of rows inside one block at a time, and the cold-tier pager's range plan.
#include "kvboost/kv_layout.h"

#include <algorithm>
#include <cstring>

#include "kvboost/kernels.h"
#include "kvboost/kv.h"

namespace kvboost::kv {

namespace {
// f(pool_row, t, m): rows t .. t + m - 1 of [pos0, pos0 + n) lie contiguously in one block,
// starting at pool row pool_row.
template <class F>
void for_block_runs(const KvLayout& L, int64_t pos0, int64_t n, F&& f) {
  for (int64_t t = 0; t < n;) {
    const int64_t p = pos0 + t, m = std::min(n - t, L.block_size - p % L.block_size);
    f(L.slot(p), t, m);
    t += m;
  }
}
}  // namespace

void KvLayout::write_rows(int64_t layer, int64_t pos0, int64_t n, const float* k, const float* v) const {
  const int64_t w = row();
  for_block_runs(*this, pos0, n, [&](int64_t slot, int64_t t, int64_t m) {
    if (k) std::memcpy(k_pools[layer] + slot * w, k + t * w, size_t(m * w) * sizeof(float));
    if (v) std::memcpy(v_pools[layer] + slot * w, v + t * w, size_t(m * w) * sizeof(float));
  });
}

void KvLayout::read_rows(int64_t layer, int64_t pos0, int64_t n, float* k, float* v) const {
  const int64_t w = row();
  for_block_runs(*this, pos0, n, [&](int64_t slot, int64_t t, int64_t m) {
    if (k) std::memcpy(k + t * w, k_pools[layer] + slot * w, size_t(m * w) * sizeof(float));
    if (v) std::memcpy(v + t * w, v_pools[layer] + slot * w, size_t(m * w) * sizeof(float));
  });
}

void KvLayout::rotate_keys(int64_t layer, int64_t pos0, int64_t n, const float* inv_freq, int64_t delta) const {
  if (delta == 0) return;
  const int64_t w = row();
  for_block_runs(*this, pos0, n, [&](int64_t slot, int64_t, int64_t m) {
    kernels::rope_shift(k_pools[layer] + slot * w, m, n_kv_heads, head_dim, inv_freq, delta);
  });
}

Pager::Pager(KvCacheManager& mgr, SeqId seq, int64_t range_blocks, PagerSync* sync, bool leader)
    : mgr_(&mgr), seq_(seq), range_blocks_(std::max<int64_t>(1, range_blocks)), sync_(sync), leader_(leader) {}

BlockRange Pager::range(int64_t layer, int64_t i, int64_t n_blocks) const {
  const int64_t n_r = n_ranges(n_blocks);
  const int64_t first = (layer % 2 == 0 ? i : n_r - 1 - i) * range_blocks_;
  return {first, std::min(range_blocks_, n_blocks - first)};
}

const BlockId* Pager::make_resident(BlockRange r) const {
  if (sync_) sync_->wait();  // every thread is done with the blocks of its last range
  if (leader_ && !mgr_->ensure_resident(seq_, r.first, r.n))
    fail("KV memory exhausted: cannot page in ", r.n, " blocks (hot pool of ", mgr_->pool().n_blocks(), " blocks)");
  if (sync_) sync_->wait();  // the leader's page-in is done
  return mgr_->block_table(seq_).data();
}

}  // namespace kvboost::kv
