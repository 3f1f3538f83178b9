// PagedKvStorage layout, FileColdStore, and spilling running sequences to the cold tier and
// paging them back, verified byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvboost/kv.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

using Ids = std::vector<BlockId>;
constexpr BlockId C = kColdBlock;
constexpr int64_t kBs = 4, kLayers = 2, kHeads = 2, kDim = 4;

Ids table(const KvCacheManager& m, SeqId s) {
  auto t = m.block_table(s);
  return Ids(t.begin(), t.end());
}

// A value unique to (sequence, position, layer, K/V, head, dim), exact in f32.
float pattern(SeqId seq, int64_t pos, int64_t l, int kv, int64_t h, int64_t d) {
  return float(seq * 100000 + pos * 100 + l * 20 + kv * 10 + h * kDim + d);
}

// Writes token pos's K/V the way the model would: row `offset` of `block`.
void write_token(PagedKvStorage& st, BlockId block, int64_t offset, SeqId seq, int64_t pos) {
  for (int64_t l = 0; l < kLayers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      float* row = (kv ? st.v_block(l, block) : st.k_block(l, block)) + offset * kHeads * kDim;
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t d = 0; d < kDim; ++d) row[h * kDim + d] = pattern(seq, pos, l, kv, h, d);
    }
}

// Checks tokens of blocks [first, first + n) of seq's table, which must be resident.
void expect_tokens(const PagedKvStorage& st, const KvCacheManager& m, SeqId seq, int64_t first,
                   int64_t n) {
  const auto t = m.block_table(seq);
  for (int64_t pos = first * kBs; pos < std::min((first + n) * kBs, m.n_tokens(seq)); ++pos) {
    const BlockId b = t[size_t(pos / kBs)];
    ASSERT_NE(b, C) << "position " << pos;
    for (int64_t l = 0; l < kLayers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        const float* row = (kv ? st.v_block(l, b) : st.k_block(l, b)) + (pos % kBs) * kHeads * kDim;
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t d = 0; d < kDim; ++d)
            ASSERT_EQ(row[h * kDim + d], pattern(seq, pos, l, kv, h, d))
                << "seq " << seq << " pos " << pos << " layer " << l << " kv " << kv;
      }
  }
}

TEST(PagedKvStorage, LayoutAndCopyBlock) {
  PagedKvStorage st(3, kBs, kLayers, kHeads, kDim);
  EXPECT_EQ(st.block_floats(), kBs * kHeads * kDim);
  EXPECT_EQ(st.block_bytes(), size_t(2 * kLayers * kBs * kHeads * kDim * 4));
  // [n_blocks][block_size][n_kv_heads][head_dim] per layer, K and V separate pools.
  EXPECT_EQ(st.k_block(1, 2) - st.k_pool(1), 2 * st.block_floats());
  EXPECT_EQ(st.v_block(0, 1) - st.v_pool(0), st.block_floats());
  EXPECT_EQ(st.k_block(0, 0)[0], 0.0f);  // zero-filled
  for (int64_t off = 0; off < kBs; ++off) write_token(st, 1, off, 7, off);
  st.copy_block(1, 2);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(std::memcmp(st.k_block(l, 1), st.k_block(l, 2), size_t(st.block_floats()) * 4), 0);
    EXPECT_EQ(std::memcmp(st.v_block(l, 1), st.v_block(l, 2), size_t(st.block_floats()) * 4), 0);
  }
  EXPECT_EQ(st.block_pieces(2).size(), size_t(2 * kLayers));
  EXPECT_THROW(st.copy_block(0, 3), Error);
}

