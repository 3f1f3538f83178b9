// The chunk store against a hostile or damaged folder and a greedy tenant (issue 23): a FIFO or a
// symlink among the files must not hang or redirect it, verify_disk() (kvboost cache --verify)
// checks every checksum, and pins are bounded by ram_bytes and by each owner's share.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "kvboost/kv.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

const ChunkShape kShape{2, 2, 8};

std::shared_ptr<Chunk> chunk(uint32_t seed, int64_t n = 16) {
  auto c = std::make_shared<Chunk>();
  for (int64_t i = 0; i < n; ++i) c->tokens.push_back(int32_t(seed * 1000 + i));
  c->keys = chunk_keys(chunk_first_keys(chunk_root("m", "")), chunk_root("m", ""), c->tokens);
  chunk_init(*c, kShape, KvQuant::kF32, n);
  std::vector<float> k(size_t(n * kShape.row()), float(seed));
  for (int64_t l = 0; l < kShape.n_layers; ++l) chunk_put_layer(*c, kShape, l, k.data(), k.data());
  return c;
}

ChunkStoreOptions disk_options(const std::string& dir) {
  ChunkStoreOptions o;
  o.ram_bytes = size_t(8) << 20;
  o.disk_dir = dir;
  o.model_id = "m";
  return o;
}

// Finding: a FIFO in the chunk-store folder hung generate, cache and serve (SIGTERM ignored).
TEST(ChunkStoreFiles, FifoAndSymlinkInTheFolderAreRefusedNotFollowed) {
  const std::string dir = test::make_temp_dir("store_fifo");
  {
    ChunkStore st(kShape, disk_options(dir));
    st.put(chunk(1));
    st.flush();
  }
  ASSERT_EQ(::mkfifo((dir + "/ffffffffffffffff.kvc").c_str(), 0644), 0);
  const std::string outside = test::make_temp_dir("store_outside") + "/target";
  std::ofstream(outside) << "not yours";
  ASSERT_EQ(::symlink(outside.c_str(), (dir + "/eeeeeeeeeeeeeeee.kvc").c_str()), 0);
  ChunkStore st(kShape, disk_options(dir));  // returns (the FIFO is opened O_NONBLOCK, then refused)
  const ChunkStats s = st.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.corrupt, 2);
  std::string all;
  for (const auto& m : s.corrupt_files) all += m + "\n";
  EXPECT_NE(all.find("not a regular file"), std::string::npos) << all;
  EXPECT_NE(all.find("cannot open"), std::string::npos) << all;  // O_NOFOLLOW: ELOOP
  EXPECT_TRUE(std::ifstream(outside).good()) << "the symlink's target must be left alone";
  EXPECT_TRUE(st.find_prefix(chunk(1)->keys, chunk(1)->tokens));
}

// Finding: `kvboost cache` reported "corrupt 0" after a payload bit-flip (start-up checks only
// headers and sizes). verify_disk() reads every file and checks its checksum.
TEST(ChunkStoreFiles, VerifyDiskFindsAPayloadBitFlip) {
  const std::string dir = test::make_temp_dir("store_verify");
  {
    ChunkStore st(kShape, disk_options(dir));
    st.put(chunk(1));
    st.put(chunk(2));
    st.flush();
  }
  const std::vector<std::string> names = test::list_dir(dir);
  ASSERT_EQ(names.size(), 2u);
  const std::string victim = dir + "/" + names[0];
  std::string bytes = read_file(victim);
  bytes[bytes.size() - 3] ^= 0x01;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  ChunkStore st(kShape, disk_options(dir));
  EXPECT_EQ(st.stats().corrupt, 0) << "the start-up scan does not read payloads";
  EXPECT_EQ(st.verify_disk(), 1);
  const ChunkStats s = st.stats();
  EXPECT_EQ(s.corrupt, 1);
  EXPECT_EQ(s.entries, 1);
  ASSERT_FALSE(s.corrupt_files.empty());
  EXPECT_NE(s.corrupt_files.back().find("checksum"), std::string::npos) << s.corrupt_files.back();
  EXPECT_EQ(st.verify_disk(), 0);
}

// Finding: /v1/warm pinned without limit. Pins count against ram_bytes and per-owner shares.
TEST(ChunkStoreFiles, PinsAreBoundedPerOwnerAndInAll) {
  const size_t one = chunk(1)->bytes();
  ChunkStoreOptions o;
  o.ram_bytes = one * 4 + one / 2;
  o.max_pinned_per_owner = one * 2;
  o.model_id = "m";
  ChunkStore st(kShape, o);
  EXPECT_TRUE(st.put(chunk(1), true, {}, "a"));
  EXPECT_TRUE(st.put(chunk(2), true, {}, "a"));
  EXPECT_FALSE(st.put(chunk(3), true, {}, "a")) << "over a's share";
  EXPECT_EQ(st.pinned_bytes("a"), one * 2);
  // A refused pin is still cached (unpinned, evictable).
  EXPECT_TRUE(st.find_prefix(chunk(3)->keys, chunk(3)->tokens));
  EXPECT_TRUE(st.put(chunk(4), true, {}, "b"));
  EXPECT_TRUE(st.put(chunk(5), true, {}, "b"));
  EXPECT_FALSE(st.put(chunk(6), true, {}, "c")) << "c has a share left, but all pins together would pass ram_bytes";
  const ChunkStats s = st.stats();
  EXPECT_LE(size_t(s.pinned_bytes), o.ram_bytes);
  EXPECT_EQ(s.pinned, 4);
  EXPECT_EQ(s.pins_refused, 2);
  st.unpin_all();
  EXPECT_EQ(st.pinned_bytes("a"), 0u);
  EXPECT_EQ(st.stats().pinned_bytes, 0);
}

}  // namespace
}  // namespace kvboost::kv
