// KvCacheManager: per-sequence block tables over a BlockPool, automatic prefix caching with
// verified hits, copy-on-write, and spilling to a cold tier.
//
// Exactness of prefix hits: K/V of block i depend on every token of blocks 0..i. A hit on block i
// is accepted only if its stored tokens equal the prompt's, its namespace matches, and its
// parent_reg equals the reg_id of the block accepted at i-1 (0 for i = 0). reg_ids are unique and
// never reused, so by induction the accepted run was computed from exactly this prefix, whatever
// the hash function does. The hash only finds candidates.
#include <algorithm>
#include <sstream>

#include "kvboost/kv.h"

namespace kvboost::kv {

std::string KvStats::to_string() const {
  std::ostringstream s;
  s << "blocks " << n_blocks << " (used " << blocks_used << ", free " << blocks_free << ", cached "
    << blocks_cached << ", cold " << blocks_cold << "), prefix hits " << hit_tokens << "/"
    << query_tokens << " tokens (" << int(hit_rate() * 1000 + 0.5) / 10.0 << "%), evictions "
    << evictions << ", spills " << spills << ", page-ins " << page_ins;
  return s.str();
}

KvCacheManager::KvCacheManager(int64_t n_blocks, int64_t block_size)
    : pool_(n_blocks, block_size), last_use_(size_t(n_blocks), 0) {}

void KvCacheManager::attach_cold_tier(HotTier* hot, ColdStore* cold) {
  if (!hot || !cold) fail("attach_cold_tier: null storage");
  if (n_cold_ > 0) fail("attach_cold_tier: ", n_cold_, " blocks are in the cold tier attached before");
  if (hot->n_blocks() != pool_.n_blocks() || hot->block_size() != pool_.block_size())
    fail("attach_cold_tier: storage has ", hot->n_blocks(), " blocks of ", hot->block_size(),
         " tokens, the pool ", pool_.n_blocks(), " of ", pool_.block_size());
  if (cold->slot_bytes() != hot->block_bytes())
    fail("attach_cold_tier: cold slots of ", cold->slot_bytes(), " bytes, blocks of ", hot->block_bytes());
  hot_ = hot;
  cold_ = cold;
}

KvCacheManager::Seq& KvCacheManager::get(SeqId seq, const char* what) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail(what, ": unknown sequence ", seq);
  return it->second;
}
const KvCacheManager::Seq& KvCacheManager::get(SeqId seq, const char* what) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail(what, ": unknown sequence ", seq);
  return it->second;
}

int32_t KvCacheManager::intern_ns(std::string_view ns) {
  auto it = ns_ids_.find(std::string(ns));
  if (it != ns_ids_.end()) return it->second;
  const int32_t id = int32_t(ns_ids_.size());
  ns_ids_.emplace(std::string(ns), id);
  return id;
}

uint64_t KvCacheManager::hash(uint64_t parent, std::span<const int32_t> tokens) const {
  return hash_fn_ ? hash_fn_(parent, tokens) : block_hash(parent, tokens);
}

std::span<const BlockId> KvCacheManager::block_table(SeqId seq) const {
  return get(seq, "block_table").blocks;
}

int64_t KvCacheManager::n_tokens(SeqId seq) const { return get(seq, "n_tokens").n_tokens; }

KvStats KvCacheManager::stats() const {
  KvStats s;
  s.n_blocks = pool_.n_blocks();
  s.blocks_used = pool_.n_used();
  s.blocks_free = pool_.n_free();
  s.blocks_cached = pool_.n_cached();
  s.blocks_cold = n_cold_;
  s.n_queries = n_queries_;
  s.query_tokens = query_tokens_;
  s.hit_tokens = hit_tokens_;
  s.evictions = pool_.n_evictions();
  s.spills = spills_;
  s.page_ins = page_ins_;
  return s;
}