TEST(FileColdStore, BatchedReadsCoalesceAdjacentSlots) {
  const std::string dir = test::make_temp_dir("kv_cold_store");
  FileColdStore cs(dir, 4 * sizeof(float), /*max_slots=*/5);
  std::vector<float> src(16), dst(16, -1.0f);
  for (int i = 0; i < 16; ++i) src[size_t(i)] = float(i);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(cs.allocate_slot(), s);
    // Two pieces per block, as a layered storage gathers them.
    const IoPiece p[2] = {{&src[size_t(4 * s)], 8}, {&src[size_t(4 * s + 2)], 8}};
    cs.write(s, p);
  }
  const int64_t slots[4] = {2, 0, 3, 1};
  std::vector<std::vector<IoPiece>> dsts;
  for (int k = 0; k < 4; ++k) dsts.push_back({{&dst[size_t(4 * k)], 16}});
  cs.read(slots, dsts);
  EXPECT_EQ(cs.n_read_calls(), 1);  // slots 0..3 are one run
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(dst[size_t(4 * k + i)], float(4 * slots[k] + i));

  cs.release_slot(2);
  cs.release_slot(1);
  EXPECT_EQ(cs.n_slots_used(), 2);
  EXPECT_EQ(cs.allocate_slot(), 1);  // lowest first
  EXPECT_EQ(cs.allocate_slot(), 2);
  EXPECT_EQ(cs.allocate_slot(), 4);
  EXPECT_EQ(cs.allocate_slot(), std::nullopt);  // max_slots
  const IoPiece short_piece{src.data(), 4};
  EXPECT_THROW(cs.write(0, std::span(&short_piece, 1)), Error);
  EXPECT_THROW(FileColdStore("/nonexistent/kvboost", 16), Error);
}

struct SpillFixture : ::testing::Test {
  void SetUp() override {
    dir = test::make_temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  // A hot pool of n_blocks with a cold tier (at most max_slots) attached.
  void make(int64_t n_blocks, int64_t max_slots = -1) {
    st = std::make_unique<PagedKvStorage>(n_blocks, kBs, kLayers, kHeads, kDim);
    cold = std::make_unique<FileColdStore>(dir, st->block_bytes(), max_slots);
    m = std::make_unique<KvCacheManager>(n_blocks, kBs);
    m->attach_cold_tier(st.get(), cold.get());
  }
  void prompt(SeqId seq, int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(seq * 1000 + i);
    ASSERT_TRUE(m->allocate_for_prompt(seq, t));
    const auto tab = m->block_table(seq);
    for (int64_t pos = 0; pos < n; ++pos) write_token(*st, tab[size_t(pos / kBs)], pos % kBs, seq, pos);
  }
  void decode(SeqId seq, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = m->n_tokens(seq);
      auto s = m->append_slot(seq);
      ASSERT_TRUE(s) << "position " << pos;
      if (s->copy) st->copy_block(s->copy->src, s->copy->dst);
      write_token(*st, s->block, s->offset, seq, pos);
    }
  }
  std::string dir;
  std::unique_ptr<PagedKvStorage> st;
  std::unique_ptr<FileColdStore> cold;
  std::unique_ptr<KvCacheManager> m;
};

