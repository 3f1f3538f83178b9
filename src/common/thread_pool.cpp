// The kernels' persistent thread pool: num_threads() - 1 workers plus the calling thread.
//
// Why not OpenMP: a decode step is ~170 short matmuls (a few µs to a few hundred µs each), so
// the per-call fork/join cost and how the idle team waits decide how close decode gets to the
// memory bandwidth. This pool publishes a task with one store (a generation counter) and joins
// on one counter; workers spin on the generation for a short while after each task, then sleep
// on a futex (Linux). Measurements behind the choice: docs/kernels.md.
//
// Memory order: the caller writes fn/ctx/n, then releases gen; a worker acquires gen and reads
// them. Each worker decrements `pending` (release) after its task; the caller spins until it
// reaches 0 (acquire), so the task's writes are visible on return. Sleep/wake: a worker adds
// itself to `sleepers` (seq_cst) and then futex-waits on gen still holding the old value; the
// caller stores gen (seq_cst) and then reads `sleepers` — one of the two sees the other.
#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "kvboost/common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVBOOST_PAUSE() _mm_pause()
#else
#define KVBOOST_PAUSE() std::this_thread::yield()
#endif

namespace kvboost {

namespace {

void futex_wait(std::atomic<uint32_t>* a, uint32_t old) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

int64_t spin_ns_from_env() {
  const char* e = std::getenv("KVBOOST_SPIN_US");
  if (!e || !*e) return 200'000;
  return std::max(0L, std::atol(e)) * 1000;
}

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

thread_local bool t_in_task = false;

class Pool {
 public:
  ~Pool() { stop(); }

  int size() {
    int s = size_.load(std::memory_order_acquire);
    if (s > 0) return s;
    std::lock_guard<std::mutex> lk(admin_);
    if (size_.load() == 0) start(std::max(1, omp_get_max_threads()));
    return size_.load();
  }

  void resize(int n) {
    n = std::max(1, n);
    std::lock_guard<std::mutex> lk(admin_);
    // Wait for a running task to end before tearing the workers down.
    bool expected = false;
    while (!busy_.compare_exchange_weak(expected, true, std::memory_order_acquire)) {
      expected = false;
      std::this_thread::yield();
    }
    stop();
    start(n);
    busy_.store(false, std::memory_order_release);
  }

  void run(int n, void (*fn)(void*, int, int), void* ctx) {
    n = std::min(n, size());
    bool expected = false;
    if (n <= 1 || t_in_task ||
        !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      fn(ctx, 0, 1);
      return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_active_ = n;
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&gen_);
    t_in_task = true;
    fn(ctx, 0, n);
    t_in_task = false;
    // Join. Workers beyond n only acknowledge. Yield after a long spin so that a descheduled
    // worker (another process on our core) can run.
    int spins = 0;
    while (pending_.load(std::memory_order_acquire) != 0) {
      KVBOOST_PAUSE();
      if (++spins > 20000) std::this_thread::yield();
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
  void start(int n) {
    spin_ns_ = spin_ns_from_env();
    quit_.store(false);
    // A worker starts from the generation current now, not when it first runs: a task
    // published before the thread is scheduled must still be seen.
    const uint32_t g0 = gen_.load();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, g0] { worker(i, g0); });
    size_.store(n, std::memory_order_release);
  }

  void stop() {
    if (workers_.empty()) return;
    quit_.store(true);
    gen_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&gen_);
    for (auto& t : workers_) t.join();
    workers_.clear();
    size_.store(0);
  }

  void worker(int tid, uint32_t seen) {
    for (;;) {
      // Wait for the next generation: spin, then sleep.
      uint32_t g = gen_.load(std::memory_order_acquire);
      if (g == seen) {
        const int64_t t0 = mono_ns();
        int i = 0;
        while ((g = gen_.load(std::memory_order_acquire)) == seen) {
          KVBOOST_PAUSE();
          if ((++i & 255) == 0 && mono_ns() - t0 > spin_ns_) break;
        }
        while (g == seen) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          futex_wait(&gen_, seen);
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
          g = gen_.load(std::memory_order_acquire);
        }
      }
      seen = g;
      if (quit_.load(std::memory_order_acquire)) return;
      if (tid < n_active_) {
        t_in_task = true;
        fn_(ctx_, tid, n_active_);
        t_in_task = false;
      }
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  // Each hot field on its own cache line: the caller writes gen_/fn_, workers write pending_.
  alignas(64) std::atomic<uint32_t> gen_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  alignas(64) void (*fn_)(void*, int, int) = nullptr;
  void* ctx_ = nullptr;
  int n_active_ = 0;
  alignas(64) std::atomic<bool> busy_{false};
  std::atomic<bool> quit_{false};
  std::atomic<int> size_{0};
  int64_t spin_ns_ = 200'000;
  std::mutex admin_;
  std::vector<std::thread> workers_;
};

Pool& process_pool() {
  static Pool p;
  return p;
}

thread_local ThreadTeam* t_team = nullptr;

// This thread's pool: its team's, else the process's.
Pool& pool() { return t_team ? *static_cast<Pool*>(t_team->pool()) : process_pool(); }

}  // namespace

ThreadTeam::ThreadTeam(int n) {
  auto* p = new Pool();
  p->resize(std::max(1, n));
  pool_ = p;
}
ThreadTeam::~ThreadTeam() { delete static_cast<Pool*>(pool_); }
int ThreadTeam::size() const { return static_cast<Pool*>(pool_)->size(); }

ThreadTeam* bind_thread_team(ThreadTeam* team) {
  ThreadTeam* old = t_team;
  t_team = team;
  omp_set_num_threads(team ? team->size() : process_pool().size());  // this thread's OpenMP regions too
  return old;
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  process_pool().resize(n);
}

void parallel_run(int n_threads, void (*fn)(void* ctx, int tid, int n), void* ctx) {
  pool().run(n_threads, fn, ctx);
}

}  // namespace kvboost
