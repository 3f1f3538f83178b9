// Chunking, chunk keys, KV quantization, the chunk file format and the ChunkStore tiers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "kvboost/kv.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

TEST(Chunks, CutRespectsSegmentsAndSize) {
  const std::vector<int64_t> segs{10, 300};
  auto c = cut_chunks(310, segs, 128);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].begin, 0);
  EXPECT_EQ(c[0].end, 10);
  EXPECT_EQ(c[0].segment, 0);
  EXPECT_EQ(c[1].begin, 10);
  EXPECT_EQ(c[1].end, 138);
  EXPECT_EQ(c[2].begin, 138);
  EXPECT_EQ(c[2].end, 266);
  EXPECT_EQ(c[3].begin, 266);
  EXPECT_EQ(c[3].end, 300);
  EXPECT_EQ(c[3].segment, 1);
  EXPECT_EQ(c[4].begin, 300);
  EXPECT_EQ(c[4].end, 310);
  EXPECT_EQ(c[4].segment, 2);
  // a break 3 tokens before the cut moves it there
  auto b = cut_chunks(300, {}, 128, 8, [](int64_t p) { return p == 125 || p == 250; });
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(b[0].end, 125);
  EXPECT_EQ(b[1].end, 250);
  EXPECT_THROW(cut_chunks(10, std::vector<int64_t>{5, 5}, 4), Error);
}

TEST(Chunks, KeysChainAndSeparateTenants) {
  std::vector<int32_t> a{1, 2, 3}, b{4, 5, 6};
  const uint64_t r1 = chunk_root("m", "t1"), r2 = chunk_root("m", "t2"), r3 = chunk_root("m2", "t1");
  EXPECT_NE(r1, r2);
  EXPECT_NE(r1, r3);
  auto ka = chunk_keys(chunk_first_keys(r1), r1, a);
  auto kb = chunk_keys(ka, r1, b);
  auto kb_alone = chunk_keys(chunk_first_keys(r1), r1, b);
  EXPECT_NE(kb.prefix, kb_alone.prefix);    // prefix keys depend on what came before
  EXPECT_EQ(kb.content, kb_alone.content);  // content keys do not
  EXPECT_NE(kb.check, kb.prefix);
  EXPECT_NE(chunk_keys(chunk_first_keys(r2), r2, b).content, kb.content);  // tenants apart
}

ChunkShape shape() { return ChunkShape{3, 2, 64}; }

std::shared_ptr<Chunk> random_chunk(int64_t n, KvQuant q, uint32_t seed, std::vector<float>* kv_out = nullptr) {
  auto c = std::make_shared<Chunk>();
  const ChunkShape s = shape();
  for (int64_t i = 0; i < n; ++i) c->tokens.push_back(int32_t(seed * 1000 + i));
  c->pos0 = 7;
  c->keys = chunk_keys(chunk_first_keys(chunk_root("m", "")), chunk_root("m", ""), c->tokens);
  chunk_init(*c, s, q, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    std::vector<float> k(size_t(n * s.row())), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = nd(rng) + ((i % size_t(s.row())) == 5 ? 20.0f : 0.0f);  // an outlier channel, as real keys have
      v[i] = nd(rng);
    }
    chunk_put_layer(*c, s, l, k.data(), v.data());
    if (kv_out) kv_out->insert(kv_out->end(), k.begin(), k.end()), kv_out->insert(kv_out->end(), v.begin(), v.end());
  }
  return c;
}

TEST(Chunks, QuantizationRoundTripErrorIsBounded) {
  const ChunkShape s = shape();
  const int64_t n = 45;  // a partial token group
  for (KvQuant q : {KvQuant::kF32, KvQuant::kInt8, KvQuant::kInt4}) {
    std::vector<float> ref;
    auto c = random_chunk(n, q, 3, &ref);
    double max_err = 0, sum_sq = 0;
    for (int64_t l = 0; l < s.n_layers; ++l) {
      std::vector<float> k(size_t(n * s.row())), v(k.size());
      chunk_get_layer(*c, s, l, k.data(), v.data());
      const float* rk = &ref[size_t(l) * 2 * k.size()];
      const float* rv = rk + k.size();
      for (size_t i = 0; i < k.size(); ++i) {
        max_err = std::max({max_err, double(std::fabs(k[i] - rk[i])), double(std::fabs(v[i] - rv[i]))});
        sum_sq += double(v[i] - rv[i]) * (v[i] - rv[i]);
      }
    }
    // per-group step: range ~8 sigma; 8-bit step ~0.03 -> error <= step/2; 4-bit step ~0.5
    const double bound = q == KvQuant::kF32 ? 0.0 : q == KvQuant::kInt8 ? 0.03 : 0.6;
    EXPECT_LE(max_err, bound) << kv_quant_name(q);
    if (q != KvQuant::kF32) EXPECT_GT(max_err, 0.0);
  }
  // with f32 scale and minimum per 32 values: 4-bit is 5.3x and 8-bit 3.2x smaller than f32
  EXPECT_LT(chunk_layer_bytes(s, KvQuant::kInt4, 128) * 5, chunk_layer_bytes(s, KvQuant::kF32, 128));
  EXPECT_LT(chunk_layer_bytes(s, KvQuant::kInt8, 128) * 3, chunk_layer_bytes(s, KvQuant::kF32, 128));
}

