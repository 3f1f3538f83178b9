// Layer streaming (LoadOptions::weight_budget): the streamer's bookkeeping on plain files, and
// a streamed model against the resident one (bit-identical logits).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "gguf_builder.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "layer_stream.h"
#include "test_util.h"

namespace kvboost {
namespace {

// Streamed layers are read in the stored layout (no packing at load), so the resident model
// they must match bit for bit is loaded in that layout too (LoadOptions::pack_weights).
LoadOptions stored_layout() {
  LoadOptions o;
  o.pack_weights = false;
  return o;
}

using stream::LayerStreamer;
using stream::TensorRef;

// Byte j of tensor i of layer l.
uint8_t pattern(int64_t l, int64_t i, uint64_t j) { return uint8_t(l * 31 + i * 7 + j * 13 + (j >> 9)); }

// A file holding n_layers layers of tensors of the given sizes at deliberately unaligned
// offsets (gaps of odd sizes between them), and the refs describing them.
std::vector<std::vector<TensorRef>> write_layers(const std::string& path, int64_t n_layers,
                                                 const std::vector<uint64_t>& sizes) {
  std::vector<std::vector<TensorRef>> refs(static_cast<size_t>(n_layers));
  std::vector<uint8_t> bytes;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      bytes.resize(bytes.size() + 3 + size_t(l + i) % 5, 0xEE);  // odd gap
      refs[size_t(l)].push_back({0, uint64_t(bytes.size()), sizes[i]});
      for (uint64_t j = 0; j < sizes[i]; ++j) bytes.push_back(pattern(l, int64_t(i), j));
    }
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return refs;
}

bool layer_ok(const std::vector<const uint8_t*>& p, int64_t l, const std::vector<uint64_t>& sizes) {
  for (size_t i = 0; i < sizes.size(); ++i)
    for (uint64_t j = 0; j < sizes[i]; ++j)
      if (p[i][j] != pattern(l, int64_t(i), j)) return false;
  return true;
}

TEST(LayerStreamer, SlotOrderEveryLayerOncePerPassAndNoOverwriteInUse) {
  const std::string dir = test::make_temp_dir("stream_order");
  const std::vector<uint64_t> sizes{5000, 123, 9000};
  const int64_t L = 7;
  auto refs = write_layers(dir + "/w.bin", L, sizes);
  const uint64_t slot = LayerStreamer::slot_bytes_for(refs);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> reads;  // (layer, slot) in read order
  std::atomic<int64_t> held_slot{-1};
  std::atomic<int> overwrites{0};
  auto on_read = [&](bool begin, int64_t layer, int64_t sl) {
    if (!begin) return;
    if (sl == held_slot.load()) overwrites++;
    std::lock_guard<std::mutex> lk(mu);
    reads.push_back({layer, sl});
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow disk
  };
  LayerStreamer s({dir + "/w.bin"}, refs, 3 * slot + 100, true, on_read);
  ASSERT_EQ(s.n_slots(), 3);
  const int passes = 4;
  int64_t k = 0;
  for (int p = 0; p < passes; ++p) {
    LayerStreamer::Pass pass(s);
    for (int64_t l = 0; l < L; ++l, ++k) {
      const auto& ptrs = pass.acquire(l);
      held_slot = k % s.n_slots();
      ASSERT_TRUE(layer_ok(ptrs, l, sizes)) << "pass " << p << " layer " << l;
      if (l % 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow layer
      ASSERT_TRUE(layer_ok(ptrs, l, sizes)) << "overwritten while in use: pass " << p << " layer " << l;
      held_slot = -1;
      pass.release();
    }
  }
  EXPECT_EQ(overwrites.load(), 0);
  const auto st = s.stats();
  EXPECT_EQ(st.passes, uint64_t(passes));
  std::lock_guard<std::mutex> lk(mu);
  // The reader runs ahead into the next pass by at most n_slots items.
  ASSERT_GE(reads.size(), size_t(passes * L));
  ASSERT_LE(reads.size(), size_t(passes * L + s.n_slots()));
  for (size_t i = 0; i < reads.size(); ++i) {
    EXPECT_EQ(reads[i].first, int64_t(i) % L) << i;
    EXPECT_EQ(reads[i].second, int64_t(i) % s.n_slots()) << i;
  }
  for (int64_t l = 0; l < L; ++l) {
    EXPECT_GE(st.reads_per_layer[size_t(l)], uint64_t(passes));
    EXPECT_LE(st.reads_per_layer[size_t(l)], uint64_t(passes + 1));
  }
}

TEST(LayerStreamer, TensorsKeepTheirAlignmentModulo4096) {
  const std::string dir = test::make_temp_dir("stream_align");
  auto refs = write_layers(dir + "/w.bin", 3, {4096 * 3 + 17, 40, 8192});
  LayerStreamer s({dir + "/w.bin"}, refs, 1 << 22);
  LayerStreamer::Pass pass(s);
  for (int64_t l = 0; l < 3; ++l) {
    const auto& p = pass.acquire(l);
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p[i]) % 4096, refs[size_t(l)][i].offset % 4096);
    pass.release();
  }
}