TEST_F(SpillFixture, LongDecodeSpillsLruBlocksAndPagesThemBack) {
  make(4);
  prompt(1, 6);
  decode(1, 10);  // 16 tokens: the hot pool is full
  EXPECT_EQ(table(*m, 1), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(m->stats().spills, 0);
  decode(1, 8);  // 24 tokens: the two least recently written blocks go cold, in that order
  EXPECT_EQ(table(*m, 1), (Ids{C, C, 2, 3, 0, 1}));
  EXPECT_EQ(m->stats().spills, 2);
  EXPECT_EQ(m->stats().blocks_cold, 2);
  EXPECT_EQ(cold->n_slots_used(), 2);
  expect_tokens(*st, *m, 1, 2, 4);

  // Paging blocks 0-1 back spills the LRU blocks outside that range (not the last block).
  EXPECT_EQ(m->ensure_resident(1, 0, 2), 2);
  EXPECT_EQ(table(*m, 1), (Ids{2, 3, C, C, 0, 1}));
  EXPECT_EQ(cold->n_read_calls(), 1);  // both blocks in one coalesced read
  expect_tokens(*st, *m, 1, 0, 2);
  EXPECT_EQ(m->ensure_resident(1, 0, 2), 0);  // already resident

  EXPECT_EQ(m->ensure_resident(1, 2, 2), 2);
  EXPECT_EQ(table(*m, 1), (Ids{C, 3, 0, 2, C, 1}));
  expect_tokens(*st, *m, 1, 2, 2);

  // A full scan in ranges of two blocks sees every byte intact.
  for (int64_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(m->ensure_resident(1, 2 * r, 2));
    expect_tokens(*st, *m, 1, 2 * r, 2);
  }
  // Decoding goes on; the last block is always hot.
  decode(1, 5);
  EXPECT_NE(table(*m, 1).back(), C);
  for (int64_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(m->ensure_resident(1, 2 * r, std::min<int64_t>(2, 7 - 2 * r)));
    expect_tokens(*st, *m, 1, 2 * r, 2);
  }
  const KvStats s = m->stats();
  EXPECT_GT(s.page_ins, 0);
  EXPECT_EQ(s.blocks_cold, cold->n_slots_used());

  m->free(1);
  EXPECT_EQ(cold->n_slots_used(), 0);
  EXPECT_EQ(m->stats().blocks_cold, 0);
  EXPECT_EQ(m->pool().n_free(), 4);
}

TEST_F(SpillFixture, EnsureResidentFailsWithoutChangesWhenTheRangeCannotFit) {
  make(4);
  prompt(1, 6);
  decode(1, 18);
  ASSERT_EQ(table(*m, 1), (Ids{C, C, 2, 3, 0, 1}));
  EXPECT_EQ(m->ensure_resident(1, 0, 5), std::nullopt);  // 5 blocks + the last > 4
  EXPECT_EQ(table(*m, 1), (Ids{C, C, 2, 3, 0, 1}));
  EXPECT_EQ(m->stats().spills, 2);
  EXPECT_THROW(m->ensure_resident(1, 5, 2), Error);
}

TEST_F(SpillFixture, VictimsAreTheLeastRecentlyUsedAcrossSequences) {
  make(4);
  prompt(1, 8);
  prompt(2, 8);
  EXPECT_EQ(table(*m, 1), (Ids{0, 1}));
  EXPECT_EQ(table(*m, 2), (Ids{2, 3}));
  decode(1, 1);  // sequence 1's first block is the oldest
  EXPECT_EQ(table(*m, 1), (Ids{C, 1, 0}));
  decode(2, 1);  // then sequence 1's second block, older than all of sequence 2's
  EXPECT_EQ(table(*m, 1), (Ids{C, C, 0}));
  EXPECT_EQ(table(*m, 2), (Ids{2, 3, 1}));
  decode(2, 3);
  decode(1, 3);
  expect_tokens(*st, *m, 2, 0, 3);
  ASSERT_EQ(m->ensure_resident(1, 0, 2), 2);
  expect_tokens(*st, *m, 1, 0, 3);
  expect_tokens(*st, *m, 2, 2, 1);  // the last block of sequence 2 stayed
}

TEST_F(SpillFixture, SharedBlocksAndAFullColdStoreAreNotSpilled) {
  make(3);
  prompt(1, 8);
  m->fork(1, 2);
  decode(1, 1);  // the one free block
  EXPECT_EQ(m->append_slot(2), std::nullopt);  // blocks 0 and 1 are shared: no victim
  EXPECT_EQ(m->stats().spills, 0);

  make(3, /*max_slots=*/0);
  prompt(1, 12);
  EXPECT_EQ(m->append_slot(1), std::nullopt);  // victims exist but the cold tier is full
  EXPECT_EQ(table(*m, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(m->n_tokens(1), 12);
}

TEST_F(SpillFixture, SpilledCachedBlocksAreNoLongerFindable) {
  make(3);
  std::vector<int32_t> t{1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(m->allocate_for_prompt(1, t));
  m->commit_full_blocks(1, t);
  EXPECT_EQ(m->stats().blocks_cached, 2);
  decode(1, 5);  // third block, then a fourth: block 0 (cached, exclusive) spills
  EXPECT_EQ(table(*m, 1), (Ids{C, 1, 2, 0}));
  // Block 0's hot copy was handed out again, so its hash is gone; block 1 stays registered (but
  // unreachable: a lookup must first hit its parent).
  const uint64_t h0 = block_hash(namespace_root_hash(""), std::span(t).first(4));
  EXPECT_EQ(m->pool().find(h0), std::nullopt);
  EXPECT_EQ(m->stats().blocks_cached, 1);
  EXPECT_TRUE(m->pool().info(1).cached);
}

}  // namespace
}  // namespace kvboost::kv
