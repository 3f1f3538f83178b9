// HostColdStore (host slots in front of the disk tier, with a caller's copy primitive) and the
// manager spilling from a hot tier that is not a PagedKvStorage: a stand-in for the CUDA device
// pools whose pieces are "device" addresses that only the copy primitive can dereference.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvboost/kv.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

using Ids = std::vector<BlockId>;
constexpr BlockId C = kColdBlock;
constexpr int64_t kBs = 4, kLayers = 2, kHeads = 2, kDim = 4;
constexpr size_t kPiece = size_t(kBs * kHeads * kDim) * sizeof(float);  // one layer's K (or V) of a block
constexpr size_t kBlock = 2 * kLayers * kPiece;

// "Device" addresses: real ones moved by a constant that makes them fault if anything but the
// copy primitive dereferences them (a memcpy, a pwritev: the disk tier would get EFAULT).
constexpr uintptr_t kTag = uintptr_t(1) << 62;
void* tag(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + kTag); }
template <class T>
T* untag(T* p, bool tagged) {
  return tagged ? reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) - kTag) : p;
}
bool is_tagged(const void* p) { return reinterpret_cast<uintptr_t>(p) >= kTag; }

// The copy primitive as the CUDA one behaves: either side may be "device" memory, copies are
// counted and "asynchronous" (wait counted), host memory from its own allocator.
struct FakeDevice {
  int64_t copies = 0, waits = 0, allocs = 0, releases = 0;
  size_t alloc_bytes = 0;
  SlotCopy fns() {
    SlotCopy c;
    c.ctx = this;
    c.copy = [](void* ctx, void* dst, const void* src, size_t n) {
      ++static_cast<FakeDevice*>(ctx)->copies;
      std::memcpy(untag(dst, is_tagged(dst)), untag(src, is_tagged(src)), n);
    };
    c.wait = [](void* ctx) { ++static_cast<FakeDevice*>(ctx)->waits; };
    c.alloc = [](void* ctx, size_t n) -> void* {
      auto* d = static_cast<FakeDevice*>(ctx);
      ++d->allocs, d->alloc_bytes += n;
      return std::malloc(n);
    };
    c.release = [](void* ctx, void* p) {
      ++static_cast<FakeDevice*>(ctx)->releases;
      std::free(p);
    };
    return c;
  }
};

// Device-style pools: K and V one allocation each, [n_layers][n_blocks][block_size][row]
// (gpu::PoolLayout), block pieces handed out tagged.
class FakeDeviceTier final : public HotTier {
 public:
  explicit FakeDeviceTier(int64_t n_blocks) : n_(n_blocks), k_(size_t(kLayers * n_blocks) * kPiece / 4), v_(k_.size()) {}
  int64_t n_blocks() const override { return n_; }
  int64_t block_size() const override { return kBs; }
  size_t block_bytes() const override { return kBlock; }
  std::vector<IoPiece> block_pieces(BlockId b) override {
    if (b < 0 || b >= n_) fail("FakeDeviceTier: block ", b);
    std::vector<IoPiece> out;
    for (int64_t l = 0; l < kLayers; ++l) {
      out.push_back({tag(block(0, l, b)), kPiece});
      out.push_back({tag(block(1, l, b)), kPiece});
    }
    return out;
  }
  float* block(int kv, int64_t l, BlockId b) {
    return (kv ? v_ : k_).data() + (l * n_ + b) * int64_t(kPiece / 4);
  }

 private:
  int64_t n_;
  std::vector<float> k_, v_;
};

float pattern(SeqId seq, int64_t pos, int64_t l, int kv, int64_t i) {
  return float(seq * 100000 + pos * 100 + l * 20 + kv * 10 + i);
}

void write_token(FakeDeviceTier& t, BlockId b, int64_t off, SeqId seq, int64_t pos) {
  for (int64_t l = 0; l < kLayers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t i = 0; i < kHeads * kDim; ++i) t.block(kv, l, b)[off * kHeads * kDim + i] = pattern(seq, pos, l, kv, i);
}

void expect_seq(FakeDeviceTier& t, const KvCacheManager& m, SeqId seq) {
  const auto tab = m.block_table(seq);
  for (int64_t pos = 0; pos < m.n_tokens(seq); ++pos) {
    const BlockId b = tab[size_t(pos / kBs)];
    ASSERT_NE(b, C) << "position " << pos;
    for (int64_t l = 0; l < kLayers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t i = 0; i < kHeads * kDim; ++i)
          ASSERT_EQ(t.block(kv, l, b)[(pos % kBs) * kHeads * kDim + i], pattern(seq, pos, l, kv, i))
              << "seq " << seq << " pos " << pos << " layer " << l << " kv " << kv;
  }
}

