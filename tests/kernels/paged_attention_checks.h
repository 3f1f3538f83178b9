// Shared by the paged-attention tests: shapes, paged K/V with poisoned unmapped slots, the
// references, and the checks every build of the FlashAttention-2 kernel must pass. A build under
// test is a PagedKernel: the dispatched public entry points on one ISA (test_flash_attention.cpp,
// every ISA this CPU has, the native AVX-512 one included where the CPU has it) or the AVX-512
// micro-kernels on SIMDe's emulation (test_flash_attention_avx512_emu.cpp).
//
// Pools are filled with NaN except the slots the block table maps, and block tables are shuffled
// with spare blocks, so reading any slot the kernel must not read poisons the output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::kernel_test {

inline std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Case {
  int64_t n_q, pos0, n_kv, heads, kv_heads, hd, block_size, window;
  std::string str() const {
    std::ostringstream s;
    s << "n_q=" << n_q << " pos0=" << pos0 << " n_kv=" << n_kv << " heads=" << heads << "/"
      << kv_heads << " hd=" << hd << " bs=" << block_size << " window=" << window;
    return s.str();
  }
};

// One layer's K/V both contiguous ([n_kv, kv_heads, hd]) and paged into shuffled blocks.
struct Paged {
  std::vector<float> k, v;            // contiguous
  std::vector<float> k_pool, v_pool;  // [n_blocks_total][bs][kv_heads][hd], NaN where unmapped
  std::vector<int32_t> table;
};

inline Paged make_paged(const Case& c, uint64_t seed) {
  Paged p;
  const int64_t row = c.kv_heads * c.hd;
  p.k = randn(size_t(c.n_kv * row), seed);
  p.v = randn(size_t(c.n_kv * row), seed + 1);
  const int64_t n_blocks = (c.n_kv + c.block_size - 1) / c.block_size;
  const int64_t n_total = n_blocks + 3;  // spare blocks, never referenced
  std::vector<int32_t> perm(static_cast<size_t>(n_total));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed + 2);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.table.assign(perm.begin(), perm.begin() + n_blocks);
  p.k_pool.assign(size_t(n_total * c.block_size * row), NAN);
  p.v_pool.assign(p.k_pool.size(), NAN);
  for (int64_t t = 0; t < c.n_kv; ++t) {
    const int64_t dst = (int64_t(p.table[t / c.block_size]) * c.block_size + t % c.block_size) * row;
    std::copy_n(p.k.begin() + t * row, row, p.k_pool.begin() + dst);
    std::copy_n(p.v.begin() + t * row, row, p.v_pool.begin() + dst);
  }
  return p;
}

inline float scale_of(const Case& c) { return 1.0f / std::sqrt(float(c.hd)); }

inline std::vector<float> run_ref(const Case& c, const std::vector<float>& q, const Paged& p) {
  std::vector<float> o(q.size(), -1.0f);
  kernels::paged_attention_ref(q.data(), p.k_pool.data(), p.v_pool.data(), p.table.data(),
                               o.data(), c.n_q, c.pos0, c.n_kv, c.block_size, c.heads, c.kv_heads,
                               c.hd, c.window, scale_of(c));
  return o;
}

// Outputs are convex combinations of N(0,1) values, so |o| is O(1): tol relative-or-absolute.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " at " << i;
}

// One build of the kernel: run(c, q, p, out, lse, n_splits) with the paged_attention_split
// contract (n_splits 0 = automatic split-K, 1 = unsplit, > 1 forced; lse may be null).
struct PagedKernel {
  std::string name;
  std::function<void(const Case&, const float* q, const Paged&, float* out, float* lse,
                     int64_t n_splits)>
      run;

  std::vector<float> operator()(const Case& c, const std::vector<float>& q, const Paged& p,
                                int64_t n_splits = 0, std::vector<float>* lse = nullptr) const {
    std::vector<float> o(q.size(), -1.0f);
    if (lse) lse->assign(size_t(c.n_q * c.heads), -1.0f);
    run(c, q.data(), p, o.data(), lse ? lse->data() : nullptr, n_splits);
    return o;
  }
};

