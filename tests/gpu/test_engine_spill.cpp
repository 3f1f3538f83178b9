// The KV spill chain on a CUDA device (issue 29; docs/gpu.md "KV spill"): device pool -> pinned
// host slots (kv::HostColdStore over PagedRunner::spill_copy) -> disk (kv::FileColdStore).
//
// With a device: requests whose K/V together are several times the device pool, with cold_dir,
// give the same greedy tokens and logits (within the device-vs-CPU tolerance) as the same
// requests on a device pool that holds everything, and the kv manager counts spills and page-ins
// -- through the pinned host tier alone and, with a host budget of one block, through the disk
// tier too. A single sequence whose table outgrows the pool is an Error naming the blocks and
// the pool (device attention reads whole tables). Without a device the cases skip.
#include <algorithm>
#include <cmath>

#include "kvboost/gpu.h"
#include "kvboost/runtime.h"
#include "test_util.h"
#include "device_test_util.h"
#include "error_of.h"

using namespace kvboost;
using kernels::Device;
using kvboost::test::error_of;

namespace {

using test::kCuda;


std::string stories() { return test::model_path("stories260K"); }

const std::vector<std::string> kPrompts = {"Once upon a time there was a little girl", "The cat sat on the mat and",
                                           "Lily and Ben went to the park to play"};

struct Out {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<std::vector<float>>> logits;  // [request][step][vocab]
};

// All prompts submitted at once, stepped to completion (continuous batching).
Out run_all(Engine& e, int n_new) {
  Out o;
  o.ids.resize(kPrompts.size()), o.logits.resize(kPrompts.size());
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    GenerateOptions g;
    g.max_new_tokens = n_new;
    g.ignore_eos = true;
    g.prefix_cache = false;
    g.sampling.temperature = 0.0f;
    g.on_logits = [&o, i](const float* l, int64_t v) { o.logits[i].emplace_back(l, l + v); };
    reqs.push_back(e.submit(e.tokenizer().encode(kPrompts[i], true), g));
  }
  while (std::any_of(reqs.begin(), reqs.end(), [](const auto& r) { return !r->done(); })) e.step();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateResult r = reqs[i]->result();
    EXPECT_EQ(r.error, "") << "request " << i;
    o.ids[i] = r.output_ids;
  }
  return o;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double d = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    d = std::max(d, double(std::fabs(a[i] - ref[i]))), m = std::max(m, double(std::fabs(ref[i])));
  return d / std::max(m, 1e-30);
}

size_t block_bytes(const Engine& e) {
  const ModelConfig& c = e.model().config();
  return size_t(16 * 2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
}

void spill_case(size_t host_blocks) {
  REQUIRE_GPU();
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions big;
  big.load.device = kCuda;
  big.spec.mode = SpecMode::kOff;
  auto full = Engine::load(stories(), big);
  // 3 requests of ~10 prompt + 86 new tokens: 6-7 blocks of 16 each, ~20 together; the pool
  // holds 10 (one request's table plus the others' last blocks).
  const Out want = run_all(*full, 86);
  EXPECT_EQ(full->kv_stats().spills, 0);

  EngineOptions eo = big;
  eo.kv_budget_bytes = 10 * block_bytes(*full);
  eo.cold_dir = test::make_temp_dir("device_spill");
  eo.cold_host_bytes = host_blocks * block_bytes(*full);
  auto small = Engine::load(stories(), eo);
  const Out got = run_all(*small, 86);
  const kv::KvStats st = small->kv_stats();
  EXPECT_EQ(st.n_blocks, 10);
  EXPECT_GT(st.spills, 0);
  EXPECT_GT(st.page_ins, 0);
  EXPECT_GT(small->device_passes(), 0);
  std::printf("device pool of 10 blocks, host tier of %zu blocks: %lld spills, %lld page-ins\n", host_blocks,
              (long long)st.spills, (long long)st.page_ins);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(got.ids[i], want.ids[i]) << "request " << i;
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << "request " << i;
    // The same device kernels; a step may batch other requests' rows (summation order only).
    for (size_t s = 0; s < want.logits[i].size(); ++s)
      EXPECT_LE(rel_err(got.logits[i][s], want.logits[i][s]), 1e-3) << "request " << i << " step " << s;
  }
}

}  // namespace

TEST(EngineDeviceSpill, PinnedHostTierGivesTheSameGreedyTokensAndLogits) { spill_case(64); }

TEST(EngineDeviceSpill, HostTierOverflowsToDiskWithTheSameOutput) { spill_case(1); }

TEST(EngineDeviceSpill, ATableLargerThanThePoolIsAnErrorNamingTheSizes) {
  REQUIRE_GPU();
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.load.device = kCuda;
  auto probe = Engine::load(stories(), eo);
  eo.kv_budget_bytes = 2 * block_bytes(*probe);
  eo.cold_dir = test::make_temp_dir("device_spill_small");
  auto e = Engine::load(stories(), eo);
  GenerateOptions g;
  g.max_new_tokens = 60;  // 3+ blocks over a pool of 2
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  const std::string err = error_of([&] { e->generate("Once upon a time", g); });
  EXPECT_NE(err.find("KV memory exhausted"), std::string::npos) << err;
  EXPECT_NE(err.find("device KV pool holds 2 blocks"), std::string::npos) << err;
}
