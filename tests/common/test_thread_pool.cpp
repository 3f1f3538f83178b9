// The kernels' thread pool: every tid runs exactly once per call, writes are visible on return,
// nested and concurrent calls degrade to inline serial runs, resizing works, workers that went
// to sleep wake up.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kvboost/common.h"
#include "test_util.h"

using namespace kvboost;

namespace {
struct ThreadsGuard {
  int saved = num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};
}  // namespace

TEST(ThreadPool, EveryTidOnceAndWritesVisible) {
  ThreadsGuard g;
  for (int nt : {1, 2, 3, 5}) {
    set_num_threads(nt);
    ASSERT_EQ(num_threads(), nt);
    for (int rep = 0; rep < 2000; ++rep) {
      std::vector<int> hits(8, 0);  // plain ints: the join must publish them
      int seen_n = -1;
      parallel_run(nt, [&](int tid, int n) {
        hits[size_t(tid)] += 1;
        if (tid == 0) seen_n = n;
      });
      ASSERT_EQ(seen_n, nt);
      for (int t = 0; t < 8; ++t) ASSERT_EQ(hits[size_t(t)], t < nt ? 1 : 0) << "nt=" << nt;
    }
  }
}

TEST(ThreadPool, FewerThreadsThanPoolAndClamp) {
  ThreadsGuard g;
  set_num_threads(3);
  std::atomic<int> count{0};
  parallel_run(2, [&](int, int n) {
    EXPECT_EQ(n, 2);
    count++;
  });
  EXPECT_EQ(count.load(), 2);
  count = 0;
  parallel_run(64, [&](int, int n) {
    EXPECT_EQ(n, 3);
    count++;
  });
  EXPECT_EQ(count.load(), 3);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadsGuard g;
  set_num_threads(2);
  std::atomic<int> inner{0};
  parallel_run(2, [&](int, int) {
    parallel_run(2, [&](int tid, int n) {
      EXPECT_EQ(tid, 0);
      EXPECT_EQ(n, 1);
      inner++;
    });
  });
  EXPECT_EQ(inner.load(), 2);
}

TEST(ThreadPool, ConcurrentCallersAllComplete) {
  ThreadsGuard g;
  set_num_threads(2);
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 500; ++rep)
        parallel_for(1000, 16, 1, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3L * 500 * 1000);
}

TEST(ThreadPool, WakesAfterSleeping) {
  ThreadsGuard g;
  set_num_threads(2);
  // Longer than the spin window (200 µs by default): the worker sleeps on the futex.
  for (int rep = 0; rep < 5; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> count{0};
    parallel_run(2, [&](int, int) { count++; });
    ASSERT_EQ(count.load(), 2);
  }
}

TEST(ThreadPool, ParallelForCoversRangeWithAlignedSplits) {
  ThreadsGuard g;
  for (int nt : {1, 2, 3}) {
    set_num_threads(nt);
    for (int64_t n : {0, 1, 15, 16, 17, 100, 1000, 1001}) {
      std::vector<int> cover(size_t(n), 0);
      std::atomic<int> bad{0};
      parallel_for(n, 16, 1, [&](int64_t b, int64_t e) {
        if (b % 16 != 0 || b >= e) bad++;
        for (int64_t i = b; i < e; ++i) cover[size_t(i)]++;
      });
      EXPECT_EQ(bad.load(), 0);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(cover[size_t(i)], 1) << "n=" << n << " i=" << i;
    }
    std::vector<std::atomic<int>> seen(777);
    parallel_for_dynamic(777, true, [&](int64_t i, int tid) {
      EXPECT_LT(tid, nt);
      seen[size_t(i)]++;
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

// Thread teams (tensor parallelism's ranks): a thread bound to a team sees its size and runs
// every tid of a call on the team's workers, two threads on two teams run their calls side by
// side (each call whole: not inlined because the other holds a pool), and unbinding gives the
// process's pool back.
TEST(ThreadPool, TeamsAreEachThreadsOwnPool) {
  ThreadsGuard g;
  set_num_threads(2);
  ThreadTeam a(3), b(2);
  EXPECT_EQ(a.size(), 3);
  EXPECT_EQ(b.size(), 2);
  std::atomic<int> full_calls{0};
  auto body = [&](ThreadTeam* t, int want) {
    ThreadTeam* before = bind_thread_team(t);
    EXPECT_EQ(before, nullptr);
    EXPECT_EQ(num_threads(), want);
    for (int rep = 0; rep < 500; ++rep) {
      std::vector<int> hits(size_t(want), 0);
      int seen_n = -1;
      parallel_run(want, [&](int tid, int n) {
        hits[size_t(tid)] += 1;
        if (tid == 0) seen_n = n;
      });
      if (seen_n == want) {
        ++full_calls;
        for (int h : hits) EXPECT_EQ(h, 1);
      }
    }
    EXPECT_EQ(bind_thread_team(before), t);
    EXPECT_EQ(num_threads(), 2);  // the process's pool again
  };
  std::thread ta(body, &a, 3), tb(body, &b, 2);
  ta.join();
  tb.join();
  EXPECT_EQ(full_calls.load(), 1000) << "a team's call ran inline: the teams are not separate pools";
  EXPECT_EQ(num_threads(), 2);
}
