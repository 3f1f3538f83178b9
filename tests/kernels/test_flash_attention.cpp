// Paged FlashAttention-2 kernel against the scalar paged reference and against the contiguous
// naive attention_ref (after gathering the pages), on every ISA path this CPU has (through the
// dispatched public entry points, so an AVX-512 CPU tests the native AVX-512 build here). The
// checks are in paged_attention_checks.h; test_flash_attention_avx512_emu.cpp runs the same ones
// on the AVX-512 micro-kernels built on SIMDe's emulation.
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "paged_attention_checks.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::kernels;
using namespace kvboost::kernel_test;

namespace {

// The public entry points with the active ISA forced to `isa`.
PagedKernel dispatched(Isa isa) {
  return {isa_name(isa), [isa](const Case& c, const float* q, const Paged& p, float* out, float* lse,
                               int64_t n_splits) {
            set_active_isa(isa);
            paged_attention_split(q, p.k_pool.data(), p.v_pool.data(), p.table.data(), out, c.n_q,
                                  c.pos0, c.n_kv, c.block_size, c.heads, c.kv_heads, c.hd, c.window,
                                  scale_of(c), n_splits, lse);
          }};
}

std::vector<PagedKernel> all_isas() {
  std::vector<PagedKernel> out;
  for (Isa isa : isas()) out.push_back(dispatched(isa));
  return out;
}

}  // namespace

TEST(PagedAttention, ReferenceMatchesContiguousNaiveAttention) {
  auto cases = fixed_cases();
  auto rnd = random_cases(30, 99);
  cases.insert(cases.end(), rnd.begin(), rnd.end());
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const auto p = make_paged(c, seed += 10);
    const auto q = randn(size_t(c.n_q * c.heads * c.hd), seed + 5);
    std::vector<float> want(q.size());
    attention_ref(q.data(), p.k.data(), p.v.data(), want.data(), c.n_q, c.pos0, c.n_kv, c.heads,
                  c.kv_heads, c.hd, c.window, scale_of(c));
    expect_close(run_ref(c, q, p), want, 1e-6f, "paged ref vs attention_ref " + c.str());
  }
}

TEST(PagedAttention, PublicEntryPointIsAutomaticSplit) {
  // paged_attention = paged_attention_split(..., n_splits = 0, lse = nullptr), on every ISA.
  IsaGuard g;
  const Case c{1, 2999, 3000, 14, 2, 64, 16, 0};
  const auto p = make_paged(c, 77);
  const auto q = randn(size_t(c.n_q * c.heads * c.hd), 78);
  for (const PagedKernel& k : all_isas()) {
    const auto want = k(c, q, p, 0);
    std::vector<float> got(q.size(), -1.0f);
    paged_attention(q.data(), p.k_pool.data(), p.v_pool.data(), p.table.data(), got.data(), c.n_q,
                    c.pos0, c.n_kv, c.block_size, c.heads, c.kv_heads, c.hd, c.window, scale_of(c));
    expect_close(got, want, 0.0f, k.name);
  }
}

TEST(PagedAttention, MatchesReferencesOnFixedAndRandomShapesAllIsas) {
  IsaGuard g;
  auto cases = fixed_cases();
  auto rnd = random_cases(60, 2024);
  cases.insert(cases.end(), rnd.begin(), rnd.end());
  check_matches_references(all_isas(), cases, 7);
}

TEST(PagedAttention, DecodeSplitKEqualsUnsplit) {
  IsaGuard g;
  for (const PagedKernel& k : all_isas()) check_split_k_equals_unsplit(k);
}

TEST(PagedAttention, SameResultOnOneThreadAndAll) {
  IsaGuard g;
  for (const PagedKernel& k : all_isas()) check_one_thread_and_all(k);
}

TEST(PagedAttention, WindowOneReturnsOwnValueRow) {
  IsaGuard g;
  for (const PagedKernel& k : all_isas()) check_window_one_returns_own_value_row(k);
}

TEST(PagedAttention, LargeScoresDoNotOverflow) {
  IsaGuard g;
  for (const PagedKernel& k : all_isas()) check_large_scores_do_not_overflow(k);
}

TEST(PagedAttention, LogSumExpOutput) {
  IsaGuard g;
  for (const PagedKernel& k : all_isas()) check_log_sum_exp(k);
}

// A query's output must not depend on the other queries of the call (the engine's prefill steps
// and prefix-cache hits cut a prompt at any position): Gemma 3's shape (4 query heads on 1 kv
// head of 256, sliding window 512), 1,200 positions in paged blocks of 16, all queries in one
// call against steps of 97 / 128 / 257 / 300 tokens, on every ISA path: bit-identical. (The
// key tiles lie on one grid from key 0; when a sliding window started them at the unit's first
// visible key, the last bits moved with the cut, and Gemma 3's int8 activation blocks turned
// them into ~0.5 logits: PrefillSplit.*.)
TEST(PagedAttention, QueriesDoNotDependOnTheStep) {
  const int64_t n = 1200, bs = 16, H = 4, KVH = 1, hd = 256;
  const int64_t n_blocks = n / bs;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t((b * 37) % n_blocks);  // scattered blocks
  const std::vector<float> k = randv(size_t(n * KVH * hd), 21), v = randv(size_t(n * KVH * hd), 22);
  const std::vector<float> q = randv(size_t(n * H * hd), 23, 8.0f);
  IsaGuard g;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    set_active_isa(isa);
    if (active_isa() != isa) continue;
    for (int64_t window : {int64_t(0), int64_t(512)}) {
      std::vector<float> full(size_t(n * H * hd));
      paged_attention(q.data(), k.data(), v.data(), table.data(), full.data(), n, 0, n, bs, H, KVH, hd, window, 0.0625f);
      for (int64_t step : {97, 128, 257, 300}) {
        std::vector<float> out(size_t(n * H * hd));
        for (int64_t p0 = 0; p0 < n; p0 += step) {
          const int64_t m = std::min(step, n - p0);
          paged_attention(q.data() + p0 * H * hd, k.data(), v.data(), table.data(), out.data() + p0 * H * hd, m, p0,
                          p0 + m, bs, H, KVH, hd, window, 0.0625f);
        }
        float worst = 0;
        int64_t at = -1;
        for (size_t i = 0; i < out.size(); ++i)
          if (std::fabs(out[i] - full[i]) > worst) worst = std::fabs(out[i] - full[i]), at = int64_t(i) / (H * hd);
        EXPECT_EQ(worst, 0.0f) << isa_name(isa) << ", window " << window << ", steps of " << step << ": position " << at;
      }
    }
  }
}