std::optional<PromptAlloc> KvCacheManager::allocate_for_prompt(SeqId seq,
                                                               std::span<const int32_t> tokens,
                                                               std::string_view ns) {
  if (seqs_.count(seq)) fail("allocate_for_prompt: sequence ", seq, " already exists");
  if (tokens.empty()) fail("allocate_for_prompt: empty prompt for sequence ", seq);
  const int64_t bs = pool_.block_size(), n = int64_t(tokens.size());
  const int64_t n_full = n / bs, n_total = (n + bs - 1) / bs;
  const int32_t ns_id = intern_ns(ns);

  // Longest verified run of cached full blocks.
  std::vector<BlockId> hits;
  uint64_t parent_hash = namespace_root_hash(ns), parent_reg = 0;
  uint64_t prev_hash = parent_hash, prev_reg = 0;  // the chain before the last hit
  for (int64_t i = 0; i < n_full; ++i) {
    const auto chunk = tokens.subspan(size_t(i * bs), size_t(bs));
    const uint64_t h = hash(parent_hash, chunk);
    const auto b = pool_.find(h);
    if (!b) break;
    const BlockInfo& info = pool_.info(*b);
    if (info.ns != ns_id || info.parent_reg != parent_reg ||
        !std::equal(chunk.begin(), chunk.end(), info.tokens.begin(), info.tokens.end()))
      break;  // a hash collision: treat as a miss
    hits.push_back(*b);
    prev_hash = parent_hash;
    prev_reg = parent_reg;
    parent_hash = h;
    parent_reg = info.reg_id;
  }
  const int64_t n_hit = int64_t(hits.size());
  const bool all_cached = n_hit * bs == n;  // the last token is recomputed for its logits
  const int64_t n_new = n_total - n_hit + (all_cached ? 1 : 0);

  // A cached tail continuing the verified chain: its first r rows are copied into the block at
  // n_hit (the last prompt token is always computed, for its logits).
  std::optional<BlockId> tail;
  int64_t n_tail = 0;
  if (!all_cached) {
    if (const auto t = pool_.find(tail_key(parent_hash))) {
      const BlockInfo& info = pool_.info(*t);
      if (info.ns == ns_id && info.parent_reg == parent_reg && int64_t(info.tokens.size()) < bs) {
        const auto rest = tokens.subspan(size_t(n_hit * bs));
        const size_t m = std::min(info.tokens.size(), rest.size() - 1);
        while (size_t(n_tail) < m && info.tokens[size_t(n_tail)] == rest[size_t(n_tail)]) ++n_tail;
        if (n_tail > 0) tail = *t;
      }
    }
  }

  // Feasibility first, so that failure changes nothing (not even the LRU order).
  int64_t hits_free = 0;
  for (BlockId b : hits) hits_free += pool_.info(b).ref_count == 0;
  if (tail) hits_free += pool_.info(*tail).ref_count == 0;
  if (n_new > pool_.n_free() - hits_free) return std::nullopt;

  for (BlockId b : hits) pool_.ref(b);  // before allocating, so allocation cannot evict them
  if (tail) pool_.ref(*tail);
  Seq s;
  s.blocks = hits;
  const bool ok = pool_.allocate_n(n_new, &s.blocks);
  (void)ok;  // guaranteed by the check above
  PromptAlloc out;
  if (tail) {
    // The copy runs before any other manager call (contract above), so dropping the reference
    // now cannot let the source be reused before its rows are read.
    out.copies.push_back({*tail, s.blocks[size_t(n_hit)]});
    pool_.unref(*tail);
    out.n_tail = n_tail;
  }
  if (all_cached) {
    // The recomputed token writes K/V into the last block; a cached block is immutable, so the
    // sequence gets a private copy. The source stays cached (back to the LRU tail if unused).
    const BlockId src = s.blocks[size_t(n_hit - 1)], dst = s.blocks.back();
    s.blocks[size_t(n_hit - 1)] = dst;
    s.blocks.pop_back();
    pool_.unref(src);
    out.copies.push_back({src, dst});
    out.n_cached = n - 1;
  } else {
    out.n_cached = n_hit * bs + n_tail;
  }
  s.cold.assign(s.blocks.size(), -1);
  s.n_tokens = n;
  s.ns = ns_id;
  // In the all-cached case the copy is left uncommitted: commit_full_blocks continues the chain
  // through the source block, or registers the copy if the source has been evicted meanwhile.
  s.n_committed = all_cached ? n_hit - 1 : n_hit;
  s.chain_hash = all_cached ? prev_hash : parent_hash;
  s.chain_reg = all_cached ? prev_reg : parent_reg;
  for (BlockId b : s.blocks) touch(b);
  seqs_.emplace(seq, std::move(s));
  ++n_queries_;
  query_tokens_ += n;
  hit_tokens_ += out.n_cached;
  return out;
}

std::optional<BlockId> KvCacheManager::allocate_one() {
  if (auto b = pool_.allocate()) return b;
  if (cold_ && spill(1, -1, 0, 0)) return pool_.allocate();
  return std::nullopt;
}

std::optional<SlotAlloc> KvCacheManager::append_slot(SeqId seq) {
  Seq& s = get(seq, "append_slot");
  const int64_t bs = pool_.block_size(), offset = s.n_tokens % bs;
  SlotAlloc out;
  out.offset = offset;
  if (offset == 0) {
    const auto b = allocate_one();
    if (!b) return std::nullopt;
    s.blocks.push_back(*b);
    s.cold.push_back(-1);
    out.block = *b;
  } else {
    const BlockId last = s.blocks.back();  // never spilled: the last block is always hot
    const BlockInfo& info = pool_.info(last);
    if (info.ref_count > 1 || info.cached) {
      const auto dst = allocate_one();
      if (!dst) return std::nullopt;
      pool_.unref(last);
      s.blocks.back() = *dst;
      out.copy = CopyOp{last, *dst};
    }
    out.block = s.blocks.back();
  }
  touch(out.block);
  ++s.n_tokens;
  return out;
}

