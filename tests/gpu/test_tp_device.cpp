// Tensor parallelism on the device (kvboost/gpu.h PagedRunnerOptions::comm; docs/gpu.md
// "Tensor parallelism on a device"): each rank a gpu::PagedRunner holding only its shard (tp_plan,
// TpShard's rules) and K/V pools of its K/V heads, all-reducing after O and down. TP = 2 over
// shared memory (two processes on device 0: copies device -> host, the sum, host -> device) and,
// with two GPUs and NCCL, TP = 2 over NCCL (one rank per device, on device pointers) against
// TP = 1 on the device and the CPU forward: a prompt's logits and kGen greedy steps, in
// tests/model/test_tp_forward.cpp's style (max |diff| relative to the reference's max |logit|,
// identical greedy tokens), and every rank's logits equal to rank 0's.
//
// Every model load, forward and CUDA call runs inside a child of dist::run_ranks (the device
// probe too: device_count_forked): a process that has initialized CUDA cannot hand it to
// children it forks, and the kernels' thread pool does not cross a fork either.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "device_test_util.h"
#include "error_of.h"
#include "kvboost/dist.h"
#include "kvboost/gpu.h"
#include "kvboost/model.h"
#include "layer_entries.h"  // src/gpu (every build)
#include "test_util.h"
#include "testing/fixture.h"

using namespace kvboost;
using kvboost::test::error_of;

