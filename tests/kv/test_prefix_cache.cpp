// KvCacheManager scripted scenarios (block size 4): exact block ids, ref counts, eviction order.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kvboost/kv.h"

namespace kvboost::kv {
namespace {

using Ids = std::vector<BlockId>;
using Toks = std::vector<int32_t>;

Toks iota_toks(int32_t first, int n) {
  Toks t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}
Toks cat(Toks a, const Toks& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Ids table(const KvCacheManager& m, SeqId s) {
  auto t = m.block_table(s);
  return Ids(t.begin(), t.end());
}
int32_t refs(const KvCacheManager& m, BlockId b) { return m.pool().info(b).ref_count; }

TEST(PrefixCache, SequencesSharingAPrefixShareBlocks) {
  KvCacheManager m(10, 4);
  const Toks a = iota_toks(0, 10);  // two full blocks and a partial one
  auto pa = m.allocate_for_prompt(1, a);
  ASSERT_TRUE(pa);
  EXPECT_EQ(pa->n_cached, 0);
  EXPECT_TRUE(pa->copies.empty());
  EXPECT_EQ(table(m, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(m.commit_full_blocks(1, a), 2);  // the partial block is never registered
  EXPECT_EQ(m.commit_full_blocks(1, a), 0);  // idempotent

  const Toks b = cat(iota_toks(0, 8), {100, 101, 102});
  auto pb = m.allocate_for_prompt(2, b);
  ASSERT_TRUE(pb);
  EXPECT_EQ(pb->n_cached, 8);
  EXPECT_EQ(table(m, 2), (Ids{0, 1, 3}));
  EXPECT_EQ(refs(m, 0), 2);
  EXPECT_EQ(refs(m, 1), 2);
  EXPECT_EQ(refs(m, 2), 1);
  EXPECT_EQ(refs(m, 3), 1);
  EXPECT_EQ(m.n_tokens(2), 11);

  const KvStats st = m.stats();
  EXPECT_EQ(st.blocks_used, 4);
  EXPECT_EQ(st.blocks_free, 6);
  EXPECT_EQ(st.blocks_cached, 2);
  EXPECT_EQ(st.n_queries, 2);
  EXPECT_EQ(st.query_tokens, 21);
  EXPECT_EQ(st.hit_tokens, 8);
  EXPECT_DOUBLE_EQ(st.hit_rate(), 8.0 / 21.0);
  EXPECT_NE(st.to_string().find("prefix hits 8/21"), std::string::npos);
}

TEST(PrefixCache, FreeThenRerequestHitsTheSameBlocks) {
  KvCacheManager m(10, 4);
  const Toks a = iota_toks(0, 10);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  m.commit_full_blocks(1, a);
  m.free(1);
  EXPECT_FALSE(m.has_seq(1));
  // Freed last block first: the tail of the prefix is nearer the head, so it is evicted first.
  EXPECT_EQ(m.pool().free_list(), (Ids{3, 4, 5, 6, 7, 8, 9, 2, 1, 0}));
  EXPECT_EQ(m.stats().blocks_cached, 2);

  auto p = m.allocate_for_prompt(2, a);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 8);
  EXPECT_EQ(table(m, 2), (Ids{0, 1, 3}));
  EXPECT_EQ(m.pool().free_list(), (Ids{4, 5, 6, 7, 8, 9, 2}));
  EXPECT_EQ(m.stats().evictions, 0);
}

TEST(PrefixCache, LruEvictionOrderUnderPressure) {
  KvCacheManager m(7, 4);
  const Toks a = iota_toks(0, 8), b = iota_toks(100, 8);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  ASSERT_TRUE(m.allocate_for_prompt(2, b));
  EXPECT_EQ(table(m, 1), (Ids{0, 1}));
  EXPECT_EQ(table(m, 2), (Ids{2, 3}));
  m.commit_full_blocks(1, a);
  m.commit_full_blocks(2, b);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.pool().free_list(), (Ids{4, 5, 6, 1, 0, 3, 2}));

  // 16 new tokens take never-used blocks first, then the least recently freed cached block
  // (a's second block), leaving a's first block and all of b cached.
  ASSERT_TRUE(m.allocate_for_prompt(3, iota_toks(200, 16)));
  EXPECT_EQ(table(m, 3), (Ids{4, 5, 6, 1}));
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_EQ(m.stats().blocks_cached, 3);

  // a again: its first block still hits; the second is recomputed into the LRU head (block 3:
  // b's second block is evicted), b's first block survives.
  auto p = m.allocate_for_prompt(4, a);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 4);
  EXPECT_EQ(table(m, 4), (Ids{0, 3}));
  EXPECT_EQ(m.stats().evictions, 2);
  EXPECT_EQ(m.pool().free_list(), (Ids{2}));
  m.free(4);
  EXPECT_EQ(m.pool().free_list(), (Ids{2, 3, 0}));
  auto pb = m.allocate_for_prompt(5, b);
  ASSERT_TRUE(pb);
  EXPECT_EQ(pb->n_cached, 4);
  EXPECT_EQ(table(m, 5), (Ids{2, 3}));
}

TEST(PrefixCache, HashCollisionIsRejectedByTokenVerification) {
  KvCacheManager m(8, 4);
  m.set_hash_fn_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t(42); });
  const Toks a{1, 2, 3, 4};
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  EXPECT_EQ(m.commit_full_blocks(1, a), 1);
  ASSERT_EQ(m.pool().find(42), 0);