int64_t KvCacheManager::commit_full_blocks(SeqId seq, std::span<const int32_t> tokens) {
  Seq& s = get(seq, "commit_full_blocks");
  const int64_t bs = pool_.block_size();
  if (int64_t(tokens.size()) > s.n_tokens)
    fail("commit_full_blocks: ", tokens.size(), " tokens but sequence ", seq, " holds ", s.n_tokens);
  const int64_t n_full = int64_t(tokens.size()) / bs;
  int64_t n_new = 0;
  for (int64_t i = s.n_committed; i < n_full && !s.chain_broken; ++i) {
    const auto chunk = tokens.subspan(size_t(i * bs), size_t(bs));
    const uint64_t h = hash(s.chain_hash, chunk);
    const BlockId b = s.blocks[size_t(i)];
    if (b == kColdBlock) {  // data not in the hot pool: stop making this sequence findable
      s.chain_broken = true;
      break;
    }
    auto same = [&](const BlockInfo& e) {
      return e.hash == h && e.ns == s.ns && e.parent_reg == s.chain_reg &&
             std::equal(chunk.begin(), chunk.end(), e.tokens.begin(), e.tokens.end());
    };
    uint64_t reg;
    if (pool_.info(b).cached) {  // shared with a forked sibling that committed it first
      if (!same(pool_.info(b))) fail("commit_full_blocks: tokens of sequence ", seq, " block ", i,
                                     " differ from those registered");
      reg = pool_.info(b).reg_id;
    } else if (const auto e = pool_.find(h)) {
      // Same content computed twice (two requests prefilled it concurrently): keep the first
      // registration and continue the chain through it. Anything else is a collision.
      if (!same(pool_.info(*e))) {
        s.chain_broken = true;
        break;
      }
      reg = pool_.info(*e).reg_id;
    } else {
      reg = pool_.register_full(b, h, chunk, s.ns, s.chain_reg);
      ++n_new;
    }
    s.chain_hash = h;
    s.chain_reg = reg;
    s.n_committed = i + 1;
  }
  return n_new;
}

bool KvCacheManager::commit_tail(SeqId seq, std::span<const int32_t> tokens) {
  Seq& s = get(seq, "commit_tail");
  const int64_t bs = pool_.block_size(), n = int64_t(tokens.size()), n_full = n / bs, r = n % bs;
  if (n > s.n_tokens) fail("commit_tail: ", n, " tokens but sequence ", seq, " holds ", s.n_tokens);
  if (r == 0 || s.chain_broken || s.n_committed != n_full || size_t(n_full) >= s.blocks.size()) return false;
  const BlockId b = s.blocks[size_t(n_full)];
  if (b == kColdBlock) return false;
  const BlockInfo& info = pool_.info(b);
  if (info.cached || info.ref_count != 1) return false;  // shared (forked) blocks stay private
  const uint64_t key = tail_key(s.chain_hash);
  if (const auto old = pool_.find(key)) {
    const BlockInfo& o = pool_.info(*old);
    if (o.ref_count != 0 || int64_t(o.tokens.size()) >= bs) return false;  // in use, or a collision
    pool_.drop_hash(*old);
  }
  pool_.register_tail(b, key, tokens.subspan(size_t(n_full * bs)), s.ns, s.chain_reg);
  return true;
}

void KvCacheManager::fork(SeqId src, SeqId dst) {
  if (seqs_.count(dst)) fail("fork: sequence ", dst, " already exists");
  const Seq& s = get(src, "fork");
  if (std::count(s.blocks.begin(), s.blocks.end(), kColdBlock))
    fail("fork: sequence ", src, " has spilled blocks; ensure_resident first");
  for (BlockId b : s.blocks) pool_.ref(b);
  Seq copy = s;
  seqs_.emplace(dst, std::move(copy));
}

void KvCacheManager::free(SeqId seq) {
  Seq& s = get(seq, "free");
  for (size_t i = s.blocks.size(); i-- > 0;) {
    if (s.blocks[i] == kColdBlock) {
      cold_->release_slot(s.cold[i]);
      --n_cold_;
    } else {
      pool_.unref(s.blocks[i]);
    }
  }
  seqs_.erase(seq);
}