namespace {

constexpr int64_t kGen = 8;    // greedy steps after the prompt
constexpr int64_t kBlock = 16;  // the device pools' block size

enum class Kind { Cpu, Device, DeviceNccl };

// What the ranks leave in shared memory: per rank, the prompt's logits [n, vocab] and each
// step's [vocab]; rank 0's greedy tokens.
struct Shared {
  size_t per_rank = 0, bytes = 0;
  int world = 1;
  float* logits = nullptr;
  int32_t* tokens = nullptr;
  Shared(int w, int64_t n_prompt, int64_t vocab) : world(w) {
    per_rank = size_t((n_prompt + kGen) * vocab);
    bytes = per_rank * size_t(w) * sizeof(float) + size_t(kGen) * sizeof(int32_t);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("mmap of ", bytes, " bytes");
    logits = static_cast<float*>(p);
    tokens = reinterpret_cast<int32_t*>(logits + per_rank * size_t(w));
    std::fill(logits, logits + per_rank * size_t(w), std::nanf(""));
    std::fill(tokens, tokens + kGen, -1);
  }
  ~Shared() { munmap(logits, bytes); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
};

struct Result {
  std::vector<float> logits;           // rank 0's
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> others;  // ranks 1 .. world - 1
};

// One run: the CPU forward (world 1), or `world` device runners over the run's shared-memory
// comm (Kind::Device; world 1: Comm::local(), the plain runner) or over NCCL, rank r on device r
// (Kind::DeviceNccl; the unique id travels over the shared-memory comm).
// The model as a device runner loads it: unpacked host weights (the device never reads the
// host's packed views; the shards are sliced from the file layout) and no prefault.
std::unique_ptr<Model> load_for_device(const std::string& dir) {
  LoadOptions lo;
  lo.pack_weights = false;
  lo.prefault = false;
  return Model::load(dir, lo);
}

Result run(const std::string& dir, Kind kind, int world, const std::vector<int32_t>& prompt) {
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  const int64_t n = int64_t(prompt.size()), V = cfg.vocab_size;
  const int64_t n_blocks = (n + kGen + kBlock) / kBlock;
  Shared sh(world, n, V);
  dist::run_ranks(world, [&](dist::Comm& c) {
    const int r = c.rank();
    float* out = sh.logits + sh.per_rank * size_t(r);
    std::unique_ptr<Model> m;
    std::unique_ptr<KvCache> kv;
    std::unique_ptr<gpu::PagedRunner> runner;
    std::vector<kv::BlockId> table(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), kv::BlockId(0));
    dist::Comm comm = dist::Comm::local();
    if (kind == Kind::Cpu) {
      m = Model::load(dir);
      kv = std::make_unique<KvCache>(m->config(), n + kGen + 1);
    } else {
      m = load_for_device(dir);
      int device = 0;
      if (kind == Kind::DeviceNccl) {
        // Rank 0's ncclUniqueId (128 bytes) to every rank: all_gather copies the bytes as they are.
        std::vector<float> mine(32, 0.0f), all(size_t(32 * world));
        dist::NcclId id;
        if (r == 0) {
          id = dist::nccl_unique_id();
          std::memcpy(mine.data(), id.bytes.data(), std::min<size_t>(id.bytes.size(), 128));
        }
        c.all_gather(mine.data(), 32, all.data());
        id.bytes.assign(reinterpret_cast<const uint8_t*>(all.data()), reinterpret_cast<const uint8_t*>(all.data()) + 128);
        device = r;
        comm = dist::nccl_comm(id, r, world, device);
      } else if (world > 1) {
        comm = c;
      }
      gpu::PagedRunnerOptions o;
      o.device = device;
      o.comm = comm;
      o.rows_hint = 64;
      const int64_t nkv = world > 1 ? tp_plan(cfg, r, world).config.n_kv_heads : cfg.n_kv_heads;
      o.pool = gpu::PoolLayout{cfg.n_layers, n_blocks, kBlock, nkv, cfg.head_dim};
      runner = gpu::PagedRunner::create(*m, o);
    }
    auto fwd = [&](const int32_t* t, int64_t k, int64_t n_past, float* lg, bool all) {
      if (kind == Kind::Cpu) {
        m->forward(t, k, *kv, lg, all);
        return;
      }
      gpu::PagedSeq s;
      s.tokens = t, s.n = k, s.n_past = n_past;
      s.block_table = table, s.logits = lg, s.n_logits = all ? k : 1;
      runner->forward_batch(&s, 1);
    };
    // Rank 0's greedy token to every rank (they agree when their logits do; this keeps the ranks'
    // collectives in step even if they did not, and the comparison below reports it).
    auto bcast = [&](int32_t t) {
      std::vector<float> all(static_cast<size_t>(world));
      const float f = float(t);
      c.all_gather(&f, 1, all.data());
      return int32_t(all[0]);
    };
    std::vector<float> lg(static_cast<size_t>(n * V));
    fwd(prompt.data(), n, 0, lg.data(), true);
    std::copy(lg.begin(), lg.end(), out);
    int32_t tok = bcast(int32_t(kernels::argmax(&lg[size_t((n - 1) * V)], V)));
    for (int64_t g = 0; g < kGen; ++g) {
      if (r == 0) sh.tokens[g] = tok;
      fwd(&tok, 1, n + g, lg.data(), false);
      std::copy(lg.begin(), lg.begin() + V, out + (n + g) * V);
      tok = bcast(int32_t(kernels::argmax(lg.data(), V)));
    }
    runner.reset();  // before its NCCL stream goes
    if (comm.backend() == dist::Backend::Nccl) dist::nccl_destroy(comm);
  }, size_t(1) << 20, 300);
  Result out;
  out.logits.assign(sh.logits, sh.logits + sh.per_rank);
  out.tokens.assign(sh.tokens, sh.tokens + kGen);
  for (int r = 1; r < world; ++r)
    out.others.emplace_back(sh.logits + sh.per_rank * size_t(r), sh.logits + sh.per_rank * size_t(r + 1));
  return out;
}

float max_abs(const std::vector<float>& v) {
  float s = 0;
  for (float x : v) s = std::max(s, std::fabs(x));
  return s;
}

// max |ref - got| < rel x max |ref logit| (at least rel), every logit finite.
void expect_logits_agree(const std::vector<float>& ref, const std::vector<float>& got, float rel,
                         const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  const float scale = std::max(max_abs(ref), 1.0f);
  float worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " logit " << i;
    worst = std::max(worst, std::fabs(ref[i] - got[i]));
  }
  EXPECT_LT(worst, rel * scale) << what << ": max |diff| " << worst << " (max |logit| " << scale << ")";
}

// ... and the same tokens.
void expect_agree(const Result& ref, const Result& got, float rel, const std::string& what) {
  expect_logits_agree(ref.logits, got.logits, rel, what);
  EXPECT_EQ(ref.tokens, got.tokens) << what;
}