  const Toks b{5, 6, 7, 8, 9};
  auto p = m.allocate_for_prompt(2, b);  // hash 42 finds block 0, whose tokens differ
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 0);
  EXPECT_EQ(table(m, 2), (Ids{1, 2}));
  EXPECT_EQ(refs(m, 0), 1);
  EXPECT_EQ(m.commit_full_blocks(2, b), 0);  // cannot take the colliding hash: stays private
  EXPECT_EQ(m.pool().find(42), 0);
  EXPECT_EQ(m.stats().hit_tokens, 0);
}

TEST(PrefixCache, HitRequiresTheSameParentBlock) {
  // A hash that ignores the parent: block 1 of [W, Y] collides with block 1 of [X, Y]. Its tokens
  // match, but its K/V were computed after X, so the lookup must stop after W.
  KvCacheManager m(8, 4);
  m.set_hash_fn_for_testing([](uint64_t, std::span<const int32_t> t) { return block_hash(0, t); });
  const Toks x = iota_toks(0, 4), y = iota_toks(10, 4), w = iota_toks(20, 4);
  ASSERT_TRUE(m.allocate_for_prompt(1, cat(x, y)));
  m.commit_full_blocks(1, cat(x, y));
  ASSERT_TRUE(m.allocate_for_prompt(2, w));
  m.commit_full_blocks(2, w);
  EXPECT_EQ(table(m, 1), (Ids{0, 1}));
  EXPECT_EQ(table(m, 2), (Ids{2}));

  const Toks q = cat(cat(w, y), {7});
  auto p = m.allocate_for_prompt(3, q);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 4);
  EXPECT_EQ(table(m, 3), (Ids{2, 3, 4}));
  EXPECT_EQ(refs(m, 1), 1);
  // Committing [W, Y] meets x-y's block under the same hash with another parent: a collision,
  // so the sequence's chain stops there and nothing wrong is registered.
  EXPECT_EQ(m.commit_full_blocks(3, q), 0);
}

TEST(PrefixCache, NamespacesAreKeptApart) {
  KvCacheManager m(10, 4);
  const Toks t = iota_toks(0, 9);
  ASSERT_TRUE(m.allocate_for_prompt(1, t, "alice"));
  m.commit_full_blocks(1, t);
  auto bob = m.allocate_for_prompt(2, t, "bob");
  ASSERT_TRUE(bob);
  EXPECT_EQ(bob->n_cached, 0);
  EXPECT_EQ(table(m, 2), (Ids{3, 4, 5}));
  auto alice = m.allocate_for_prompt(3, t, "alice");
  ASSERT_TRUE(alice);
  EXPECT_EQ(alice->n_cached, 8);
  EXPECT_EQ(table(m, 3), (Ids{0, 1, 6}));
  auto anon = m.allocate_for_prompt(4, iota_toks(0, 5));  // the default namespace ""
  ASSERT_TRUE(anon);
  EXPECT_EQ(anon->n_cached, 0);
}

