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