TEST(HostColdStore, HostSlotsThenTheNextTierLowestFirst) {
  const std::string dir = test::make_temp_dir("host_cold_slots");
  FileColdStore disk(dir, 64, /*max_slots=*/2);
  HostColdStore hs(64, 3, memcpy_slot_copy(), &disk);
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(hs.allocate_slot(), s);
  EXPECT_EQ(hs.allocate_slot(), 3);  // the disk's slot 0
  EXPECT_EQ(hs.allocate_slot(), 4);
  EXPECT_EQ(hs.allocate_slot(), std::nullopt);  // both tiers full
  EXPECT_EQ(hs.n_host_used(), 3);
  EXPECT_EQ(hs.n_next_used(), 2);
  EXPECT_EQ(hs.n_slots_used(), 5);
  EXPECT_EQ(disk.n_slots_used(), 2);
  hs.release_slot(1);
  hs.release_slot(3);
  EXPECT_EQ(disk.n_slots_used(), 1);
  EXPECT_EQ(hs.allocate_slot(), 1);  // a freed host slot before the disk
  EXPECT_EQ(hs.allocate_slot(), 3);
  EXPECT_THROW(hs.release_slot(7), Error);

  HostColdStore alone(64, 1);
  EXPECT_EQ(alone.allocate_slot(), 0);
  EXPECT_EQ(alone.allocate_slot(), std::nullopt);  // no next tier
  EXPECT_THROW(HostColdStore(64, 1, memcpy_slot_copy(), nullptr, 48), Error);  // 48 does not divide 64
  EXPECT_THROW(HostColdStore(32, 1, memcpy_slot_copy(), &disk), Error);        // slot sizes differ
}

TEST(HostColdStore, RoundTripsThroughBothTiersWithDevicePieces) {
  const std::string dir = test::make_temp_dir("host_cold_roundtrip");
  FakeDevice dev;
  FakeDeviceTier hot(8);
  FileColdStore disk(dir, kBlock);
  {
    HostColdStore hs(kBlock, 2, dev.fns(), &disk, kPiece, /*staging_bytes=*/kBlock);  // a one-slot staging buffer
    EXPECT_EQ(dev.allocs, 0);  // nothing allocated before the first slot
    for (BlockId b = 0; b < 4; ++b)
      for (int64_t off = 0; off < kBs; ++off) write_token(hot, b, off, 1, b * kBs + off);
    std::vector<int64_t> slots;
    std::vector<std::vector<IoPiece>> srcs;
    for (BlockId b = 0; b < 4; ++b) {
      slots.push_back(*hs.allocate_slot());
      srcs.push_back(hot.block_pieces(b));
    }
    EXPECT_EQ(slots, (std::vector<int64_t>{0, 1, 2, 3}));  // two host, two disk
    hs.write_batch(slots, srcs);
    EXPECT_GT(dev.waits, 0);
    // Back into blocks 4..7 in another order: host and disk slots in one batch.
    const std::vector<int64_t> order{3, 0, 2, 1};
    std::vector<std::vector<IoPiece>> dsts;
    for (BlockId b = 4; b < 8; ++b) dsts.push_back(hot.block_pieces(b));
    hs.read(order, dsts);
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t l = 0; l < kLayers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          EXPECT_EQ(std::memcmp(hot.block(kv, l, BlockId(4 + k)), hot.block(kv, l, BlockId(order[size_t(k)])), kPiece), 0)
              << "block " << 4 + k << " layer " << l << " kv " << kv;
    const IoPiece short_piece{tag(hot.block(0, 0, 0)), kPiece};
    EXPECT_THROW(hs.write(0, std::span(&short_piece, 1)), Error);
  }
  EXPECT_EQ(dev.allocs, 2);  // the host arena and the staging buffer, pinned once each
  EXPECT_EQ(dev.releases, 2);
  EXPECT_EQ(dev.alloc_bytes, 2 * kBlock + kBlock);
}

TEST(HostColdStore, AdjacentBlocksAndSlotsMoveInOneCopyPerPiece) {
  FakeDevice dev;
  FakeDeviceTier hot(8);
  HostColdStore hs(kBlock, 8, dev.fns(), nullptr, kPiece);
  std::vector<int64_t> slots;
  std::vector<std::vector<IoPiece>> srcs, dsts;
  for (BlockId b = 0; b < 4; ++b) {
    for (int64_t off = 0; off < kBs; ++off) write_token(hot, b, off, 2, b * kBs + off);
    slots.push_back(*hs.allocate_slot());
    srcs.push_back(hot.block_pieces(b));
    dsts.push_back(hot.block_pieces(BlockId(4 + b)));
  }
  hs.write_batch(slots, srcs);
  // Blocks 0..3 are adjacent in each layer's K and V pool, as slots 0..3 are in each stripe.
  EXPECT_EQ(hs.n_copies(), 2 * kLayers);
  hs.read(slots, dsts);
  EXPECT_EQ(hs.n_copies(), 4 * kLayers);
  for (BlockId b = 0; b < 4; ++b)
    for (int64_t l = 0; l < kLayers; ++l)
      EXPECT_EQ(std::memcmp(hot.block(0, l, BlockId(4 + b)), hot.block(0, l, b), kPiece), 0);
  // Scattered blocks cannot merge: one copy per piece and block.
  const int64_t before = hs.n_copies();
  const std::vector<int64_t> two{0, 2};
  const std::vector<std::vector<IoPiece>> d2{hot.block_pieces(7), hot.block_pieces(5)};
  hs.read(two, d2);
  EXPECT_EQ(hs.n_copies() - before, 2 * 2 * kLayers);
}