TEST(PrefixCache, NamespacesKeptApartEvenWhenHashesCollide) {
  KvCacheManager m(8, 4);
  m.set_hash_fn_for_testing([](uint64_t, std::span<const int32_t> t) { return block_hash(0, t); });
  const Toks t = iota_toks(0, 5);
  ASSERT_TRUE(m.allocate_for_prompt(1, t, "alice"));
  m.commit_full_blocks(1, t);
  auto p = m.allocate_for_prompt(2, t, "bob");  // same hash, same tokens, other tenant
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 0);
}

TEST(PrefixCache, AllCachedPromptRecomputesTheLastToken) {
  KvCacheManager m(8, 4);
  const Toks a = iota_toks(0, 8);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  m.commit_full_blocks(1, a);
  m.free(1);
  EXPECT_EQ(m.pool().free_list(), (Ids{2, 3, 4, 5, 6, 7, 1, 0}));

  auto p = m.allocate_for_prompt(2, a);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 7);  // the last token runs again for its logits
  // ... and writes its K/V into a private copy of the cached block that holds it.
  ASSERT_EQ(p->copies.size(), 1u);
  EXPECT_EQ(p->copies[0].src, 1);
  EXPECT_EQ(p->copies[0].dst, 2);
  EXPECT_EQ(table(m, 2), (Ids{0, 2}));
  EXPECT_EQ(refs(m, 0), 1);
  EXPECT_EQ(refs(m, 1), 0);  // still cached, back at the LRU tail
  EXPECT_TRUE(m.pool().info(1).cached);
  EXPECT_FALSE(m.pool().info(2).cached);
  EXPECT_EQ(m.pool().free_list(), (Ids{3, 4, 5, 6, 7, 1}));
  EXPECT_EQ(m.commit_full_blocks(2, a), 0);  // already known through the source block
  EXPECT_FALSE(m.pool().info(2).cached);

  auto s = m.append_slot(2);  // decode continues in a new block
  ASSERT_TRUE(s);
  EXPECT_EQ(s->block, 3);
  EXPECT_EQ(s->offset, 0);
  EXPECT_FALSE(s->copy);

  // A live sharer: the last block is copied, the source keeps its owner.
  auto q = m.allocate_for_prompt(3, a);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->n_cached, 7);
  EXPECT_EQ(table(m, 3), (Ids{0, 4}));
  ASSERT_EQ(q->copies.size(), 1u);
  EXPECT_EQ(q->copies[0].src, 1);
  EXPECT_EQ(q->copies[0].dst, 4);
  EXPECT_EQ(refs(m, 0), 2);
  EXPECT_EQ(m.stats().hit_tokens, 14);
}

TEST(PrefixCache, AllCachedCopyIsRegisteredIfTheSourceWasEvicted) {
  KvCacheManager m(3, 4);
  const Toks a = iota_toks(0, 8);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  m.commit_full_blocks(1, a);
  m.free(1);
  auto p = m.allocate_for_prompt(2, a);
  ASSERT_TRUE(p);
  EXPECT_EQ(table(m, 2), (Ids{0, 2}));
  EXPECT_EQ(m.pool().free_list(), (Ids{1}));
  ASSERT_TRUE(m.allocate_for_prompt(3, Toks{9}));  // evicts the source block 1
  EXPECT_EQ(table(m, 3), (Ids{1}));
  EXPECT_EQ(m.commit_full_blocks(2, a), 1);  // the copy takes its place
  EXPECT_TRUE(m.pool().info(2).cached);
  m.free(3);
  auto q = m.allocate_for_prompt(4, cat(a, {5}));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->n_cached, 8);
  EXPECT_EQ(table(m, 4), (Ids{0, 2, 1}));
}

