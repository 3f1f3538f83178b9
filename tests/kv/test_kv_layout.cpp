// The K/V layout (kvboost/kv_layout.h): (sequence, position, layer) -> row mapping over a block
// table, row copy-in/out across block boundaries, key re-rotation against a scalar reference,
// and the cold-tier pager's range plan and paging.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kvboost/kernels.h"
#include "kvboost/kv.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

constexpr int64_t kBs = 4, kLayers = 3, kHeads = 2, kDim = 8, kRow = kHeads * kDim;

// A value unique to (position, layer, K/V, element), exact in f32.
float pattern(int64_t pos, int64_t l, int kv, int64_t i) { return float(pos * 1000 + l * 100 + kv * 50 + i); }

TEST(KvLayout, MapsPositionAndLayerThroughTheBlockTable) {
  PagedKvStorage st(6, kBs, kLayers, kHeads, kDim);
  const std::vector<BlockId> table = {4, 1, 5};  // positions 0-3 in block 4, 4-7 in 1, 8-11 in 5
  const KvLayout L = st.layout(table.data());
  EXPECT_EQ(L.row(), kRow);
  EXPECT_EQ(L.block_floats(), kBs * kRow);
  EXPECT_EQ(L.slot(0), 4 * kBs);
  EXPECT_EQ(L.slot(3), 4 * kBs + 3);
  EXPECT_EQ(L.slot(4), 1 * kBs);
  EXPECT_EQ(L.slot(9), 5 * kBs + 1);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(L.k_pool(l), st.k_pool(l));
    EXPECT_EQ(L.v_pool(l), st.v_pool(l));
    EXPECT_EQ(L.k_block(l, 5), st.k_block(l, 5));
    EXPECT_EQ(L.v_block(l, 1), st.v_block(l, 1));
    // the row of position 6 is row 2 of block 1, in each layer's own pools
    EXPECT_EQ(L.k_row(l, 6), st.k_block(l, 1) + 2 * kRow);
    EXPECT_EQ(L.v_row(l, 6), st.v_block(l, 1) + 2 * kRow);
  }
  EXPECT_NE(L.k_row(0, 6), L.k_row(1, 6));
  // another sequence's table over the same storage
  const std::vector<BlockId> other = {0, 2};
  EXPECT_EQ(L.with_table(other.data()).k_row(2, 5), st.k_block(2, 2) + 1 * kRow);
  // the one-block case (a contiguous cache): block_size = capacity, table {0}
  std::vector<float> k(size_t(2 * 10 * kRow)), v(k.size());
  float* kp[2] = {k.data(), k.data() + 10 * kRow};
  float* vp[2] = {v.data(), v.data() + 10 * kRow};
  const BlockId zero = 0;
  const KvLayout one{kp, vp, &zero, 10, kHeads, kDim};
  EXPECT_EQ(one.k_row(1, 7), k.data() + 10 * kRow + 7 * kRow);
  EXPECT_EQ(one.v_row(0, 9), v.data() + 9 * kRow);
}

