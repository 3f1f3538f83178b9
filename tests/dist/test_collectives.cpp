// The shared-memory collectives (kvboost/dist.h) across real forked processes: sums and gathers
// are exact and identical on every rank, large buffers run in pieces, a failing rank aborts the
// group instead of hanging the others, and a missing rank times out with a clear Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "kvboost/common.h"
#include "kvboost/dist.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;

using kvboost::test::error_of;

namespace {
// A MAP_SHARED anonymous area the children write their results into (the parent checks them).
struct SharedOut {
  float* p;
  size_t n;
  explicit SharedOut(size_t n_) : n(n_) {
    p = static_cast<float*>(mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    std::fill(p, p + n, -1.0f);
  }
  ~SharedOut() { munmap(p, n * sizeof(float)); }
};

float value(int r, int64_t i) { return float((r + 1) * 1000 + i % 997) * 0.5f; }
}  // namespace

TEST(Dist, LocalCommIsTheIdentity) {
  dist::Comm c = dist::Comm::local();
  EXPECT_EQ(c.world(), 1);
  EXPECT_EQ(c.backend(), dist::Backend::Local);
  std::vector<float> x{1, 2, 3}, out(3);
  c.all_reduce_sum(x.data(), 3);
  c.all_gather(x.data(), 3, out.data());
  c.barrier();
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(out, x);
}

class DistWorld : public ::testing::TestWithParam<int> {};

// Exact small-integer sums (no rounding) of n elements, n larger than a slot so the pieces
// path runs; every rank's result must equal the closed form and each other's.
TEST_P(DistWorld, AllReduceSumIsExactOnEveryRank) {
  const int W = GetParam();
  const int64_t n = 2500;  // slot of 1024 floats: three pieces
  SharedOut out(static_cast<size_t>(W * n));
  dist::run_ranks(W, [&](dist::Comm& c) {
    if (c.world() != W) fail("world ", c.world());
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = value(c.rank(), i);
    c.all_reduce_sum(x.data(), n);
    c.all_reduce_sum(x.data(), 0);  // an empty reduce is a no-op
    std::memcpy(out.p + c.rank() * n, x.data(), size_t(n) * sizeof(float));
  }, 1024, 30);
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int s = 0; s < W; ++s) want += value(s, i);
      ASSERT_EQ(out.p[r * n + i], want) << "rank " << r << " i " << i;
    }
}

TEST_P(DistWorld, AllGatherPutsEachRankInItsPlace) {
  const int W = GetParam();
  const int64_t n = 700;
  SharedOut out(static_cast<size_t>(W * W * n));
  dist::run_ranks(W, [&](dist::Comm& c) {
    std::vector<float> x(static_cast<size_t>(n)), g(static_cast<size_t>(W * n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = value(c.rank(), i);
    c.all_gather(x.data(), n, g.data());
    c.barrier();
    std::memcpy(out.p + int64_t(c.rank()) * W * n, g.data(), g.size() * sizeof(float));
  }, 256, 30);
  for (int r = 0; r < W; ++r)
    for (int s = 0; s < W; ++s)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.p[(int64_t(r) * W + s) * n + i], value(s, i));
}

// Many back-to-back barriers (generation wrap-around of the counter, no lost wake-up).
TEST_P(DistWorld, ManyBarriersInARow) {
  const int W = GetParam();
  SharedOut out(static_cast<size_t>(W));
  dist::run_ranks(W, [&](dist::Comm& c) {
    float acc = 0;
    for (int i = 0; i < 300; ++i) {
      float v = 1;
      c.all_reduce_sum(&v, 1);
      acc += v;
      if (i % 7 == c.rank()) usleep(200);  // ranks arrive in varying order
      c.barrier();
    }
    out.p[c.rank()] = acc;
  }, 16, 30);
  for (int r = 0; r < W; ++r) EXPECT_EQ(out.p[r], 300.0f * float(W));
}

INSTANTIATE_TEST_SUITE_P(Worlds, DistWorld, ::testing::Values(1, 2, 4));

TEST(Dist, AFailingRankAbortsTheGroupWithItsMessage) {
  const std::string e = error_of([] {
    dist::run_ranks(3, [](dist::Comm& c) {
      if (c.rank() == 1) fail("rank one gave up on purpose");
      float v = 1;
      c.all_reduce_sum(&v, 1);  // ranks 0 and 2 wait here: they must be woken, not hang
    }, 16, 60);
  });
  EXPECT_NE(e.find("rank 1: rank one gave up on purpose"), std::string::npos) << e;
}

TEST(Dist, ACrashedRankAbortsTheGroup) {
  const std::string e = error_of([] {
    dist::run_ranks(2, [](dist::Comm& c) {
      if (c.rank() == 0) _exit(3);  // dies without a word
      c.barrier();
    }, 16, 60);
  });
  EXPECT_NE(e.find("rank 0: exited with status 3"), std::string::npos) << e;
}

TEST(Dist, AMissingRankTimesOut) {
  // Rank 1 never reaches the barrier before the timeout; rank 0's wait ends with a clear Error.
  const std::string e = error_of([] {
    dist::run_ranks(2, [](dist::Comm& c) {
      if (c.rank() == 1) {
        usleep(1'500'000);
        return;
      }
      c.barrier();
    }, 16, 0.3);
  });
  EXPECT_NE(e.find("barrier timed out after 0.3"), std::string::npos) << e;
  EXPECT_NE(e.find("1 of 2 ranks arrived"), std::string::npos) << e;
}

TEST(Dist, BadGroupsAreErrors) {
  EXPECT_NE(error_of([] { dist::ShmGroup::create(0); }).find("world = 0"), std::string::npos);
  EXPECT_NE(error_of([] { dist::ShmGroup::create(2, 0); }).find("slot_floats"), std::string::npos);
  auto g = dist::ShmGroup::create(2, 16);
  EXPECT_NE(error_of([&] { g->comm(2); }).find("rank 2 outside the group of 2"), std::string::npos);
}

TEST(Dist, NcclWithoutCudaSaysSo) {
  if (dist::nccl_built()) GTEST_SKIP() << "built with CUDA (NCCL runs in the device tests)";
  EXPECT_NE(error_of([] { dist::nccl_unique_id(); }).find("built without CUDA (-DKVBOOST_CUDA=ON)"), std::string::npos);
  EXPECT_NE(error_of([] { dist::nccl_comm(dist::NcclId{}, 0, 1, 0); }).find("built without CUDA"), std::string::npos);
}