TEST(PrefixCache, CopyOnWriteWhenAppendingToASharedLastBlock) {
  KvCacheManager m(8, 4);
  ASSERT_TRUE(m.allocate_for_prompt(1, iota_toks(0, 6)));
  EXPECT_EQ(table(m, 1), (Ids{0, 1}));
  m.fork(1, 2);
  EXPECT_EQ(table(m, 2), (Ids{0, 1}));
  EXPECT_EQ(refs(m, 0), 2);
  EXPECT_EQ(refs(m, 1), 2);

  auto s = m.append_slot(2);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->block, 2);
  EXPECT_EQ(s->offset, 2);
  ASSERT_TRUE(s->copy);
  EXPECT_EQ(s->copy->src, 1);
  EXPECT_EQ(s->copy->dst, 2);
  EXPECT_EQ(table(m, 2), (Ids{0, 2}));
  EXPECT_EQ(refs(m, 1), 1);

  auto t = m.append_slot(1);  // now exclusive: no copy
  ASSERT_TRUE(t);
  EXPECT_EQ(t->block, 1);
  EXPECT_EQ(t->offset, 2);
  EXPECT_FALSE(t->copy);
  ASSERT_TRUE(m.append_slot(1));
  auto u = m.append_slot(1);  // block 1 full: a new block
  ASSERT_TRUE(u);
  EXPECT_EQ(u->block, 3);
  EXPECT_EQ(u->offset, 0);
  EXPECT_EQ(table(m, 1), (Ids{0, 1, 3}));
  EXPECT_EQ(m.n_tokens(1), 9);
  EXPECT_EQ(m.n_tokens(2), 7);
}

TEST(PrefixCache, ExhaustionReturnsNoneAndLeavesThePoolUnchanged) {
  KvCacheManager m(4, 4);
  const Toks a = iota_toks(0, 8);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  m.commit_full_blocks(1, a);
  m.free(1);
  ASSERT_TRUE(m.allocate_for_prompt(2, iota_toks(100, 12)));
  EXPECT_EQ(table(m, 2), (Ids{2, 3, 1}));
  EXPECT_EQ(m.pool().free_list(), (Ids{0}));

  // a + 4 tokens: block 0 would hit, but 2 more blocks are needed and only block 0 is free.
  const KvStats before = m.stats();
  EXPECT_EQ(m.allocate_for_prompt(3, cat(a, iota_toks(50, 4))), std::nullopt);
  EXPECT_FALSE(m.has_seq(3));
  EXPECT_EQ(m.pool().free_list(), (Ids{0}));
  EXPECT_EQ(refs(m, 0), 0);
  EXPECT_TRUE(m.pool().info(0).cached);
  EXPECT_EQ(m.stats().n_queries, before.n_queries);
  EXPECT_EQ(m.stats().blocks_cached, before.blocks_cached);

  auto s = m.append_slot(2);  // takes the last free block (evicting a's first block)
  ASSERT_TRUE(s);
  EXPECT_EQ(s->block, 0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.append_slot(2));
  EXPECT_EQ(m.n_tokens(2), 16);
  EXPECT_EQ(m.append_slot(2), std::nullopt);  // no cold tier: nothing to spill
  EXPECT_EQ(m.n_tokens(2), 16);
  EXPECT_EQ(table(m, 2), (Ids{2, 3, 1, 0}));
  EXPECT_EQ(m.stats().evictions, 2);
}