TEST(KvLayout, RowsCopyInAndOutAcrossBlockBoundaries) {
  PagedKvStorage st(6, kBs, kLayers, kHeads, kDim);
  const std::vector<BlockId> table = {3, 0, 5, 2};
  const KvLayout L = st.layout(table.data());
  // rows [2, 13): the tail of block 3, all of blocks 0 and 5, the head of block 2
  const int64_t pos0 = 2, n = 11;
  for (int64_t l = 0; l < kLayers; ++l) {
    std::vector<float> k(size_t(n * kRow)), v(k.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < kRow; ++i)
        k[size_t(t * kRow + i)] = pattern(pos0 + t, l, 0, i), v[size_t(t * kRow + i)] = pattern(pos0 + t, l, 1, i);
    L.write_rows(l, pos0, n, k.data(), v.data());
  }
  // every row landed at block table[p / bs], row p % bs; nothing else was written
  for (int64_t l = 0; l < kLayers; ++l)
    for (BlockId b = 0; b < 6; ++b)
      for (int64_t r = 0; r < kBs; ++r) {
        int64_t pos = -1;
        for (size_t j = 0; j < table.size(); ++j)
          if (table[j] == b) pos = int64_t(j) * kBs + r;
        const bool written = pos >= pos0 && pos < pos0 + n;
        for (int64_t i = 0; i < kRow; ++i) {
          ASSERT_EQ(st.k_block(l, b)[r * kRow + i], written ? pattern(pos, l, 0, i) : 0.0f)
              << "layer " << l << " block " << b << " row " << r;
          ASSERT_EQ(st.v_block(l, b)[r * kRow + i], written ? pattern(pos, l, 1, i) : 0.0f);
        }
      }
  // reading back any sub-range gives the rows; a null half is left alone
  std::vector<float> k(size_t(7 * kRow), -1.0f), v(k.size(), -1.0f);
  L.read_rows(1, 5, 7, k.data(), v.data());
  for (int64_t t = 0; t < 7; ++t)
    for (int64_t i = 0; i < kRow; ++i) {
      ASSERT_EQ(k[size_t(t * kRow + i)], pattern(5 + t, 1, 0, i));
      ASSERT_EQ(v[size_t(t * kRow + i)], pattern(5 + t, 1, 1, i));
    }
  std::vector<float> only_v(size_t(3 * kRow), -1.0f);
  L.read_rows(2, 3, 3, nullptr, only_v.data());
  EXPECT_EQ(only_v[0], pattern(3, 2, 1, 0));
  std::vector<float> zeros(size_t(2 * kRow), 0.0f);
  L.write_rows(0, 4, 2, nullptr, zeros.data());  // V rows 4-5 of layer 0 cleared, K kept
  EXPECT_EQ(L.v_row(0, 5)[3], 0.0f);
  EXPECT_EQ(L.k_row(0, 5)[3], pattern(5, 0, 0, 3));
}

TEST(KvLayout, RotateKeysMatchesAScalarRopeReference) {
  PagedKvStorage st(5, kBs, kLayers, kHeads, kDim);
  const std::vector<BlockId> table = {2, 4, 0};
  const KvLayout L = st.layout(table.data());
  std::vector<float> inv_freq(size_t(kDim / 2));
  for (int64_t i = 0; i < kDim / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / kDim));
  const int64_t pos0 = 1, n = 10, delta = 37, l = 1;
  std::vector<float> k(size_t(n * kRow)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * float(i)) * 2.0f, v[i] = float(i);
  L.write_rows(l, pos0, n, k.data(), v.data());
  L.rotate_keys(l, pos0, n, inv_freq.data(), delta);
  // the rotate-half pairs (i, i + head_dim/2) turned by delta * inv_freq[i], in double
  std::vector<float> got_k(k.size()), got_v(v.size());
  L.read_rows(l, pos0, n, got_k.data(), got_v.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < kDim / 2; ++i) {
        const size_t a = size_t(t * kRow + h * kDim + i), b = a + size_t(kDim / 2);
        const double ang = double(delta) * double(inv_freq[size_t(i)]);
        const double ra = double(k[a]) * std::cos(ang) - double(k[b]) * std::sin(ang);
        const double rb = double(k[b]) * std::cos(ang) + double(k[a]) * std::sin(ang);
        EXPECT_NEAR(got_k[a], ra, 1e-5) << "row " << t << " head " << h << " pair " << i;
        EXPECT_NEAR(got_k[b], rb, 1e-5);
      }
  EXPECT_EQ(got_v, v);  // values are not rotated
  // bit-identical to rotating the contiguous rows with the kernel (what reuse did before)
  std::vector<float> want = k;
  kernels::rope_shift(want.data(), n, kHeads, kDim, inv_freq.data(), delta);
  EXPECT_EQ(got_k, want);
  // other layers and the rows outside the range are untouched
  EXPECT_EQ(L.k_row(l, 0)[0], 0.0f);
  EXPECT_EQ(L.k_row(0, 3)[0], 0.0f);
  // rotating back by -delta restores the keys (to rounding)
  L.rotate_keys(l, pos0, n, inv_freq.data(), -delta);
  L.read_rows(l, pos0, n, got_k.data(), nullptr);
  for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(got_k[i], k[i], 1e-5);
}