void KvCacheManager::truncate(SeqId seq, int64_t n_tokens) {
  Seq& s = get(seq, "truncate");
  const int64_t bs = pool_.block_size();
  if (n_tokens < 0 || n_tokens > s.n_tokens)
    fail("truncate: ", n_tokens, " tokens for sequence ", seq, " holding ", s.n_tokens);
  if (n_tokens < s.n_committed * bs)
    fail("truncate: ", n_tokens, " tokens would cut into sequence ", seq, "'s ", s.n_committed, " committed blocks");
  const size_t keep = size_t((n_tokens + bs - 1) / bs);
  while (s.blocks.size() > keep) {
    if (s.blocks.back() == kColdBlock) {
      cold_->release_slot(s.cold.back());
      --n_cold_;
    } else {
      pool_.unref(s.blocks.back());
    }
    s.blocks.pop_back();
    s.cold.pop_back();
  }
  s.n_tokens = n_tokens;
}

bool KvCacheManager::spill(int64_t n, SeqId pin_seq, int64_t pin_first, int64_t pin_end) {
  if (n <= 0) return true;
  if (!cold_) return false;
  // Candidates: hot blocks owned by exactly one sequence, not its last block (decode writes
  // there), not in the pinned range. Shared blocks stay hot: their cold copy would need a ref
  // count of its own.
  struct Cand {
    uint64_t t;
    Seq* s;
    int64_t i;
  };
  std::vector<Cand> cands;
  for (auto& [id, s] : seqs_) {
    for (int64_t i = 0; i + 1 < int64_t(s.blocks.size()); ++i) {
      const BlockId b = s.blocks[size_t(i)];
      if (b == kColdBlock || pool_.info(b).ref_count != 1) continue;
      if (id == pin_seq && i >= pin_first && i < pin_end) continue;
      cands.push_back({last_use_[size_t(b)], &s, i});
    }
  }
  if (int64_t(cands.size()) < n) return false;
  std::partial_sort(cands.begin(), cands.begin() + n, cands.end(),
                    [](const Cand& a, const Cand& b) { return a.t < b.t; });
  std::vector<int64_t> slots;
  for (int64_t k = 0; k < n; ++k) {
    const auto slot = cold_->allocate_slot();
    if (!slot) {
      for (int64_t sl : slots) cold_->release_slot(sl);
      return false;
    }
    slots.push_back(*slot);
  }
  // One batch: a store in host memory merges the copies of adjacent blocks into adjacent slots.
  std::vector<std::vector<IoPiece>> srcs;
  srcs.reserve(size_t(n));
  for (int64_t k = 0; k < n; ++k)
    srcs.push_back(hot_->block_pieces(cands[size_t(k)].s->blocks[size_t(cands[size_t(k)].i)]));
  cold_->write_batch(slots, srcs);
  for (int64_t k = 0; k < n; ++k) {
    Seq& s = *cands[size_t(k)].s;
    const int64_t i = cands[size_t(k)].i;
    const BlockId b = s.blocks[size_t(i)];
    pool_.drop_hash(b);  // the hot copy is about to be reused: make it unfindable now
    pool_.unref(b);
    s.blocks[size_t(i)] = kColdBlock;
    s.cold[size_t(i)] = slots[size_t(k)];
    ++n_cold_;
    ++spills_;
  }
  return true;
}

std::optional<int64_t> KvCacheManager::ensure_resident(SeqId seq, int64_t first_block,
                                                       int64_t n_blocks) {
  Seq& s = get(seq, "ensure_resident");
  const int64_t end = first_block + n_blocks;
  if (first_block < 0 || n_blocks < 0 || end > int64_t(s.blocks.size()))
    fail("ensure_resident: blocks [", first_block, ", ", end, ") of sequence ", seq, " which has ",
         s.blocks.size());
  std::vector<int64_t> idx;
  for (int64_t i = first_block; i < end; ++i)
    if (s.blocks[size_t(i)] == kColdBlock) idx.push_back(i);
  const int64_t need = int64_t(idx.size());
  if (need > pool_.n_free() && !spill(need - pool_.n_free(), seq, first_block, end))
    return std::nullopt;
  std::vector<BlockId> fresh;
  if (!pool_.allocate_n(need, &fresh)) return std::nullopt;  // cannot happen after spill()
  if (need) {
    // One batched read; the store coalesces runs of adjacent slots.
    std::vector<int64_t> slots;
    std::vector<std::vector<IoPiece>> dsts;
    for (int64_t k = 0; k < need; ++k) {
      slots.push_back(s.cold[size_t(idx[size_t(k)])]);
      dsts.push_back(hot_->block_pieces(fresh[size_t(k)]));
    }
    cold_->read(slots, dsts);
    for (int64_t k = 0; k < need; ++k) {
      const size_t i = size_t(idx[size_t(k)]);
      cold_->release_slot(s.cold[i]);
      s.cold[i] = -1;
      s.blocks[i] = fresh[size_t(k)];
      --n_cold_;
      ++page_ins_;
    }
  }
  for (int64_t i = first_block; i < end; ++i) touch(s.blocks[size_t(i)]);
  return need;
}

}  // namespace kvboost::kv
