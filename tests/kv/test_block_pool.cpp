// BlockPool and block hashing: exact ids, ref counts and free-list (LRU) order.
#include <gtest/gtest.h>

#include <vector>

#include "kvboost/kv.h"

namespace kvboost::kv {
namespace {

using Ids = std::vector<BlockId>;

TEST(BlockPool, AllocatesInOrderAndReturnsNoneWhenExhausted) {
  BlockPool pool(3, 4);
  EXPECT_EQ(pool.free_list(), (Ids{0, 1, 2}));
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), std::nullopt);  // running out is a value, not an exception
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_EQ(pool.n_used(), 3);
  for (BlockId b : {0, 1, 2}) EXPECT_EQ(pool.info(b).ref_count, 1);
}

TEST(BlockPool, FreedBlocksGoToTailAndRefRemovesThem) {
  BlockPool pool(4, 4);
  for (int i = 0; i < 3; ++i) pool.allocate();
  pool.unref(1);
  EXPECT_EQ(pool.free_list(), (Ids{3, 1}));
  pool.unref(0);
  EXPECT_EQ(pool.free_list(), (Ids{3, 1, 0}));
  pool.ref(1);  // touch: leaves the free list
  EXPECT_EQ(pool.free_list(), (Ids{3, 0}));
  EXPECT_EQ(pool.info(1).ref_count, 1);
  pool.ref(1);
  EXPECT_EQ(pool.info(1).ref_count, 2);
  pool.unref(1);
  EXPECT_EQ(pool.free_list(), (Ids{3, 0}));  // still referenced
  pool.unref(1);
  EXPECT_EQ(pool.free_list(), (Ids{3, 0, 1}));
  EXPECT_THROW(pool.unref(1), Error);
  EXPECT_THROW(pool.ref(4), Error);
}

TEST(BlockPool, CachedFreeBlockStaysFindableUntilReused) {
  BlockPool pool(2, 2);
  const BlockId a = *pool.allocate(), b = *pool.allocate();
  const std::vector<int32_t> toks{5, 6};
  const uint64_t reg = pool.register_full(b, 77, toks, 0, 0);
  EXPECT_EQ(reg, 1u);
  EXPECT_EQ(pool.n_cached(), 1);
  pool.unref(b);
  pool.unref(a);
  EXPECT_EQ(pool.free_list(), (Ids{1, 0}));
  EXPECT_EQ(pool.find(77), b);  // free but cached
  EXPECT_EQ(pool.info(b).tokens, toks);
  EXPECT_EQ(pool.allocate(), b);  // head of the LRU: reused, so its hash is evicted
  EXPECT_EQ(pool.find(77), std::nullopt);
  EXPECT_FALSE(pool.info(b).cached);
  EXPECT_EQ(pool.info(b).reg_id, 0u);
  EXPECT_EQ(pool.n_evictions(), 1);
  EXPECT_EQ(pool.n_cached(), 0);
}

TEST(BlockPool, RegistrationIdsAreUniqueAndDuplicatesRejected) {
  BlockPool pool(3, 1);
  const std::vector<int32_t> t{1};
  EXPECT_EQ(pool.register_full(*pool.allocate(), 10, t, 0, 0), 1u);
  const BlockId b = *pool.allocate();
  EXPECT_THROW(pool.register_full(b, 10, t, 0, 0), Error);  // hash taken
  EXPECT_EQ(pool.register_full(b, 11, t, 0, 1), 2u);
  EXPECT_THROW(pool.register_full(b, 12, t, 0, 1), Error);  // already registered
  EXPECT_THROW(pool.register_full(*pool.allocate(), 13, std::vector<int32_t>{1, 2}, 0, 0), Error);
  pool.drop_hash(b);
  EXPECT_EQ(pool.find(11), std::nullopt);
  EXPECT_EQ(pool.info(b).ref_count, 1);  // dropping the hash keeps the reference
}

TEST(BlockPool, AllocateNIsAllOrNothing) {
  BlockPool pool(3, 4);
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.allocate_n(4, &out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_TRUE(pool.allocate_n(2, &out));
  EXPECT_EQ(out, (Ids{0, 1}));
}

TEST(BlockPool, BlocksForBudget) {
  // One block: K and V, 2 layers, 16 tokens, 4 heads of 8 floats = 2*2*16*4*8*4 = 8192 bytes.
  EXPECT_EQ(PagedKvStorage::bytes_per_block(16, 2, 4, 8), 8192u);
  EXPECT_EQ(BlockPool::blocks_for_budget(100000, 16, 2, 4, 8), 12);
  EXPECT_EQ(BlockPool::blocks_for_budget(8191, 16, 2, 4, 8), 0);
  // Qwen2.5-0.5B: 24 layers, 2 KV heads of 64: 1 GiB holds 2730 blocks of 16 tokens.
  EXPECT_EQ(BlockPool::blocks_for_budget(size_t(1) << 30, 16, 24, 2, 64), 2730);
}

TEST(BlockPool, HighWaterCountsBlocksEverHandedOut) {
  BlockPool pool(4, 4);
  EXPECT_EQ(pool.high_water(), 0);
  pool.allocate();
  pool.allocate();
  EXPECT_EQ(pool.high_water(), 2);
  pool.unref(0);  // freed blocks go behind the never-used ones...
  pool.unref(1);
  EXPECT_EQ(pool.allocate(), 2);  // ...so untouched memory is handed out in id order
  EXPECT_EQ(pool.high_water(), 3);
  pool.allocate();
  pool.allocate();  // block 0 again
  EXPECT_EQ(pool.high_water(), 4);
}

// prefault commits memory without changing it: blocks already written keep their values, the
// rest read as zeros, and a range past the pool is clipped or refused.
TEST(PagedKvStorage, PrefaultKeepsContents) {
  PagedKvStorage st(64, 16, 3, 2, 64);  // 16 KiB per block and layer: whole pages
  for (int64_t l = 0; l < 3; ++l) {
    st.k_block(l, 5)[7] = 1.5f + float(l);
    st.v_block(l, 6)[0] = -2.0f;
  }
  if (!st.prefault(0, 64)) GTEST_SKIP() << "MADV_POPULATE_WRITE not supported by this kernel";
  EXPECT_TRUE(st.prefault(60, 100));  // clipped to the pool
  EXPECT_FALSE(st.prefault(64, 1));
  EXPECT_FALSE(st.prefault(-1, 1));
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(st.k_block(l, 5)[7], 1.5f + float(l));
    EXPECT_EQ(st.v_block(l, 6)[0], -2.0f);
    EXPECT_EQ(st.k_block(l, 63)[st.block_floats() - 1], 0.0f);
    EXPECT_EQ(st.v_block(l, 0)[0], 0.0f);
  }
}

TEST(BlockHash, ChainsParentTokensAndNamespace) {
  const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  const uint64_t root = namespace_root_hash("");
  EXPECT_EQ(block_hash(root, a), block_hash(root, a));
  EXPECT_NE(block_hash(root, a), block_hash(root, b));
  EXPECT_NE(block_hash(root, a), block_hash(root + 1, a));
  EXPECT_NE(namespace_root_hash("alice"), namespace_root_hash("bob"));
  EXPECT_NE(block_hash(namespace_root_hash("alice"), a), block_hash(namespace_root_hash("bob"), a));
}

}  // namespace
}  // namespace kvboost::kv
