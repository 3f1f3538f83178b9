// Tensor-parallel forward (TpShard, src/model/tp_forward.cpp) over the shared-memory
// collectives: TP = 2 and 4 in forked processes agree with TP = 1 and with the plain forward
// (logits within float tolerance, the same greedy tokens) on stories260K and on generated GQA
// fixtures (llama, qwen2 with q/k/v/o biases, qwen3 with q/k norms).
//
// Every model load and forward runs inside a child of dist::run_ranks (the reference too): the
// parent never starts the kernels' thread pool, which a fork would not carry.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>

#include "kvboost/dist.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;

using kvboost::test::error_of;

namespace {

constexpr int64_t kGen = 12;  // greedy tokens after the prompt

// What rank 0 of a run leaves in shared memory: the prompt's logits [n, vocab], then per
// generated step its logits [vocab], and the greedy tokens.
struct Shared {
  float* logits = nullptr;
  int32_t* tokens = nullptr;
  size_t n_logits = 0;
  Shared(int64_t n_prompt, int64_t vocab) {
    n_logits = size_t((n_prompt + kGen) * vocab);
    const size_t bytes = n_logits * sizeof(float) + size_t(kGen) * sizeof(int32_t);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    logits = static_cast<float*>(p);
    tokens = reinterpret_cast<int32_t*>(logits + n_logits);
    std::fill(logits, logits + n_logits, std::nanf(""));
    std::fill(tokens, tokens + kGen, -1);
  }
};

struct Run {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};

// world 0: the plain Model::forward (packed weights, the default load); else TpShard.
Run run(const std::string& dir, int world, const std::vector<int32_t>& prompt, int64_t vocab) {
  const int64_t n = int64_t(prompt.size());
  Shared sh(n, vocab);
  dist::run_ranks(std::max(world, 1), [&](dist::Comm& c) {
    LoadOptions o;
    o.pack_weights = world == 0;
    auto m = Model::load(dir, o);
    std::unique_ptr<TpShard> shard = world ? TpShard::create(*m, c.rank(), world) : nullptr;
    KvCache kv(shard ? shard->config() : m->config(), n + kGen + 1);
    std::vector<float> lg(static_cast<size_t>(n * vocab));
    auto fwd = [&](const int32_t* t, int64_t k, bool all) {
      if (shard) shard->forward(t, k, kv, lg.data(), all, c);
      else m->forward(t, k, kv, lg.data(), all);
    };
    fwd(prompt.data(), n, true);
    if (c.rank() == 0) std::copy(lg.begin(), lg.end(), sh.logits);
    int32_t tok = int32_t(kernels::argmax(&lg[size_t((n - 1) * vocab)], vocab));
    for (int64_t g = 0; g < kGen; ++g) {
      if (c.rank() == 0) sh.tokens[g] = tok;
      fwd(&tok, 1, false);
      if (c.rank() == 0) std::copy(lg.begin(), lg.begin() + vocab, sh.logits + (n + g) * vocab);
      tok = int32_t(kernels::argmax(lg.data(), vocab));
    }
  }, size_t(1) << 16, 120);
  Run r;
  r.logits.assign(sh.logits, sh.logits + sh.n_logits);
  r.tokens.assign(sh.tokens, sh.tokens + kGen);
  return r;
}

// Relative to the reference's largest |logit|: float reassociation of the split sums only.
void expect_agree(const Run& ref, const Run& got, const std::string& what) {
  ASSERT_EQ(ref.logits.size(), got.logits.size());
  float scale = 0, worst = 0;
  for (float v : ref.logits) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.logits[i])) << what << " logit " << i;
    worst = std::max(worst, std::fabs(ref.logits[i] - got.logits[i]));
  }
  EXPECT_LT(worst, 2e-4f * std::max(scale, 1.0f)) << what << ": max |diff| " << worst << " (max |logit| " << scale << ")";
  EXPECT_EQ(ref.tokens, got.tokens) << what;
}

void check_model(const std::string& dir, const std::vector<int32_t>& prompt) {
  const int64_t vocab = ModelConfig::from_dir(dir).vocab_size;
  const Run plain = run(dir, 0, prompt, vocab);
  for (int32_t t : plain.tokens) ASSERT_GE(t, 0);
  const Run tp1 = run(dir, 1, prompt, vocab);
  expect_agree(plain, tp1, "TP=1 vs the plain forward");
  for (int world : {2, 4}) expect_agree(tp1, run(dir, world, prompt, vocab), "TP=" + std::to_string(world) + " vs TP=1");
}

}  // namespace

TEST(TpForward, Stories260KAgreesAtTp2AndTp4) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  // "Once upon a time, there was a little" in stories260K's vocabulary, and more.
  check_model(dir, {1, 403, 407, 261, 378, 274, 291, 412, 312, 304, 375, 433, 293, 261});
}

class TpFixture : public ::testing::TestWithParam<std::string> {};

// GQA: 16 query heads over 4 K/V heads (groups of 4), head_dim 8; TP=4 leaves one K/V head and
// its four query heads per rank. intermediate 172: an uneven split at TP=4 is 43 each, at 2 86.
TEST_P(TpFixture, GqaFixtureAgreesAtTp2AndTp4) {
  FixtureSpec s;
  s.arch = GetParam();
  s.hidden = 128, s.heads = 16, s.kv_heads = 4, s.head_dim = 8, s.intermediate = 172, s.layers = 3;
  s.tokenizer_kind = "";
  s.vocab = 300;
  s.init_std = 0.08f;  // larger weights: logits far from a tie, attention far from uniform
  s.seed = 7;
  const std::string dir = test::make_temp_dir("tp_fixture_" + s.arch);
  dist::run_ranks(1, [&](dist::Comm&) { write_fixture_model(dir, s); });  // the parent stays pool-free
  check_model(dir, {5, 17, 240, 3, 99, 150, 150, 42, 7, 260, 11});
}

INSTANTIATE_TEST_SUITE_P(Archs, TpFixture, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(TpForward, BadShardsAreClearErrors) {
  const std::string dir = test::make_temp_dir("tp_errors");
  FixtureSpec s = fixture_preset("tiny");  // 8 heads, 4 K/V heads
  s.tokenizer_kind = "";
  write_fixture_model(dir, s);
  // Loading in the parent is fine here: no forward runs, and no fork follows.
  LoadOptions o;
  o.pack_weights = false;
  o.prefault = false;
  auto m = Model::load(dir, o);
  EXPECT_NE(error_of([&] { TpShard::create(*m, 0, 3); }).find("8 attention heads and 4 K/V heads do not split over 3 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TpShard::create(*m, 2, 2); }).find("rank 2 of world 2"), std::string::npos);
  auto packed = Model::load(dir);
  const std::string e = error_of([&] { TpShard::create(*packed, 0, 2); });
  EXPECT_TRUE(e.empty() || e.find("pack_weights = false") != std::string::npos) << e;  // tiny matrices may stay unpacked
  auto shard = TpShard::create(*m, 1, 2);
  EXPECT_EQ(shard->config().n_heads, 4);
  EXPECT_EQ(shard->config().n_kv_heads, 2);
  EXPECT_EQ(shard->config().intermediate_size, 86);
  dist::Comm local = dist::Comm::local();
  KvCache kv(shard->config(), 4);
  int32_t t = 1;
  float lg[1];
  EXPECT_NE(error_of([&] { shard->forward(&t, 1, kv, lg, false, local); }).find("shard 1/2 run with communicator rank 0/1"),
            std::string::npos);
}