// Every rank holds the whole logits: equal to rank 0's (bit for bit over shared memory, where
// every rank sums the slots in the same order; within `rel` over NCCL).
void expect_ranks_agree(const Result& got, float rel, const std::string& what) {
  const float scale = std::max(max_abs(got.logits), 1.0f);
  for (size_t r = 0; r < got.others.size(); ++r) {
    float worst = 0;
    for (size_t i = 0; i < got.logits.size(); ++i) worst = std::max(worst, std::fabs(got.logits[i] - got.others[r][i]));
    EXPECT_LE(worst, rel * scale) << what << ": rank " << r + 1 << " vs rank 0, max |diff| " << worst;
  }
}

// CPU forward, TP = 1 on the device, TP = 2 over shared memory on device 0, and TP = 2 over
// NCCL where two GPUs and NCCL exist. `vs_cpu`: false for AWQ models (the CPU quantizes the head,
// the device keeps the file's; docs/gpu.md).
void check_model(const std::string& dir, const std::vector<int32_t>& prompt, bool vs_cpu, float rel_tp) {
  const Result dev1 = run(dir, Kind::Device, 1, prompt);
  for (int32_t t : dev1.tokens) ASSERT_GE(t, 0);
  if (vs_cpu) expect_agree(run(dir, Kind::Cpu, 1, prompt), dev1, 1e-3f, "TP=1 on the device vs the CPU");
  const Result shm2 = run(dir, Kind::Device, 2, prompt);
  expect_agree(dev1, shm2, rel_tp, "TP=2 (shared memory, one GPU) vs TP=1 on the device");
  expect_ranks_agree(shm2, 0.0f, "TP=2 (shared memory)");
  if (test::device_count_forked() >= 2 && dist::nccl_built()) {
    const Result nccl2 = run(dir, Kind::DeviceNccl, 2, prompt);
    expect_agree(dev1, nccl2, rel_tp, "TP=2 (NCCL, two GPUs) vs TP=1 on the device");
    expect_ranks_agree(nccl2, rel_tp, "TP=2 (NCCL)");
  } else {
    std::printf("[ note ] TP=2 over NCCL not run: %d device(s), NCCL %s\n", test::device_count_forked(),
                dist::nccl_built() ? "built" : "not built");
  }
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + 11) % (vocab - 3) + 3));
  return p;
}

std::string write_fixture(const std::string& name, const FixtureSpec& s) {
  const std::string dir = test::make_temp_dir(name);
  dist::run_ranks(1, [&](dist::Comm&) { write_fixture_model(dir, s); });  // the parent stays pool- and CUDA-free
  return dir;
}

// GQA 8 query heads over 4 K/V heads, head_dim 32 (the tiled kernels: FA2 for the 40-token
// prompt, split-K for the steps); intermediate 345 splits unevenly (172 + 173).
FixtureSpec gqa_spec(const std::string& arch) {
  FixtureSpec s;
  s.arch = arch;
  s.hidden = 256, s.heads = 8, s.kv_heads = 4, s.head_dim = 32, s.intermediate = 345, s.layers = 3;
  s.tokenizer_kind = "";
  s.vocab = 300;
  s.init_std = 0.08f;  // logits far from a tie
  s.seed = 11;
  return s;
}

}  // namespace

// ---- every build ----