inline std::vector<Case> fixed_cases() {
  return {
      // n_q, pos0, n_kv, heads, kv_heads, hd, bs, window
      {1, 0, 1, 1, 1, 8, 1, 0},          // one token
      {7, 0, 7, 4, 4, 8, 16, 0},         // prefill shorter than a block, MHA
      {33, 0, 33, 8, 2, 64, 16, 0},      // prefill across blocks, GQA 4
      {257, 0, 257, 14, 2, 64, 16, 0},   // Qwen2.5-0.5B shape, tiles of 64 + 1
      {1, 256, 257, 14, 2, 64, 16, 0},   // decode continuing a prefix
      {1, 256, 257, 8, 1, 128, 32, 0},   // decode, one kv head (split-K is the only parallelism)
      {33, 224, 257, 6, 3, 80, 16, 0},   // chunked prefill after a 224-token prefix
      {5, 100, 105, 16, 2, 96, 32, 0},   // GQA 8, head dim 96
      {100, 0, 100, 3, 3, 128, 7, 0},    // block size not a power of two
      {257, 0, 257, 4, 2, 96, 1, 0},     // block size 1: every token in its own block
      {40, 0, 40, 2, 1, 8, 16, 1},       // window 1
      {129, 0, 129, 10, 2, 64, 16, 5},   // small window
      {64, 200, 264, 5, 1, 80, 32, 70},  // window straddling tiles, chunked
      {1, 999, 1000, 7, 1, 64, 16, 300}, // decode with a window
      {3, 12, 10, 4, 2, 8, 4, 0},        // queries past the last key: they see all keys
      {3, 12, 10, 4, 2, 8, 4, 2},        // ... and with a window, none: output 0
      {2, 0, 0, 2, 1, 8, 16, 0},         // no keys at all
      {9, 0, 9, 8, 8, 12, 16, 0},        // head_dim % 8 != 0
      {17, 3, 20, 6, 2, 20, 16, 4},      // head_dim 20: two full vectors + tail
      {31, 0, 31, 40, 5, 8, 16, 0},      // GQA 8 × 31 queries: several row tiles
      {11, 0, 11, 6, 3, 40, 16, 0},      // head_dim 40: one 16-lane vector + a tail of 8 past 32
      {13, 2, 15, 7, 7, 72, 5, 0},       // head_dim 72: a 64-column block + a tail of 8
      {6, 10, 16, 4, 1, 120, 16, 0},     // head_dim 120: a 64-column block + 3 vectors + 8
      {8, 0, 8, 3, 1, 112, 16, 0},       // head_dim 112: a 64-column block + 3 whole vectors
  };
}

// Odd and even lengths, prefill / decode / chunked prefill, GQA ratios 1..8, head dims 8 and
// 64/80/96/128, block sizes 1/16/32, no window or windows of 1..1000.
inline std::vector<Case> random_cases(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  std::vector<Case> out;
  for (int i = 0; i < n; ++i) {
    Case c;
    c.n_kv = pick({1, 2, 7, 33, 64, 65, 100, 257});
    switch (i % 3) {
      case 0: c.n_q = c.n_kv; c.pos0 = 0; break;      // prefill
      case 1: c.n_q = 1; c.pos0 = c.n_kv - 1; break;  // decode
      default:                                        // chunked prefill
        c.n_q = std::uniform_int_distribution<int64_t>(1, c.n_kv)(rng);
        c.pos0 = c.n_kv - c.n_q;
    }
    const int64_t ratio = std::uniform_int_distribution<int64_t>(1, 8)(rng);
    c.kv_heads = ratio > 4 ? pick({1, 2}) : pick({1, 2, 3});
    c.heads = ratio * c.kv_heads;
    c.hd = pick({8, 64, 80, 96, 128});
    c.block_size = pick({1, 16, 32});
    c.window = pick({0, 0, 1, 3, 17, 64, 1000});
    out.push_back(c);
  }
  return out;
}

// Every kernel against the scalar paged reference and against the naive contiguous
// attention_ref over the gathered pages (a second, independent oracle): automatic split-K,
// unsplit, and 3 splits.
inline void check_matches_references(const std::vector<PagedKernel>& kernels,
                                     const std::vector<Case>& cases, uint64_t seed) {
  for (const Case& c : cases) {
    const auto p = make_paged(c, seed += 10);
    const auto q = randn(size_t(c.n_q * c.heads * c.hd), seed + 5);
    const auto ref = run_ref(c, q, p);
    std::vector<float> naive(q.size());
    kernels::attention_ref(q.data(), p.k.data(), p.v.data(), naive.data(), c.n_q, c.pos0, c.n_kv,
                           c.heads, c.kv_heads, c.hd, c.window, scale_of(c));
    for (const PagedKernel& k : kernels) {
      const std::string tag = k.name + " " + c.str();
      const auto got = k(c, q, p);
      expect_close(got, ref, 1e-5f, "auto vs paged ref " + tag);
      expect_close(got, naive, 1e-5f, "auto vs attention_ref " + tag);
      expect_close(k(c, q, p, 1), ref, 1e-5f, "unsplit " + tag);
      expect_close(k(c, q, p, 3), ref, 1e-5f, "3 splits " + tag);
    }
  }
}

// Decode (and a short chunk against a long prefix): every split count gives the unsplit result.
inline void check_split_k_equals_unsplit(const PagedKernel& k) {
  const Case cases[] = {
      {1, 1999, 2000, 14, 2, 64, 16, 0},   // Qwen2.5-0.5B-like decode
      {1, 2999, 3000, 8, 1, 128, 32, 0},   // one kv head
      {1, 4098, 4099, 12, 4, 80, 16, 0},   // odd length, GQA 3
      {1, 1499, 1500, 4, 2, 96, 1, 700},   // window, block size 1
      {1, 99, 100, 2, 1, 8, 16, 0},        // fewer tiles than splits: empty chunks
      {4, 1996, 2000, 14, 2, 64, 16, 0},   // a short chunk against a long prefix
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const auto p = make_paged(c, seed += 10);
    const auto q = randn(size_t(c.n_q * c.heads * c.hd), seed + 5);
    const std::string tag = k.name + " " + c.str();
    const auto unsplit = k(c, q, p, 1);
    expect_close(unsplit, run_ref(c, q, p), 1e-5f, "unsplit vs ref " + tag);
    for (int64_t s : {2, 3, 5, 8, 16, 64})
      expect_close(k(c, q, p, s), unsplit, 2e-6f, "splits=" + std::to_string(s) + " vs unsplit " + tag);
    expect_close(k(c, q, p), unsplit, 2e-6f, "auto vs unsplit " + tag);
  }
}