TEST(PrefixCache, DecodedBlocksBecomeFindableAfterCommit) {
  KvCacheManager m(8, 4);
  Toks seq = iota_toks(0, 3);
  ASSERT_TRUE(m.allocate_for_prompt(1, seq));
  for (int32_t t = 3; t < 9; ++t) {
    ASSERT_TRUE(m.append_slot(1));
    seq.push_back(t);
    m.commit_full_blocks(1, seq);
  }
  EXPECT_EQ(m.stats().blocks_cached, 2);
  auto p = m.allocate_for_prompt(2, cat(iota_toks(0, 8), {42}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_cached, 8);
  EXPECT_EQ(table(m, 2), (Ids{0, 1, 3}));
}

// A finished sequence's partly filled last block (commit_tail) is found by a prompt continuing
// the same chain: the matching rows are copied (CopyOp) instead of recomputed.
TEST(PrefixCache, TailOfAFinishedSequenceIsReusedToTheToken) {
  KvCacheManager m(10, 4);
  const Toks a = iota_toks(0, 10);  // blocks [0..4) [4..8) and a tail of 2 tokens
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  EXPECT_EQ(table(m, 1), (Ids{0, 1, 2}));
  EXPECT_FALSE(m.commit_tail(1, a)) << "full blocks must be committed first";
  EXPECT_EQ(m.commit_full_blocks(1, a), 2);
  EXPECT_TRUE(m.commit_tail(1, a));
  EXPECT_EQ(m.stats().blocks_cached, 3);
  m.free(1);

  // Continues the text: 8 from full blocks + 2 from the tail.
  const Toks b = cat(a, {50, 51, 52});
  auto pb = m.allocate_for_prompt(2, b);
  ASSERT_TRUE(pb);
  EXPECT_EQ(pb->n_cached, 10);
  EXPECT_EQ(pb->n_tail, 2);
  ASSERT_EQ(pb->copies.size(), 1u);
  EXPECT_EQ(pb->copies[0].src, 2);
  EXPECT_EQ(pb->copies[0].dst, table(m, 2)[2]);
  EXPECT_NE(table(m, 2)[2], 2) << "the cached tail itself is never written";
  EXPECT_EQ(refs(m, 2), 0);
  m.free(2);

  // Diverges inside the tail: only the common rows.
  auto pc = m.allocate_for_prompt(3, cat(iota_toks(0, 9), {77, 78}));
  ASSERT_TRUE(pc);
  EXPECT_EQ(pc->n_cached, 9);
  EXPECT_EQ(pc->n_tail, 1);
  m.free(3);

  // Exactly the tail's text: the last token is still computed.
  auto pd = m.allocate_for_prompt(4, a);
  ASSERT_TRUE(pd);
  EXPECT_EQ(pd->n_cached, 9);
  m.free(4);

  // Another namespace, or another parent chain: no tail.
  auto pe = m.allocate_for_prompt(5, b, "tenant-b");
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->n_cached, 0);
  m.free(5);
  auto pf = m.allocate_for_prompt(6, cat(cat(iota_toks(0, 4), {90, 91, 92, 93}), {8, 9, 1}));
  ASSERT_TRUE(pf);
  EXPECT_EQ(pf->n_cached, 4);
  EXPECT_EQ(pf->n_tail, 0);
  m.free(6);
}

// A cached tail is reused only after the very block it was computed after. With a hash that
// ignores the parent, the tail of [X | 8 9] (committed after the root X block) sits under the
// same key as a tail after [W, X]; once the root X block is evicted and X is registered again
// after W, the prompt [W, X, 8, 9, 7] finds that tail with matching tokens, but its K/V
// attended to X alone, not to W X: only the two full blocks are a hit.
// Catches: removing the tail's parent check (info.parent_reg == parent_reg) in
// KvCacheManager::allocate_for_prompt, which serves those two rows (n_cached 10, n_tail 2).
TEST(PrefixCache, TailRequiresTheSameParentBlock) {
  KvCacheManager m(4, 4);
  m.set_hash_fn_for_testing([](uint64_t, std::span<const int32_t> t) { return block_hash(0, t); });
  const Toks x = iota_toks(0, 4), w = iota_toks(20, 4), z = iota_toks(30, 4), tail = {8, 9};
  // X at the root, in block 0.
  ASSERT_TRUE(m.allocate_for_prompt(1, x));
  EXPECT_EQ(m.commit_full_blocks(1, x), 1);
  m.free(1);
  // X again (all cached: a private copy in block 1; block 0 is free, still cached), then the
  // tail: decoded into block 2, committed after X's chain (root block 0).
  auto p2 = m.allocate_for_prompt(2, x);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p2->n_cached, 3);
  ASSERT_TRUE(m.append_slot(2));
  ASSERT_TRUE(m.append_slot(2));
  const Toks xt = cat(x, tail);
  m.commit_full_blocks(2, xt);
  ASSERT_TRUE(m.commit_tail(2, xt));
  EXPECT_EQ(table(m, 2), (Ids{1, 2}));
  // [W, Z] takes blocks 3 and 0: the root X block is evicted.
  ASSERT_TRUE(m.allocate_for_prompt(3, cat(w, z)));
  EXPECT_EQ(table(m, 3), (Ids{3, 0}));
  m.commit_full_blocks(3, cat(w, z));
  m.free(3);
  // [W, X]: X registered again, now after W (block 0).
  auto p4 = m.allocate_for_prompt(4, cat(w, x));
  ASSERT_TRUE(p4);
  EXPECT_EQ(p4->n_cached, 4);
  EXPECT_EQ(m.commit_full_blocks(4, cat(w, x)), 1);
  m.free(4);
  m.free(2);
  auto p5 = m.allocate_for_prompt(5, cat(cat(cat(w, x), tail), {7}));
  ASSERT_TRUE(p5);
  EXPECT_EQ(p5->n_cached, 8) << "the tail computed after the root X block was served after W X";
  EXPECT_EQ(p5->n_tail, 0);
  EXPECT_TRUE(p5->copies.empty());
}

