// Layer streaming in the engine's device runner (kvboost/gpu.h PagedRunnerOptions::vram_budget,
// src/gpu/paged_stream.cpp; issue 29, docs/gpu.md).
//
// Every build: a VRAM budget on the CPU is an Error naming both options. With a device: a budget
// that keeps half the layers resident and streams the rest through two slots gives the same
// logits, bit for bit, as every layer resident (the same packed blocks, the same kernels) --
// on the runner directly (f32 and AutoAWQ 4-bit layers, whose copies must stay packed) and
// through the engine (greedy tokens and logits against the resident device engine and the CPU).
// The budgets come from the runner's own errors: one byte names the bytes that stay on the
// device, that plus one byte names a layer's packed size.
#include <cmath>
#include <cstring>
#include <numeric>

#include "kvboost/gpu.h"
#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "device_test_util.h"
#include "error_of.h"

using namespace kvboost;
using kernels::Device;
using kvboost::test::error_of;

namespace {

using test::kCuda;


// 8 layers, head_dim 32 (the tiled attention kernels), GQA 8 over 2; awq: every projection 4-bit.
std::string model8(bool awq) {
  const std::string d = test::make_temp_dir(awq ? "engine_stream_awq" : "engine_stream_f32");
  FixtureSpec s = fixture_preset("tiny");
  s.arch = "llama";
  s.hidden = 256, s.intermediate = 512, s.layers = 8, s.heads = 8, s.kv_heads = 2, s.head_dim = 32;
  s.max_pos = 1024;
  if (awq) s.quant = "awq", s.group_size = 128;
  write_fixture_model(d, s);
  return d;
}
const std::string& f32_model() {
  static const std::string d = model8(false);
  return d;
}
const std::string& awq_model() {
  static const std::string d = model8(true);
  return d;
}

// The number right after `key` in `e` (0 when absent).
uint64_t number_after(const std::string& e, const std::string& key) {
  const size_t at = e.find(key);
  return at == std::string::npos ? 0 : std::strtoull(e.c_str() + at + key.size(), nullptr, 10);
}

// A budget that streams `n_streamed` of 8 equal layers through two slots under `load` (a
// function of the budget that throws the runner's error): fixed + (8 - n_streamed + 2) layers.
template <typename Load>
uint64_t budget_streaming(Load load, int n_streamed) {
  const std::string e1 = error_of([&] { load(1); });
  const uint64_t fixed = number_after(e1, "cannot hold the ");
  EXPECT_GT(fixed, 0u) << e1;
  const std::string e2 = error_of([&] { load(fixed + 1); });
  const uint64_t layer = number_after(e2, "less than one layer (");
  EXPECT_GT(layer, 0u) << e2;
  return fixed + uint64_t(8 - n_streamed + 2) * layer;
}

struct Steps {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;
};

std::unique_ptr<gpu::PagedRunner> runner(const Model& m, uint64_t budget) {
  const ModelConfig& c = m.config();
  gpu::PagedRunnerOptions o;
  o.pool = gpu::PoolLayout{c.n_layers, 16, 16, c.n_kv_heads, c.head_dim};
  o.vram_budget = budget;
  return gpu::PagedRunner::create(m, o);
}

// A 100-token prefill then `n` greedy decode passes on one sequence.
Steps run(gpu::PagedRunner& r, int64_t vocab, int n) {
  std::vector<kv::BlockId> table(16);
  std::iota(table.begin(), table.end(), kv::BlockId(0));
  std::vector<int32_t> toks;
  for (int i = 0; i < 100; ++i) toks.push_back(int32_t((i * 37 + 11) % 200 + 3));
  Steps out;
  std::vector<float> lg(static_cast<size_t>(vocab));
  int64_t n_past = 0;
  for (int step = 0; step <= n; ++step) {
    gpu::PagedSeq s;
    s.tokens = toks.data(), s.n = int64_t(toks.size()), s.n_past = n_past;
    s.block_table = table, s.logits = lg.data(), s.n_logits = 1;
    r.forward_batch(&s, 1);
    n_past += s.n;
    out.logits.push_back(lg);
    const int32_t next = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
    out.ids.push_back(next);
    toks = {next};
  }
  return out;
}

}  // namespace

// ---- every build ----

TEST(EngineDevice, VramBudgetOnTheCpuIsAnError) {
  EngineOptions eo;
  eo.load.vram_budget = 1 << 20;
  EXPECT_EQ(error_of([&] { Engine::load("/nonexistent_model_dir", eo); }),
            "vram_budget (--vram-budget) 1048576 bytes is for a CUDA device (--device cuda); on the CPU, layer "
            "streaming is weight_budget (--weight-budget)");
}

// ---- on a device ----

