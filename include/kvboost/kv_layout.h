// kvboost/kv_layout.h — the kv module's K/V layout: where the K/V row of (sequence, position,
// layer) lives in paged memory, row copy-in/out, re-rotation of stored keys, and the cold-tier
// pager that a forward pass drives between attention ranges. Every reader and writer of K/V
// memory goes through it: the model's forward pass (write, attention, CacheBlend's deviation),
// the engine's chunk copy-in/out, PagedKvStorage and the spill tier. docs/kv-layout.md.
// Uses kvboost/common.h and kvboost/kernels.h (RoPE re-rotation) only, so that the model module
// can take its K/V views from here (kv ranks below model: scripts/check_layers.py).
#pragma once

#include <cstdint>

#include "kvboost/common.h"

namespace kvboost::kv {

using BlockId = int32_t;
using SeqId = int64_t;
inline constexpr BlockId kColdBlock = -1;  // a block-table entry whose data is in the cold tier

class KvCacheManager;  // kvboost/kv.h

// One sequence's K/V in paged memory. Per layer, K and V are each a pool laid out
//   [n_blocks][block_size][n_kv_heads][head_dim] f32,
// and the K/V row of position p is row p % block_size of block block_table[p / block_size].
// A plain value (pointers, no ownership): the pools belong to a PagedKvStorage (or a KvCache),
// the table to the KvCacheManager; both must outlive it. A contiguous per-sequence cache is the
// one-block case (block_table = {0}, block_size = capacity).
struct KvLayout {
  float* const* k_pools = nullptr;        // [n_layers]
  float* const* v_pools = nullptr;        // [n_layers]
  const BlockId* block_table = nullptr;   // the sequence's; null for a layout of storage only
  int64_t block_size = 0;
  // A row is n_kv_heads * head_dim floats. 0: the model's (Model's forward passes fill them in).
  int64_t n_kv_heads = 0, head_dim = 0;

  int64_t row() const { return n_kv_heads * head_dim; }      // floats per position per layer
  int64_t block_floats() const { return block_size * row(); }  // floats per block per layer, K or V
  // Pool index of position p's row (a kColdBlock entry must have been paged in: see Pager).
  int64_t slot(int64_t p) const { return int64_t(block_table[p / block_size]) * block_size + p % block_size; }
  float* k_pool(int64_t layer) const { return k_pools[layer]; }
  float* v_pool(int64_t layer) const { return v_pools[layer]; }
  float* k_block(int64_t layer, BlockId b) const { return k_pools[layer] + int64_t(b) * block_floats(); }
  float* v_block(int64_t layer, BlockId b) const { return v_pools[layer] + int64_t(b) * block_floats(); }
  float* k_row(int64_t layer, int64_t p) const { return k_pools[layer] + slot(p) * row(); }
  float* v_row(int64_t layer, int64_t p) const { return v_pools[layer] + slot(p) * row(); }
  // The same storage under another block table (a pager's, after paging in).
  KvLayout with_table(const BlockId* table) const {
    KvLayout l = *this;
    l.block_table = table;
    return l;
  }

  // Rows [pos0, pos0 + n) of `layer` from k and v, each [n, row] f32 (either may be null: that
  // half is left alone). One memcpy per run of rows inside one block.
  void write_rows(int64_t layer, int64_t pos0, int64_t n, const float* k, const float* v) const;
  // The reverse: the stored rows into k and v [n, row].
  void read_rows(int64_t layer, int64_t pos0, int64_t n, float* k, float* v) const;
  // Re-rotates the stored keys of rows [pos0, pos0 + n) of `layer` by delta positions, in place:
  // RoPE is a rotation, R(p + delta) = R(delta) R(p), so keys computed at position p become the
  // keys of p + delta (values need no change). inv_freq: the layer's [head_dim / 2] RoPE
  // frequencies (Model::rope_inv_freq). kernels::rope_shift per run of rows inside one block.
  void rotate_keys(int64_t layer, int64_t pos0, int64_t n, const float* inv_freq, int64_t delta) const;
};

// The blocks [first, first + n) of a block table.
struct BlockRange {
  int64_t first = 0, n = 0;
};

// Residency of one sequence whose K/V do not all fit in the hot pool (a cold tier is attached to
// its KvCacheManager). The runtime builds one per forward pass and puts it in the pass's view;
// the forward pass then visits the sequence's K/V in the ranges this plan gives and, between
// ranges, asks for the next one to be made resident (no callback into the runtime: a plain call
// to the KV manager). A default-constructed Pager is inactive: every block is resident.
// Several threads reading one sequence's K/V in lockstep, each over pools of its own indexed by
// the same manager's block ids (tensor-parallel ranks: each holds its heads' K/V): one Pager per
// thread, all sharing the group's PagerSync. make_resident then waits for the whole group
// (wait()), the leader alone calls the manager (which moves every thread's part of a block: the
// hot tier covers all of them), and all wait again before reading the table. The threads must
// make the same calls in the same order (they do: the same pass over the same rows). wait()
// throws when the group failed, so a leader's Error does not leave the others waiting.
class PagerSync {
 public:
  virtual ~PagerSync() = default;
  virtual void wait() = 0;
};

class Pager {
 public:
  Pager() = default;
  // range_blocks: blocks per attention range (>= 1); leave room in the hot pool for the blocks
  // the pass writes (the engine uses half the pool). sync: see PagerSync (null: one thread).
  Pager(KvCacheManager& mgr, SeqId seq, int64_t range_blocks, PagerSync* sync = nullptr, bool leader = true);
  bool active() const { return mgr_ != nullptr; }
  explicit operator bool() const { return active(); }
  int64_t range_blocks() const { return range_blocks_; }

  // The plan: attention over n_blocks blocks runs over n_ranges(n_blocks) ranges of at most
  // range_blocks blocks, the i-th of which at `layer` is range(layer, i, n_blocks): first to
  // last on even layers, last to first on odd ones, so that the blocks an LRU hot pool still
  // holds from the previous layer are the ones needed first.
  int64_t n_ranges(int64_t n_blocks) const { return (n_blocks + range_blocks_ - 1) / range_blocks_; }
  BlockRange range(int64_t layer, int64_t i, int64_t n_blocks) const;

  // Makes blocks r of the sequence's table resident (KvCacheManager::ensure_resident) and
  // returns the table (valid until the next call that can spill). Error naming the sizes when
  // the hot pool cannot hold them.
  const BlockId* make_resident(BlockRange r) const;

 private:
  KvCacheManager* mgr_ = nullptr;
  SeqId seq_ = 0;
  int64_t range_blocks_ = 1;
  PagerSync* sync_ = nullptr;
  bool leader_ = true;
};

}  // namespace kvboost::kv