// The thread count changes the split-K choice, not the result beyond rounding.
inline void check_one_thread_and_all(const PagedKernel& k) {
  const int threads = num_threads();
  const Case cases[] = {{300, 0, 300, 14, 2, 64, 16, 0}, {1, 2999, 3000, 14, 2, 64, 16, 0}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const auto p = make_paged(c, seed += 10);
    const auto q = randn(size_t(c.n_q * c.heads * c.hd), seed + 5);
    const auto all = k(c, q, p);
    set_num_threads(1);
    const auto one = k(c, q, p);
    set_num_threads(threads);
    expect_close(one, all, 2e-6f, k.name + " " + c.str());
  }
}

inline void check_window_one_returns_own_value_row(const PagedKernel& k) {
  const Case c{20, 0, 20, 6, 2, 64, 16, 1};
  const auto p = make_paged(c, 31);
  const auto q = randn(size_t(c.n_q * c.heads * c.hd), 32);
  const auto o = k(c, q, p);
  for (int64_t t = 0; t < c.n_q; ++t)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t d = 0; d < c.hd; ++d)
        ASSERT_NEAR(o[(t * c.heads + h) * c.hd + d], p.v[(t * c.kv_heads + h / 3) * c.hd + d], 1e-6f)
            << k.name << " t=" << t << " h=" << h;
}

// Scores of several hundred: exp must be taken relative to the running max, per tile.
inline void check_large_scores_do_not_overflow(const PagedKernel& k) {
  const Case c{70, 60, 130, 4, 2, 64, 16, 0};
  auto p = make_paged(c, 41);
  auto q = randn(size_t(c.n_q * c.heads * c.hd), 42);
  for (auto& x : q) x *= 30.0f;
  const auto ref = run_ref(c, q, p);
  for (int64_t s : {1, 4}) {
    const auto o = k(c, q, p, s);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_TRUE(std::isfinite(o[i])) << i;
    // f32 scores of size ~|s| carry ~|s|·1e-7 absolute error, which e^s turns into relative
    // error of the weights; with |s| up to ~100, 1e-5 is below what f32 scores can give.
    expect_close(o, ref, 1e-4f, k.name + " splits=" + std::to_string(s));
  }
}

// The optional log-sum-exp output: each row's log(sum_j e^(scale q·k_j)) over its visible keys
// (computed here in double), -inf for a row that sees no key; unsplit and split.
inline void check_log_sum_exp(const PagedKernel& k) {
  const Case cases[] = {
      {33, 224, 257, 6, 3, 80, 16, 0},  // chunked prefill, GQA 2
      {1, 999, 1000, 8, 1, 96, 16, 0},  // decode, GQA 8
      {9, 0, 9, 8, 8, 12, 16, 0},       // head_dim with a tail
      {3, 12, 10, 4, 2, 8, 4, 2},       // rows that see no key
      {40, 0, 40, 16, 2, 128, 32, 7},   // window
  };
  uint64_t seed = 1300;
  for (const Case& c : cases) {
    const auto p = make_paged(c, seed += 10);
    const auto q = randn(size_t(c.n_q * c.heads * c.hd), seed + 5);
    const int64_t group = c.heads / c.kv_heads;
    std::vector<double> want(size_t(c.n_q * c.heads));
    for (int64_t i = 0; i < c.n_q; ++i)
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t pos = c.pos0 + i;
        std::vector<double> s;
        for (int64_t j = 0; j < c.n_kv; ++j) {
          if (j > pos || (c.window > 0 && pos - j >= c.window)) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.hd; ++d)
            dot += double(q[(i * c.heads + h) * c.hd + d]) *
                   p.k[(j * c.kv_heads + h / group) * c.hd + d];
          s.push_back(dot * scale_of(c));
        }
        double lse = -std::numeric_limits<double>::infinity();
        if (!s.empty()) {
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double x : s) sum += std::exp(x - mx);
          lse = mx + std::log(sum);
        }
        want[size_t(i * c.heads + h)] = lse;
      }
    for (int64_t splits : {1, 3}) {
      std::vector<float> lse;
      k(c, q, p, splits, &lse);
      for (size_t r = 0; r < want.size(); ++r) {
        if (std::isinf(want[r])) {
          ASSERT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << k.name << " " << c.str() << " row " << r;
        } else {
          ASSERT_NEAR(lse[r], want[r], 1e-5 * (1 + std::fabs(want[r])))
              << k.name << " splits=" << splits << " " << c.str() << " row " << r;
        }
      }
    }
  }
}

}  // namespace kvboost::kernel_test