TEST(LayerStreamer, BudgetBelowTwoLayersIsAnErrorNamingTheNumbers) {
  const std::string dir = test::make_temp_dir("stream_budget");
  auto refs = write_layers(dir + "/w.bin", 4, {10000, 20000});
  const uint64_t slot = LayerStreamer::slot_bytes_for(refs);
  try {
    LayerStreamer s({dir + "/w.bin"}, refs, 2 * slot - 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(2 * slot - 1)), std::string::npos) << m;
    EXPECT_NE(m.find("30000"), std::string::npos) << m;  // one layer's matrices
    EXPECT_NE(m.find(std::to_string(2 * slot)), std::string::npos) << m;
  }
  LayerStreamer ok({dir + "/w.bin"}, refs, 2 * slot);
  EXPECT_EQ(ok.n_slots(), 2);
  EXPECT_THROW(LayerStreamer({dir + "/missing.bin"}, refs, 4 * slot), Error);
}

TEST(LayerStreamer, AbandonedPassKeepsTheSequenceAligned) {
  const std::string dir = test::make_temp_dir("stream_abandon");
  const std::vector<uint64_t> sizes{3000, 700};
  auto refs = write_layers(dir + "/w.bin", 5, sizes);
  LayerStreamer s({dir + "/w.bin"}, refs, 2 * LayerStreamer::slot_bytes_for(refs));
  {
    LayerStreamer::Pass pass(s);
    pass.acquire(0);
    pass.release();
    pass.acquire(1);  // an exception here would leave the pass: the destructor drains
    EXPECT_THROW(pass.acquire(3), Error);  // out of order
  }
  LayerStreamer::Pass pass(s);
  for (int64_t l = 0; l < 5; ++l) {
    ASSERT_TRUE(layer_ok(pass.acquire(l), l, sizes)) << l;
    pass.release();
  }
}

TEST(LayerStreamer, ConcurrentPassesAreSerialised) {
  const std::string dir = test::make_temp_dir("stream_threads");
  const std::vector<uint64_t> sizes{2000, 3000};
  auto refs = write_layers(dir + "/w.bin", 6, sizes);
  LayerStreamer s({dir + "/w.bin"}, refs, 3 * LayerStreamer::slot_bytes_for(refs));
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&] {
      for (int p = 0; p < 5; ++p) {
        LayerStreamer::Pass pass(s);
        for (int64_t l = 0; l < 6; ++l) {
          if (!layer_ok(pass.acquire(l), l, sizes)) bad++;
          pass.release();
        }
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s.stats().passes, 15u);
}

// ---- a streamed model against the resident one ----

std::string fixture(const std::string& name, const std::string& dtype) {
  const std::string dir = test::make_temp_dir(name);
  FixtureSpec s = fixture_preset("tiny");
  s.arch = "qwen2", s.dtype = dtype, s.tokenizer_kind = "", s.vocab = 300, s.layers = 5;
  write_fixture_model(dir, s);
  return dir;
}

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + seed * 101 + 7) % 300);
  return t;
}

// Every kind of pass on `m`: prefill, 3 decode steps, a batch of two sequences, a blend.
std::vector<std::vector<float>> run_all(const Model& m) {
  const auto& c = m.config();
  const size_t V = size_t(c.vocab_size);
  std::vector<std::vector<float>> out;
  const auto a = tokens(24, 1), b = tokens(11, 2);
  KvCache ka(c, 64);
  std::vector<float> lg(V * 24);
  m.forward(a.data(), 20, ka, lg.data(), /*all_logits=*/true);
  out.emplace_back(lg.begin(), lg.begin() + long(V * 20));
  for (int i = 20; i < 23; ++i) {
    m.forward(&a[size_t(i)], 1, ka, lg.data());
    out.emplace_back(lg.begin(), lg.begin() + long(V));
  }
  KvCache kb(c, 64);
  std::vector<float> la(V), lb(V);
  SeqBatch s[2];
  s[0].tokens = &a[23], s[0].n = 1, s[0].kv = ka.view(), s[0].logits = la.data();
  s[1].tokens = b.data(), s[1].n = int64_t(b.size()), s[1].kv = kb.view(), s[1].logits = lb.data();
  m.forward_batch(s, 2);
  out.push_back(la), out.push_back(lb);
  // Blend over K/V of `a` computed at other positions: stale cache, some tokens selected.
  KvCache kc(c, 64);
  m.forward(b.data(), int64_t(b.size()), kc, lg.data());
  kc.truncate(3);
  std::vector<uint8_t> reused(8, 1);
  reused[7] = 0;
  BlendOptions bo;
  bo.check_layer = 1, bo.ratio = 0.3f, bo.reused = reused.data();
  std::vector<float> lbl(V);
  const BlendStats st = m.forward_blend(a.data(), 8, kc.view(), bo, lbl.data());
  out.push_back(lbl);
  out.push_back({float(st.n_selected), float(st.n_rows_late)});
  // Gradual filtering: each layer is acquired once while the rows narrow over two layers.
  KvCache kd(c, 64);
  m.forward(b.data(), int64_t(b.size()), kd, lg.data());
  kd.truncate(3);
  bo.first_ratio = 0.9f, bo.taper_layers = 2;
  const BlendStats sg = m.forward_blend(a.data(), 8, kd.view(), bo, lbl.data());
  out.push_back(lbl);
  out.push_back({float(sg.n_selected), float(sg.n_row_layers)});
  return out;
}