TEST(Pager, RangePlanAlternatesDirectionPerLayer) {
  KvCacheManager m(8, kBs);
  const Pager inactive;
  EXPECT_FALSE(inactive.active());
  const Pager p(m, 1, 3);
  EXPECT_TRUE(p.active());
  EXPECT_EQ(p.range_blocks(), 3);
  EXPECT_EQ(p.n_ranges(7), 3);
  EXPECT_EQ(p.n_ranges(6), 2);
  auto ranges = [&](int64_t layer, int64_t n_blocks) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t i = 0; i < p.n_ranges(n_blocks); ++i) {
      const BlockRange r = p.range(layer, i, n_blocks);
      out.emplace_back(r.first, r.n);
    }
    return out;
  };
  using V = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(ranges(0, 7), (V{{0, 3}, {3, 3}, {6, 1}}));  // even layers: first to last
  EXPECT_EQ(ranges(1, 7), (V{{6, 1}, {3, 3}, {0, 3}}));  // odd layers: last to first
  EXPECT_EQ(ranges(2, 2), (V{{0, 2}}));
  EXPECT_EQ(Pager(m, 1, 0).range_blocks(), 1);  // at least one block per range
}

TEST(Pager, MakesRangesResidentThroughTheManager) {
  const std::string dir = test::make_temp_dir("kv_layout_pager");
  PagedKvStorage st(4, kBs, kLayers, kHeads, kDim);
  FileColdStore cold(dir, st.block_bytes());
  KvCacheManager m(4, kBs);
  m.attach_cold_tier(&st, &cold);
  std::vector<int32_t> prompt(3);
  std::iota(prompt.begin(), prompt.end(), 1);
  ASSERT_TRUE(m.allocate_for_prompt(1, prompt));
  // 24 tokens through the layout, spilling to the cold tier on the way
  for (int64_t pos = 0; pos < 24; ++pos) {
    if (pos >= 3) {
      ASSERT_TRUE(m.append_slot(1));
    }
    const KvLayout L = st.layout(m.block_table(1).data());
    for (int64_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(static_cast<size_t>(kRow)), v(static_cast<size_t>(kRow));
      for (int64_t i = 0; i < kRow; ++i) k[size_t(i)] = pattern(pos, l, 0, i), v[size_t(i)] = pattern(pos, l, 1, i);
      L.write_rows(l, pos, 1, k.data(), v.data());
    }
  }
  EXPECT_GT(m.stats().spills, 0);
  // the pager's plan over the 6 blocks, in ranges of 2: every row comes back intact
  const Pager p(m, 1, 2);
  for (int64_t layer = 0; layer < kLayers; ++layer)
    for (int64_t i = 0; i < p.n_ranges(6); ++i) {
      const BlockRange r = p.range(layer, i, 6);
      const KvLayout L = st.layout(p.make_resident(r));
      for (int64_t pos = r.first * kBs; pos < (r.first + r.n) * kBs; ++pos)
        for (int64_t i2 = 0; i2 < kRow; ++i2) {
          ASSERT_EQ(L.k_row(layer, pos)[i2], pattern(pos, layer, 0, i2)) << "pos " << pos << " layer " << layer;
          ASSERT_EQ(L.v_row(layer, pos)[i2], pattern(pos, layer, 1, i2));
        }
    }
  EXPECT_GT(m.stats().page_ins, 0);
  // more blocks than the hot pool holds: an Error naming the sizes, not a crash
  try {
    p.make_resident({0, 6});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot page in 6 blocks (hot pool of 4 blocks)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvboost::kv