// The manager over a device-style hot tier, spilling to host slots and on to disk: a long decode
// reads back every byte, through both tiers.
TEST(HostColdStore, ManagerSpillsADeviceStyleHotTierToHostThenDisk) {
  const std::string dir = test::make_temp_dir("host_cold_manager");
  FakeDevice dev;
  FakeDeviceTier hot(4);
  FileColdStore disk(dir, kBlock);
  HostColdStore hs(kBlock, 2, dev.fns(), &disk, kPiece);
  KvCacheManager m(4, kBs);
  m.attach_cold_tier(&hot, &hs);
  std::vector<int32_t> t(6);
  for (int i = 0; i < 6; ++i) t[size_t(i)] = 1000 + i;
  ASSERT_TRUE(m.allocate_for_prompt(1, t));
  for (int64_t pos = 0; pos < 6; ++pos) write_token(hot, m.block_table(1)[size_t(pos / kBs)], pos % kBs, 1, pos);
  auto decode = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = m.n_tokens(1);
      auto s = m.append_slot(1);
      ASSERT_TRUE(s) << "position " << pos;
      ASSERT_FALSE(s->copy);
      write_token(hot, s->block, s->offset, 1, pos);
    }
  };
  decode(26);  // 32 tokens = 8 blocks over a pool of 4: 4 cold, 2 in host slots, 2 on disk
  const auto tab = m.block_table(1);
  EXPECT_EQ(std::count(tab.begin(), tab.end(), C), 4);
  EXPECT_EQ(m.stats().spills, 4);
  EXPECT_EQ(hs.n_host_used(), 2);
  EXPECT_EQ(hs.n_next_used(), 2);
  EXPECT_EQ(disk.n_slots_used(), 2);
  // Scan in ranges of two blocks, alternating direction as the Pager does; every byte intact.
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t first = pass % 2 == 0 ? 2 * r : 6 - 2 * r;
      ASSERT_TRUE(m.ensure_resident(1, first, 2));
      const auto tb = m.block_table(1);
      for (int64_t pos = first * kBs; pos < (first + 2) * kBs; ++pos)
        for (int64_t l = 0; l < kLayers; ++l)
          for (int kv = 0; kv < 2; ++kv)
            for (int64_t i = 0; i < kHeads * kDim; ++i)
              ASSERT_EQ(hot.block(kv, l, tb[size_t(pos / kBs)])[(pos % kBs) * kHeads * kDim + i], pattern(1, pos, l, kv, i))
                  << "pos " << pos;
    }
  EXPECT_GT(m.stats().page_ins, 0);
  EXPECT_EQ(m.stats().blocks_cold, hs.n_slots_used());
  // The whole table no longer fits: nullopt, nothing changed.
  EXPECT_EQ(m.ensure_resident(1, 0, 8), std::nullopt);
  m.free(1);
  EXPECT_EQ(hs.n_slots_used(), 0);
  EXPECT_EQ(disk.n_slots_used(), 0);
  // Re-attaching while blocks are cold is refused; with none cold it swaps the pair.
  m.attach_cold_tier(&hot, &hs);
}

TEST(HostColdStore, ManagerKeepsTwoSequencesExactAcrossWholeTablePageIns) {
  // The device engine's pattern: each pass makes one sequence's whole table resident, spilling
  // the other's blocks (LRU) to host slots.
  FakeDevice dev;
  FakeDeviceTier hot(6);
  HostColdStore hs(kBlock, 16, dev.fns(), nullptr, kPiece);
  KvCacheManager m(6, kBs);
  m.attach_cold_tier(&hot, &hs);
  for (SeqId s = 1; s <= 2; ++s) {
    std::vector<int32_t> t(8);
    for (int i = 0; i < 8; ++i) t[size_t(i)] = int32_t(s * 1000 + i);
    ASSERT_TRUE(m.allocate_for_prompt(s, t));
    for (int64_t pos = 0; pos < 8; ++pos) write_token(hot, m.block_table(s)[size_t(pos / kBs)], pos % kBs, s, pos);
  }
  for (int step = 0; step < 24; ++step) {
    const SeqId s = 1 + step % 2;
    ASSERT_TRUE(m.ensure_resident(s, 0, int64_t(m.block_table(s).size())));
    const int64_t pos = m.n_tokens(s);
    auto slot = m.append_slot(s);
    ASSERT_TRUE(slot);
    write_token(hot, slot->block, slot->offset, s, pos);
    ASSERT_TRUE(m.ensure_resident(s, 0, int64_t(m.block_table(s).size())));
    expect_seq(hot, m, s);
  }
  EXPECT_GT(m.stats().spills, 0);
  EXPECT_GT(m.stats().page_ins, 0);
}

}  // namespace
}  // namespace kvboost::kv