TEST(Chunks, FileRoundTripAndCorruptionIsDetected) {
  const std::string dir = test::make_temp_dir("chunk_file");
  const std::string path = dir + "/a.kvc";
  auto c = random_chunk(20, KvQuant::kInt8, 4);
  write_chunk_file(path, *c, shape(), 42);
  Chunk r = read_chunk_file(path, shape(), 42);
  EXPECT_EQ(r.tokens, c->tokens);
  EXPECT_EQ(r.data, c->data);
  EXPECT_EQ(r.pos0, 7);
  EXPECT_EQ(r.keys.prefix, c->keys.prefix);
  EXPECT_THROW(read_chunk_file(path, shape(), 43), Error);  // another model
  std::string bytes = read_file(path);
  {  // flip one payload byte
    std::string bad = bytes;
    bad[bad.size() - 10] ^= 0x40;
    std::ofstream(path, std::ios::binary) << bad;
    try {
      read_chunk_file(path, shape(), 42);
      FAIL() << "corrupt file accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
  }
  {  // truncated
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
    try {
      read_chunk_file(path, shape(), 42);
      FAIL() << "truncated file accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
  }
}

TEST(ChunkStore, HitsVerifyTokensAndEvictionKeepsFrequentAndPinned) {
  const size_t one = random_chunk(16, KvQuant::kF32, 1)->bytes();
  ChunkStoreOptions o;
  o.ram_bytes = one * 3 + one / 2;  // room for three
  o.model_id = "m";
  ChunkStore st(shape(), o);
  auto a = random_chunk(16, KvQuant::kF32, 1), b = random_chunk(16, KvQuant::kF32, 2);
  auto c = random_chunk(16, KvQuant::kF32, 3), d = random_chunk(16, KvQuant::kF32, 4);
  st.put(a, /*pin=*/true);
  st.put(b);
  st.put(c);
  EXPECT_TRUE(st.find_prefix(a->keys, a->tokens));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(st.find_content(b->keys.content, b->tokens));  // b is hot
  // wrong tokens under the right key: a miss, never wrong K/V
  auto wrong = a->tokens;
  wrong[3] += 1;
  EXPECT_FALSE(st.find_prefix(a->keys, wrong));
  ChunkKeys bad_check = a->keys;
  bad_check.check ^= 1;
  EXPECT_FALSE(st.find_prefix(bad_check, a->tokens));
  st.put(d);  // over budget: c (cold, unpinned) goes; a is pinned, b is frequent
  EXPECT_TRUE(st.find_prefix(a->keys, a->tokens));
  EXPECT_TRUE(st.find_prefix(b->keys, b->tokens));
  EXPECT_FALSE(st.find_prefix(c->keys, c->tokens));
  EXPECT_TRUE(st.find_prefix(d->keys, d->tokens));
  const ChunkStats s = st.stats();
  EXPECT_EQ(s.evictions_ram, 1);
  EXPECT_EQ(s.pinned, 1);
  EXPECT_EQ(s.entries, 3);
}

TEST(ChunkStore, DiskTierSurvivesRestartAndSkipsCorruptFiles) {
  const std::string dir = test::make_temp_dir("chunk_disk");
  ChunkStoreOptions o;
  o.ram_bytes = size_t(64) << 20;
  o.disk_dir = dir;
  o.model_id = "m";
  o.quant = KvQuant::kInt4;
  auto a = random_chunk(40, KvQuant::kInt4, 1), b = random_chunk(40, KvQuant::kInt4, 2);
  {
    ChunkStore st(shape(), o);
    st.put(a);
    st.put(b);
    st.flush();
    EXPECT_EQ(st.stats().entries_disk, 2);
  }
  // corrupt b's file
  std::vector<std::string> files;
  for (auto& name : test::list_dir(dir)) files.push_back(dir + "/" + name);
  ASSERT_EQ(files.size(), 2u);
  std::string victim;
  for (auto& f : files) {
    Chunk c = read_chunk_file(f, shape(), chunk_root("m", "\x01model"));
    if (c.tokens == b->tokens) victim = f;
  }
  ASSERT_FALSE(victim.empty());
  std::string bytes = read_file(victim);
  bytes[bytes.size() - 1] ^= 1;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;

  ChunkStore st(shape(), o);  // a restart: the index comes from the files
  EXPECT_EQ(st.stats().entries, 2);
  auto ha = st.find_prefix(a->keys, a->tokens);
  ASSERT_TRUE(ha);
  EXPECT_EQ(ha->data, a->data);
  EXPECT_FALSE(st.find_prefix(b->keys, b->tokens));  // corrupt: a miss, reported, removed
  const ChunkStats s = st.stats();
  EXPECT_EQ(s.corrupt, 1);
  EXPECT_EQ(s.disk_loads, 1);
  ASSERT_EQ(s.corrupt_files.size(), 1u);
  EXPECT_NE(s.corrupt_files[0].find("checksum"), std::string::npos);
  EXPECT_FALSE(test::path_exists(victim));
}

}  // namespace
}  // namespace kvboost::kv