// What a tensor-parallel device runner refuses, before any device work: the same plan errors as
// TpShard on the CPU in every build; then, in a CUDA build, a pool of the whole model's K/V
// heads, layer streaming, and no device.
TEST(TpDevice, ErrorsAreClearBeforeAnyDeviceWork) {
  FixtureSpec s = fixture_preset("tiny");  // 8 heads, 4 K/V heads, intermediate 172
  s.tokenizer_kind = "";
  const std::string dir = write_fixture("tp_device_errors", s);
  const int n_dev = test::device_count_forked();
  // PagedRunner::create for rank `rank` of a shared-memory group of `world`, in a child.
  auto create_error = [&](int world, int rank, const std::function<void(gpu::PagedRunnerOptions&, const ModelConfig&)>& f) {
    return error_of([&] {
      dist::run_ranks(1, [&](dist::Comm&) {
        auto g = dist::ShmGroup::create(world);
        auto m = load_for_device(dir);
        const ModelConfig& c = m->config();
        gpu::PagedRunnerOptions o;
        o.comm = g->comm(rank);
        const int64_t nkv = c.n_kv_heads % world == 0 ? c.n_kv_heads / world : c.n_kv_heads;
        o.pool = gpu::PoolLayout{c.n_layers, 8, kBlock, nkv, c.head_dim};
        f(o, c);
        gpu::PagedRunner::create(*m, o);
      });
    });
  };
  const std::string no_cuda = "kvboost was built without CUDA (-DKVBOOST_CUDA=ON)";
  const bool cuda = gpu::built_with_cuda();
  auto nothing = [](gpu::PagedRunnerOptions&, const ModelConfig&) {};
  std::string e = create_error(3, 0, nothing);
  EXPECT_NE(e.find("tensor parallel: 8 attention heads and 4 K/V heads do not split over 3 ranks"), std::string::npos) << e;
  e = create_error(2, 1, [](gpu::PagedRunnerOptions& o, const ModelConfig& c) { o.pool.n_kv_heads = c.n_kv_heads; });
  EXPECT_NE(e.find(cuda ? "the K/V pool layout does not match the model shard" : no_cuda), std::string::npos) << e;
  if (cuda) {
    EXPECT_NE(e.find("the model shard has 2 layers x 2 K/V heads x 8"), std::string::npos) << e;
  }
  e = create_error(2, 0, [](gpu::PagedRunnerOptions& o, const ModelConfig&) { o.vram_budget = uint64_t(1) << 30; });
  EXPECT_NE(e.find(cuda ? "tensor parallelism with layer streaming (vram_budget) is not supported" : no_cuda),
            std::string::npos) << e;
  e = create_error(2, 1, nothing);
  if (!cuda) {
    EXPECT_NE(e.find(no_cuda), std::string::npos) << e;
  } else if (n_dev == 0) {
    EXPECT_NE(e.find("no CUDA device is visible"), std::string::npos) << e;
  } else {
    EXPECT_EQ(e, "") << "a valid shard on a device";
  }
}