void expect_identical(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << i;
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0) << "output " << i << " differs";
  }
}

class StreamedModel : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamedModel, TwoAndThreeLayerBudgetsGiveBitIdenticalLogits) {
  const std::string dir = fixture("stream_model_" + GetParam(), GetParam());
  auto resident = Model::load(dir, stored_layout());
  EXPECT_FALSE(resident->stream_info().streaming);
  const auto want = run_all(*resident);
  // The smallest budget: learn one slot's size from a load that fits two layers.
  LoadOptions probe;
  probe.weight_budget = uint64_t(resident->weight_bytes()) / 2;  // 2 of the 5 layers
  auto pm = Model::load(dir, probe);
  ASSERT_TRUE(pm->stream_info().streaming);
  const uint64_t slot = pm->stream_info().slot_bytes;
  pm.reset();
  for (int n : {2, 3}) {
    LoadOptions o;
    o.weight_budget = uint64_t(n) * slot;
    auto m = Model::load(dir, o);
    const Model::StreamInfo si = m->stream_info();
    ASSERT_TRUE(si.streaming);
    EXPECT_EQ(si.n_slots, n);
    expect_identical(run_all(*m), want);
    const Model::StreamInfo after = m->stream_info();
    // prefill, 3 decode steps, batch, two blends each after its plain prefill = 9 passes (a
    // gradual blend reads every layer once too)
    EXPECT_EQ(after.passes, 9u);
    EXPECT_GE(after.bytes_read, 9 * si.pass_bytes);
    EXPECT_LE(after.bytes_read, 9 * si.pass_bytes + uint64_t(n) * slot);
  }
  // A budget that holds every layer keeps the model resident.
  LoadOptions all;
  all.weight_budget = 5 * slot;
  EXPECT_FALSE(Model::load(dir, all)->stream_info().streaming);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, StreamedModel, ::testing::Values("f32", "bf16"));

TEST(StreamedModelErrors, BudgetBelowTwoLayers) {
  const std::string dir = fixture("stream_model_err", "f32");
  LoadOptions o;
  o.weight_budget = 1000;
  try {
    Model::load(dir, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("weight budget of 1000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("holds fewer than two layers"), std::string::npos) << m;
  }
}

TEST(StreamedModel, ConcurrentForwardsStayCorrect) {
  const std::string dir = fixture("stream_model_mt", "f32");
  auto resident = Model::load(dir, stored_layout());
  const auto& c = resident->config();
  const auto t = tokens(16, 5);
  KvCache k0(c, 32);
  std::vector<float> want(size_t(c.vocab_size));
  resident->forward(t.data(), 16, k0, want.data());
  LoadOptions o;
  o.weight_budget = uint64_t(resident->weight_bytes()) / 2;
  auto m = Model::load(dir, o);
  ASSERT_TRUE(m->stream_info().streaming);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&] {
      for (int r = 0; r < 3; ++r) {
        KvCache k(c, 32);
        std::vector<float> got(size_t(c.vocab_size));
        m->forward(t.data(), 16, k, got.data());
        if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) bad++;
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// A llama GGUF: its Q/K rows are un-permuted at load into owned buffers, which have no file
// offset, so streaming goes through the scratch file for them.
TEST(StreamedModel, GgufLlamaOwnedTensorsStreamThroughTheScratchFile) {
  using kernels::GgmlType;
  test::Builder b;
  const int64_t H = 64, I = 128, V = 100, L = 4, nh = 4, nkv = 2, hd = 16;
  test::add_random_llama(b, {H, I, V, L, nh, nkv, hd}, 1, [](uint32_t&) {});
  const std::string path = test::write(test::make_temp_dir("stream_gguf"), "m.gguf", b.finish());
  auto resident = Model::load(path, stored_layout());
  const std::vector<int32_t> ids{1, 17, 30, 4, 99, 50, 3, 71};
  auto run = [&](const Model& m) {
    KvCache kv(m.config(), 16);
    std::vector<float> out(ids.size() * size_t(V));
    m.forward(ids.data(), int64_t(ids.size()), kv, out.data(), /*all_logits=*/true);
    std::vector<float> step(static_cast<size_t>(V));
    const int32_t next = 5;
    m.forward(&next, 1, kv, step.data());
    out.insert(out.end(), step.begin(), step.end());
    return out;
  };
  const auto want = run(*resident);
  LoadOptions o;
  // 1.5 x two layers' matrices: two slots (extents add alignment and the scratch copy), < 4 layers.
  o.weight_budget = 3 * uint64_t(4 * (2 * H * nh * hd + 2 * H * nkv * hd + 3 * H * I));
  auto m = Model::load(path, o);
  ASSERT_TRUE(m->stream_info().streaming);
  const auto got = run(*m);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(m->stream_info().passes, 2u);
}

}  // namespace
}  // namespace kvboost