// Half the layers streamed: the runner's logits equal the resident runner's bit for bit over a
// prefill and decode passes; each pass copies exactly the streamed layers (the first pass also
// the next pass's first two, prefetched); AWQ layers cross the bus 4-bit.
TEST(EngineDevice, RunnerStreamingHalfTheLayersIsBitIdentical) {
  REQUIRE_GPU();
  uint64_t per_layer[2] = {0, 0};
  for (bool awq : {false, true}) {
    SCOPED_TRACE(awq ? "awq" : "f32");
    auto m = Model::load(awq ? awq_model() : f32_model());
    const int64_t V = m->config().vocab_size;
    const uint64_t budget = budget_streaming([&](uint64_t b) { runner(*m, b); }, 4);
    auto res = runner(*m, 0);
    auto st = runner(*m, budget);
    EXPECT_EQ(res->streamed_layers(), 0);
    ASSERT_EQ(st->streamed_layers(), 4);
    EXPECT_LT(st->device_weight_bytes(), res->device_weight_bytes());
    const int n = 8;
    const Steps a = run(*res, V, n), b = run(*st, V, n);
    EXPECT_EQ(b.ids, a.ids);
    ASSERT_EQ(b.logits.size(), a.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i)
      EXPECT_EQ(0, std::memcmp(b.logits[i].data(), a.logits[i].data(), size_t(V) * 4)) << "pass " << i;
    const int64_t passes = n + 1;
    ASSERT_EQ(b.logits.size(), size_t(passes));
    EXPECT_EQ(res->bytes_h2d(), 0u);
    ASSERT_EQ(st->bytes_h2d() % uint64_t(4 * passes + 2), 0u) << st->bytes_h2d();
    per_layer[awq] = st->bytes_h2d() / uint64_t(4 * passes + 2);
  }
  EXPECT_LT(per_layer[1] * 3, per_layer[0]);  // 4-bit on the wire, not dequantized
}

// A budget below the fixed part, and one for less than two slots, are errors naming the bytes.
TEST(EngineDevice, RunnerBudgetTooSmallNamesTheBytes) {
  REQUIRE_GPU();
  auto m = Model::load(f32_model());
  const std::string e = error_of([&] { runner(*m, 1000); });
  EXPECT_NE(e.find("device cuda:0: --vram-budget 1000 bytes cannot hold the "), std::string::npos) << e;
  EXPECT_NE(e.find("of K/V pools (--kv-budget)"), std::string::npos) << e;
  const uint64_t fixed = number_after(e, "cannot hold the ");
  const std::string e2 = error_of([&] { runner(*m, fixed + 1); });
  EXPECT_NE(e2.find("less than one layer"), std::string::npos) << e2;
}

// The engine on the device under a budget that streams half the layers: the same greedy tokens
// and logits as the resident device engine (bit for bit) and as the CPU (within the engine
// device tests' tolerance), with chunked prefill and decode steps.
TEST(EngineDevice, EngineStreamingHalfTheLayersMatchesResidentAndCpu) {
  REQUIRE_GPU();
  EngineOptions eo;
  eo.load.device = kCuda;
  eo.prefill_chunk = 64;
  const uint64_t budget = budget_streaming(
      [&](uint64_t b) {
        EngineOptions o = eo;
        o.load.vram_budget = b;
        Engine::load(f32_model(), o);
      },
      4);
  EngineOptions st = eo;
  st.load.vram_budget = budget;
  EngineOptions cpu_o = eo;
  cpu_o.load.device = Device{};
  auto dev = Engine::load(f32_model(), eo);
  auto dev_st = Engine::load(f32_model(), st);
  auto cpu = Engine::load(f32_model(), cpu_o);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int32_t((i * 13 + 5) % 200 + 3));
  GenerateOptions g;
  g.max_new_tokens = 16;
  g.sampling.temperature = 0.0f;
  auto gen = [&](Engine& e, std::vector<std::vector<float>>* logits) {
    GenerateOptions o = g;
    o.on_logits = [&](const float* l, int64_t v) { logits->emplace_back(l, l + v); };
    return e.generate_ids(prompt, o).output_ids;
  };
  std::vector<std::vector<float>> lr, ls, lc;
  const auto ids_r = gen(*dev, &lr), ids_s = gen(*dev_st, &ls), ids_c = gen(*cpu, &lc);
  EXPECT_GT(dev_st->device_passes(), 0);
  EXPECT_EQ(ids_s, ids_r);
  EXPECT_EQ(ids_s, ids_c);
  ASSERT_EQ(ls.size(), lr.size());
  ASSERT_EQ(ls.size(), lc.size());
  for (size_t i = 0; i < ls.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(ls[i].data(), lr[i].data(), ls[i].size() * 4)) << "step " << i;
    double d = 0, mx = 0;
    for (size_t j = 0; j < lc[i].size(); ++j)
      d = std::max(d, double(std::fabs(ls[i][j] - lc[i][j]))), mx = std::max(mx, double(std::fabs(lc[i][j])));
    EXPECT_LE(d / std::max(mx, 1e-30), 1e-3) << "step " << i;
  }
}