// The device layout's tensors of a llama layer with attention_bias (q/k/v/o biases) and a qwen3
// layer (q/k norms)
// under tp_plan: the rank's rows of Wq/Wk/Wv/gate/up and biases, its columns of Wo/down, norms
// whole, the o_proj bias on rank 0 only; world 1 (or no plan) slices nothing.
TEST(TpDevice, ShardEntriesFollowTheShardRules) {
  using namespace gpu::dev;
  ModelConfig c;
  c.model_type = "llama";
  c.attention_bias = true;
  c.hidden_size = 256, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 32, c.intermediate_size = 345, c.n_layers = 2;
  auto by_id = [](const std::vector<LayerEntry>& es) {
    std::vector<const LayerEntry*> m(kNumPieces, nullptr);
    for (const LayerEntry& e : es) m[size_t(e.id)] = &e;
    return m;
  };
  const TpPlan one = tp_plan(c, 0, 1);
  for (const TpPlan* p : {static_cast<const TpPlan*>(nullptr), &one}) {
    const std::vector<LayerEntry> whole = layer_entries(c, 1, p);
    EXPECT_EQ(whole.size(), size_t(13));  // 7 matrices, 2 norms, q/k/v/o biases
    for (const LayerEntry& e : whole) {
      EXPECT_FALSE(e.sliced()) << e.name;
      EXPECT_EQ(e.r0 + e.c0, 0) << e.name;
    }
  }
  const TpPlan p1 = tp_plan(c, 1, 2);
  const std::vector<LayerEntry> es = layer_entries(c, 1, &p1);
  const auto e = by_id(es);
  ASSERT_TRUE(e[kWq] && e[kWk] && e[kWv] && e[kWo] && e[kGate] && e[kUp] && e[kDown] && e[kQBias] && e[kKBias] && e[kVBias]);
  EXPECT_EQ(e[kWq]->name, "model.layers.1.self_attn.q_proj.weight");
  // Wq: rows 128..256 of [256, 256]; Wk / Wv: rows 64..128 of [128, 256].
  EXPECT_EQ(std::vector<int64_t>({e[kWq]->rows, e[kWq]->cols, e[kWq]->full_rows, e[kWq]->full_cols, e[kWq]->r0, e[kWq]->c0}),
            std::vector<int64_t>({128, 256, 256, 256, 128, 0}));
  for (int id : {kWk, kWv})
    EXPECT_EQ(std::vector<int64_t>({e[id]->rows, e[id]->cols, e[id]->full_rows, e[id]->full_cols, e[id]->r0, e[id]->c0}),
              std::vector<int64_t>({64, 256, 128, 256, 64, 0}));
  // Wo: columns 128..256 of [256, 256]; down: columns 172..345 of [256, 345]; gate / up rows 172..345.
  EXPECT_EQ(std::vector<int64_t>({e[kWo]->rows, e[kWo]->cols, e[kWo]->r0, e[kWo]->c0}), std::vector<int64_t>({256, 128, 0, 128}));
  EXPECT_EQ(std::vector<int64_t>({e[kDown]->rows, e[kDown]->cols, e[kDown]->full_cols, e[kDown]->c0}),
            std::vector<int64_t>({256, 173, 345, 172}));
  for (int id : {kGate, kUp})
    EXPECT_EQ(std::vector<int64_t>({e[id]->rows, e[id]->cols, e[id]->full_rows, e[id]->r0}), std::vector<int64_t>({173, 256, 345, 172}));
  // Biases: the rank's heads; vectors have cols 0.
  EXPECT_EQ(std::vector<int64_t>({e[kQBias]->rows, e[kQBias]->cols, e[kQBias]->full_rows, e[kQBias]->r0}),
            std::vector<int64_t>({128, 0, 256, 128}));
  EXPECT_EQ(std::vector<int64_t>({e[kKBias]->rows, e[kKBias]->full_rows, e[kKBias]->r0}), std::vector<int64_t>({64, 128, 64}));
  EXPECT_EQ(std::vector<int64_t>({e[kVBias]->rows, e[kVBias]->full_rows, e[kVBias]->r0}), std::vector<int64_t>({64, 128, 64}));
  EXPECT_EQ(e[kOBias], nullptr) << "the o_proj bias is rank 0's";
  for (int id : {kAttnNorm, kMlpNorm}) {
    ASSERT_NE(e[id], nullptr);
    EXPECT_FALSE(e[id]->sliced());
    EXPECT_EQ(e[id]->rows, 256);
  }
  const TpPlan p0 = tp_plan(c, 0, 2);
  const std::vector<LayerEntry> es0 = layer_entries(c, 0, &p0);
  const auto e0 = by_id(es0);
  ASSERT_NE(e0[kOBias], nullptr);
  EXPECT_FALSE(e0[kOBias]->sliced());
  EXPECT_EQ(e0[kWq]->r0, 0);
  EXPECT_EQ(e0[kDown]->cols, 172);
  // qwen3: q/k norms (head_dim) whole on every rank, no biases.
  ModelConfig q3 = c;
  q3.model_type = "qwen3";
  q3.attention_bias = false;
  q3.qk_norm = true;
  const TpPlan p3 = tp_plan(q3, 1, 2);
  const std::vector<LayerEntry> es3 = layer_entries(q3, 0, &p3);
  const auto e3 = by_id(es3);
  ASSERT_TRUE(e3[kQNorm] && e3[kKNorm]);
  EXPECT_EQ(e3[kQNorm]->rows, 32);
  EXPECT_FALSE(e3[kQNorm]->sliced());
  EXPECT_FALSE(e3[kKNorm]->sliced());
  EXPECT_EQ(e3[kQBias], nullptr);
}

// The harness itself (forked ranks, shared-memory results, the token broadcast) on the CPU
// reference, which needs no device.
TEST(TpDevice, HarnessRunsTheCpuReference) {
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  s.vocab = 300;
  const std::string dir = write_fixture("tp_device_harness", s);
  const Result a = run(dir, Kind::Cpu, 1, prompt_of(12, s.vocab));
  ASSERT_EQ(a.logits.size(), size_t((12 + kGen) * 300));
  for (float v : a.logits) ASSERT_TRUE(std::isfinite(v));
  for (int32_t t : a.tokens) EXPECT_GE(t, 0);
  expect_agree(a, run(dir, Kind::Cpu, 1, prompt_of(12, s.vocab)), 1e-6f, "the CPU reference twice");
}