TEST(PrefixCache, TailIsEvictedLikeAnyCachedBlockAndReplacedByANewerOne) {
  KvCacheManager m(4, 4);
  const Toks a = iota_toks(0, 6);
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  m.commit_full_blocks(1, a);
  ASSERT_TRUE(m.commit_tail(1, a));
  m.free(1);
  // A newer tail after the same parent replaces the older one.
  const Toks a2 = cat(iota_toks(0, 4), {40, 41, 42});
  auto p2 = m.allocate_for_prompt(2, a2);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p2->n_cached, 4);
  m.commit_full_blocks(2, a2);
  ASSERT_TRUE(m.commit_tail(2, a2));
  m.free(2);
  auto p3 = m.allocate_for_prompt(3, cat(a2, {1}));
  ASSERT_TRUE(p3);
  EXPECT_EQ(p3->n_cached, 7);
  m.free(3);
  auto p4 = m.allocate_for_prompt(4, cat(a, {1}));
  ASSERT_TRUE(p4);
  EXPECT_EQ(p4->n_cached, 4) << "the older tail was replaced";
  m.free(4);
  // Filling the pool evicts cached blocks, tails included; afterwards nothing stale is found.
  ASSERT_TRUE(m.allocate_for_prompt(5, iota_toks(100, 16)));
  m.free(5);
  auto p6 = m.allocate_for_prompt(6, cat(a2, {1}));
  ASSERT_TRUE(p6);
  EXPECT_EQ(p6->n_cached, 0);
}

TEST(PrefixCache, MisuseThrows) {
  KvCacheManager m(4, 4);
  EXPECT_THROW(m.append_slot(9), Error);
  EXPECT_THROW(m.free(9), Error);
  EXPECT_THROW(m.allocate_for_prompt(1, Toks{}), Error);
  ASSERT_TRUE(m.allocate_for_prompt(1, Toks{1, 2}));
  EXPECT_THROW(m.allocate_for_prompt(1, Toks{1, 2}), Error);
  EXPECT_THROW(m.commit_full_blocks(1, iota_toks(0, 3)), Error);  // more tokens than reserved
  EXPECT_THROW(m.fork(1, 1), Error);
}


// Speculative decoding's rollback: slots of rejected drafts go back, emptied blocks return to
// the pool, committed blocks cannot be cut, and a rejected token never becomes a cache entry.
TEST(PrefixCache, TruncateGivesBackDraftSlots) {
  KvCacheManager m(10, 4);
  const Toks a = iota_toks(0, 6);  // one full block and a partial one
  ASSERT_TRUE(m.allocate_for_prompt(1, a));
  EXPECT_EQ(m.commit_full_blocks(1, a), 1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(m.append_slot(1));  // 11 slots: 3 blocks
  EXPECT_EQ(table(m, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(m.stats().blocks_used, 3);
  m.truncate(1, 7);  // drafts rejected after one accepted token
  EXPECT_EQ(m.n_tokens(1), 7);
  EXPECT_EQ(table(m, 1), (Ids{0, 1}));
  EXPECT_EQ(refs(m, 2), 0);
  EXPECT_EQ(m.stats().blocks_used, 2);
  auto s = m.append_slot(1);  // the next token lands right after the kept ones
  ASSERT_TRUE(s);
  EXPECT_EQ(s->block, 1);
  EXPECT_EQ(s->offset, 3);
  EXPECT_THROW(m.truncate(1, 3), Error);   // into the committed block
  EXPECT_THROW(m.truncate(1, 99), Error);  // beyond the slots held
  // Only the final tokens are committed: a prompt with other tokens in block 1 misses it.
  const Toks fin = cat(a, Toks{100, 101});
  EXPECT_EQ(m.commit_full_blocks(1, fin), 1);
  auto p2 = m.allocate_for_prompt(2, cat(cat(a, Toks{100, 102}), Toks{7}));
  ASSERT_TRUE(p2);
  EXPECT_EQ(p2->n_cached, 4);
}

}  // namespace
}  // namespace kvboost::kv
