// The AVX-512 micro-kernels of the paged FlashAttention-2 kernel, built on SIMDe's portable
// AVX-512 (flash_attention_avx512_emu.cpp), through the same checks as every native ISA path in
// test_flash_attention.cpp: against the scalar paged reference and the naive contiguous
// attention over fixed and random shapes (odd lengths, head dims 8..128 with and without a
// 16-lane tail, GQA ratios 1..8, prefill, decode and chunked prefill, causal and sliding window,
// split-K), plus the log-sum-exp output. On an AVX-512 CPU the native build of the same source
// runs in test_flash_attention.cpp.
#include <vector>

#include "flash_attention_avx512_emu.h"
#include "kernel_test_util.h"
#include "kvboost/common.h"
#include "paged_attention_checks.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::kernel_test;

namespace {

PagedKernel emulated() {
  return {"avx512 (SIMDe)", [](const Case& c, const float* q, const Paged& p, float* out,
                               float* lse, int64_t n_splits) {
            paged_attention_avx512_emu(q, p.k_pool.data(), p.v_pool.data(), p.table.data(), out,
                                       c.n_q, c.pos0, c.n_kv, c.block_size, c.heads, c.kv_heads,
                                       c.hd, c.window, scale_of(c), n_splits, lse);
          }};
}

class PagedAttentionAvx512Emulated : public ::testing::Test {
 protected:
  void SetUp() override {
    const CpuFeatures& f = cpu_features();
    if (!(f.avx2 && f.fma)) GTEST_SKIP() << "the SIMDe build runs on AVX2+FMA; this CPU lacks them";
  }
  IsaGuard guard;  // restores the thread count
};

}  // namespace

TEST_F(PagedAttentionAvx512Emulated, MatchesReferencesOnFixedAndRandomShapes) {
  auto cases = fixed_cases();
  for (uint64_t seed : {2024, 4049}) {  // 2024: the native paths' random shapes; 4049: more
    auto rnd = random_cases(60, seed);
    cases.insert(cases.end(), rnd.begin(), rnd.end());
  }
  check_matches_references({emulated()}, cases, 7);
}

TEST_F(PagedAttentionAvx512Emulated, DecodeSplitKEqualsUnsplit) {
  check_split_k_equals_unsplit(emulated());
}

TEST_F(PagedAttentionAvx512Emulated, SameResultOnOneThreadAndAll) {
  check_one_thread_and_all(emulated());
}

TEST_F(PagedAttentionAvx512Emulated, WindowOneReturnsOwnValueRow) {
  check_window_one_returns_own_value_row(emulated());
}

TEST_F(PagedAttentionAvx512Emulated, LargeScoresDoNotOverflow) {
  check_large_scores_do_not_overflow(emulated());
}

TEST_F(PagedAttentionAvx512Emulated, LogSumExpOutput) { check_log_sum_exp(emulated()); }

// Native AVX2 and emulated AVX-512 differ only in summation order: within a few ulp of each other.
TEST_F(PagedAttentionAvx512Emulated, CloseToTheAvx2Path) {
  set_active_isa(Isa::Avx2);
  if (active_isa() != Isa::Avx2) GTEST_SKIP() << "no AVX2 path on this CPU";
  const Case c{257, 0, 257, 14, 2, 64, 16, 0};
  const auto p = make_paged(c, 3);
  const auto q = randn(size_t(c.n_q * c.heads * c.hd), 4);
  std::vector<float> avx2(q.size());
  kernels::paged_attention_split(q.data(), p.k_pool.data(), p.v_pool.data(), p.table.data(),
                                 avx2.data(), c.n_q, c.pos0, c.n_kv, c.block_size, c.heads,
                                 c.kv_heads, c.hd, c.window, scale_of(c), 1);
  expect_close(emulated()(c, q, p, 1), avx2, 2e-6f, "emulated avx512 vs avx2");
}