// ---- on a device ----

class TpDeviceFixture : public ::testing::TestWithParam<std::string> {};

// llama, qwen2 (q/k/v biases: sliced per rank), qwen3 (q/k norms). (The o_proj bias, rank 0's
// only, is in no fixture: ShardEntriesFollowTheShardRules checks where it goes.)
TEST_P(TpDeviceFixture, Tp2MatchesTp1AndTheCpu) {
  REQUIRE_GPU_FORKED();
  const FixtureSpec s = gqa_spec(GetParam());
  check_model(write_fixture("tp_device_" + s.arch, s), prompt_of(40, s.vocab), true, 2e-4f);
}

INSTANTIATE_TEST_SUITE_P(Archs, TpDeviceFixture, ::testing::Values("llama", "qwen2", "qwen3"));

// stories260K: head_dim 8 (the plain paged attention kernel), 8 heads over 4, intermediate 172.
TEST(TpDevice, Stories260KTp2MatchesTp1AndTheCpu) {
  REQUIRE_GPU_FORKED();
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  check_model(dir, {1, 403, 407, 261, 378, 274, 291, 412, 312, 304, 375, 433, 293, 261, 400, 301, 290, 277}, true, 2e-4f);
}

// AutoAWQ 4-bit, group 128 (Q4_Z128 on the device): the shards slice the repacked blocks (O and
// down split by columns at 128); TP=2 against TP=1 on the device (bf16 activations in prefill:
// a looser bound). An intermediate whose half is not a multiple of 128 cannot split down_proj.
TEST(TpDevice, AwqShardsMatchTp1AndUnevenGroupsAreAnError) {
  REQUIRE_GPU_FORKED();
  FixtureSpec s = gqa_spec("llama");
  s.intermediate = 512;
  s.dtype = "f16";
  s.quant = "awq";
  s.group_size = 128;
  check_model(write_fixture("tp_device_awq", s), prompt_of(40, s.vocab), false, 2e-3f);
  s.intermediate = 384;  // 192 per rank
  const std::string bad = write_fixture("tp_device_awq_uneven", s);
  const std::string e = error_of([&] { run(bad, Kind::Device, 2, prompt_of(4, s.vocab)); });
  // Either rank may report first: columns 0..192 or 192..384.
  EXPECT_NE(e.find("mlp.down_proj.weight (Q4_Z128, blocks of 128 columns) cannot be split at columns "), std::string::npos)
      << e;
}

// CacheBlend under TP: a prompt prefilled, the cached K/V of every reused row in layers 1..
// moved by a row-specific amount (a function of the global K/V column: each rank moves its
// heads' share of the same change, tests/model/test_tp_forward.cpp's scheme), then forward_blend.
// The ranks all-reduce the rows' deviation sums, so TP = 2 keeps the rows TP = 1 keeps: the same
// stats, logits within 2e-4 (the moved K/V make them depend on the selection), rank 1's equal
// to rank 0's; TP = 1 on the device against Model::forward_blend on the CPU within 1e-3.
struct BlendResult {
  std::vector<float> logits, rank1;
  BlendStats st;
};

BlendResult run_blend(const std::string& dir, Kind kind, int world, const std::vector<int32_t>& prompt) {
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  const int64_t n = int64_t(prompt.size()), V = cfg.vocab_size, n_blocks = (n + kBlock) / kBlock;
  const size_t bytes = size_t(2 * V) * sizeof(float) + sizeof(BlendStats);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail("mmap of ", bytes, " bytes");
  auto* out = static_cast<float*>(mem);
  std::fill(out, out + 2 * V, std::nanf(""));
  auto* st = reinterpret_cast<BlendStats*>(out + 2 * V);
  dist::run_ranks(world, [&](dist::Comm& c) {
    const int r = c.rank();
    const int64_t nkv = (world > 1 ? tp_plan(cfg, r, world).config.n_kv_heads : cfg.n_kv_heads) * cfg.head_dim;
    const int64_t col0 = int64_t(r) * nkv;
    auto move = [&](int64_t l, int64_t p, float* k, float* v) {
      const float amp = 0.03f * float(1 + (p * 5) % (n - 1));
      for (int64_t j = 0; j < nkv; ++j) {
        const float f = std::sin(float(l * 13 + p * 7) + 0.37f * float(col0 + j));
        k[j] += amp * f, v[j] -= amp * f;
      }
    };
    std::vector<uint8_t> reused(size_t(n), 1);
    BlendOptions bo;
    bo.check_layer = 1, bo.ratio = 0.25f, bo.reused = reused.data();
    std::vector<float> lg(static_cast<size_t>(V));
    BlendStats s;
    if (kind == Kind::Cpu) {
      auto m = Model::load(dir);
      KvCache kv(m->config(), n + 1);
      m->forward(prompt.data(), n, kv, lg.data());
      for (int64_t l = 1; l < cfg.n_layers; ++l)
        for (int64_t p = 0; p < n - 1; ++p) move(l, p, kv.k(l) + p * nkv, kv.v(l) + p * nkv);
      KvView view = kv.view();
      view.n_past = 0;
      s = m->forward_blend(prompt.data(), n, view, bo, lg.data());
    } else {
      auto m = load_for_device(dir);
      gpu::PagedRunnerOptions o;
      o.comm = world > 1 ? c : dist::Comm::local();
      o.rows_hint = 64;
      o.pool = gpu::PoolLayout{cfg.n_layers, n_blocks, kBlock, nkv / cfg.head_dim, cfg.head_dim};
      auto runner = gpu::PagedRunner::create(*m, o);
      std::vector<kv::BlockId> table(static_cast<size_t>(n_blocks));
      std::iota(table.begin(), table.end(), kv::BlockId(0));
      gpu::PagedSeq q;
      q.tokens = prompt.data(), q.n = n, q.block_table = table, q.logits = lg.data(), q.n_logits = 1;
      runner->forward_batch(&q, 1);
      std::vector<float> k(size_t(n * nkv)), v(size_t(n * nkv));
      for (int64_t l = 1; l < cfg.n_layers; ++l) {
        runner->read_rows(l, table, 0, n, k.data(), v.data());
        for (int64_t p = 0; p < n - 1; ++p) move(l, p, k.data() + p * nkv, v.data() + p * nkv);
        runner->write_rows(l, table, 0, n, k.data(), v.data());
      }
      s = runner->forward_blend(prompt.data(), n, 0, table, bo, lg.data());
    }
    if (r == 0) *st = s, std::copy(lg.begin(), lg.end(), out);
    if (r == 1) std::copy(lg.begin(), lg.end(), out + V);
  }, size_t(1) << 20, 300);
  BlendResult res;
  res.logits.assign(out, out + V);
  res.rank1.assign(out + V, out + 2 * V);
  res.st = *st;
  munmap(mem, bytes);
  return res;
}

void expect_blend_agree(const BlendResult& ref, const BlendResult& got, float rel, const std::string& what) {
  expect_logits_agree(ref.logits, got.logits, rel, what);
  EXPECT_EQ(ref.st.n_selected, got.st.n_selected) << what;
  EXPECT_EQ(ref.st.n_rows_late, got.st.n_rows_late) << what;
  EXPECT_EQ(ref.st.n_row_layers, got.st.n_row_layers) << what;
}

TEST(TpDevice, ForwardBlendUnderTpSelectsTheSameRows) {
  REQUIRE_GPU_FORKED();
  FixtureSpec s = gqa_spec("qwen2");
  s.layers = 4;
  const std::string dir = write_fixture("tp_device_blend", s);
  const std::vector<int32_t> prompt = prompt_of(40, s.vocab);
  const BlendResult cpu = run_blend(dir, Kind::Cpu, 1, prompt);
  EXPECT_EQ(cpu.st.n_selected, 10);  // ceil(0.25 x 39 candidates)
  const BlendResult dev1 = run_blend(dir, Kind::Device, 1, prompt);
  expect_blend_agree(cpu, dev1, 1e-3f, "TP=1 on the device vs Model::forward_blend");
  const BlendResult dev2 = run_blend(dir, Kind::Device, 2, prompt);
  expect_blend_agree(dev1, dev2, 2e-4f, "TP=2 (shared memory) vs TP=1 on the device");
  EXPECT_EQ(dev2.logits, dev2.rank1) << "rank 1's logits are not rank 0's";
}
