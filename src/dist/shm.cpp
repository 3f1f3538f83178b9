// The shared-memory backend of kvboost/dist.h: ranks are processes on one machine mapping one
// POSIX shared-memory segment. Layout: a header (barrier counters, abort flag and message),
// then `world` slots of slot_floats floats, one per rank.
//
// Barrier: a counter and a generation word in the segment. The last rank to arrive resets the
// counter and bumps the generation (release); the others spin briefly, then FUTEX_WAIT (the
// shared, not the private, futex: the word is in memory several processes map) on the
// generation with a short timeout, re-checking the abort flag and the deadline each time. So a
// rank that dies or throws never leaves the others hanging.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

#include "kvboost/common.h"
#include "kvboost/dist.h"

namespace kvboost::dist {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics must be lock-free");

struct ShmState {
  int world = 0;
  size_t slot_floats = 0;
  double timeout_s = 0;
  size_t header_bytes = 0;
  alignas(64) std::atomic<uint32_t> arrived{0};
  alignas(64) std::atomic<uint32_t> gen{0};
  alignas(64) std::atomic<uint32_t> aborted{0};
  int abort_rank = -1;
  char abort_msg[1024] = {};
  float* slot(int r) {
    return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(this) + header_bytes) + size_t(r) * slot_floats;
  }
};

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void futex_wait_shared(std::atomic<uint32_t>* a, uint32_t old, long ns) {
  timespec ts{0, ns};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAIT, old, &ts, nullptr, 0);
}
void futex_wake_shared(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void set_abort(ShmState* s, int rank, const std::string& msg) {
  uint32_t expect = 0;
  // The first failure wins; its message is written before the flag reads as 2 (complete).
  if (s->aborted.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
    s->abort_rank = rank;
    std::snprintf(s->abort_msg, sizeof s->abort_msg, "%s", msg.c_str());
    s->aborted.store(2, std::memory_order_release);
  }
  futex_wake_shared(&s->gen);
}

[[noreturn]] void throw_aborted(ShmState* s, int rank) {
  for (int i = 0; i < 1000 && s->aborted.load(std::memory_order_acquire) != 2; ++i) usleep(100);
  fail("dist (shm): rank ", rank, ": the group was aborted by rank ", s->abort_rank, ": ", s->abort_msg);
}

void shm_barrier(ShmState* s, int rank) {
  if (s->aborted.load(std::memory_order_acquire)) throw_aborted(s, rank);
  const uint32_t g = s->gen.load(std::memory_order_acquire);
  if (s->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(s->world)) {
    s->arrived.store(0, std::memory_order_relaxed);
    s->gen.fetch_add(1, std::memory_order_release);
    futex_wake_shared(&s->gen);
    return;
  }
  const double deadline = now_s() + s->timeout_s;
  for (int spin = 0;; ++spin) {
    if (s->gen.load(std::memory_order_acquire) != g) return;
    if (s->aborted.load(std::memory_order_acquire)) throw_aborted(s, rank);
    if (spin < 2000) continue;
    futex_wait_shared(&s->gen, g, 10'000'000);  // 10 ms, then re-check abort and deadline
    if (now_s() > deadline) {
      const uint32_t a = s->arrived.load();
      const std::string msg = "barrier timed out after " + std::to_string(s->timeout_s) + " s with " +
                              std::to_string(a) + " of " + std::to_string(s->world) + " ranks arrived";
      set_abort(s, rank, msg);
      fail("dist (shm): rank ", rank, ": ", msg);
    }
  }
}

}  // namespace

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Local: return "local";
    case Backend::Shm: return "shm";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

// ---- ShmGroup ----

std::unique_ptr<ShmGroup> ShmGroup::create(int world, size_t slot_floats, double timeout_s) {
  if (world < 1 || world > 256) fail("dist: world = ", world, " must be in 1..256");
  if (slot_floats == 0) fail("dist: slot_floats must be > 0");
  if (!(timeout_s > 0)) fail("dist: timeout_s = ", timeout_s, " must be > 0");
  const size_t header = (sizeof(ShmState) + 63) / 64 * 64;
  const size_t bytes = header + size_t(world) * slot_floats * sizeof(float);
  // A named segment (shm_open), unlinked at once: the mapping, inherited over fork, keeps it.
  static std::atomic<int> counter{0};
  const std::string name = "/kvboost-dist-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail("dist: shm_open ", name, ": ", std::strerror(errno));
  shm_unlink(name.c_str());
  if (ftruncate(fd, off_t(bytes)) != 0) {
    const int e = errno;
    close(fd);
    fail("dist: ftruncate of ", bytes, " bytes of shared memory: ", std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) fail("dist: mmap of ", bytes, " bytes of shared memory: ", std::strerror(errno));
  auto* s = new (p) ShmState();
  s->world = world;
  s->slot_floats = slot_floats;
  s->timeout_s = timeout_s;
  s->header_bytes = header;
  std::unique_ptr<ShmGroup> g(new ShmGroup());
  g->s_ = s;
  g->bytes_ = bytes;
  return g;
}

ShmGroup::~ShmGroup() {
  if (s_) munmap(s_, bytes_);
}

Comm ShmGroup::comm(int rank) {
  if (rank < 0 || rank >= s_->world) fail("dist: rank ", rank, " outside the group of ", s_->world);
  return Comm(Backend::Shm, rank, s_->world, s_, nullptr);
}
int ShmGroup::world() const { return s_->world; }
void ShmGroup::abort(int rank, const std::string& message) { set_abort(s_, rank, message); }
std::string ShmGroup::abort_message() const {
  if (s_->aborted.load(std::memory_order_acquire) != 2) return "";
  return "rank " + std::to_string(s_->abort_rank) + ": " + s_->abort_msg;
}

// ---- the collectives (the backend switch) ----

void nccl_all_reduce_sum(NcclState* s, float* x, int64_t n);  // nccl.cpp / nccl_stub.cpp
void nccl_all_gather(NcclState* s, const float* x, int64_t n, float* out);
void nccl_barrier(NcclState* s);

void Comm::all_reduce_sum(float* x, int64_t n) {
  if (n < 0) fail("dist: all_reduce_sum of ", n, " elements");
  switch (backend_) {
    case Backend::Local: return;
    case Backend::Nccl: return nccl_all_reduce_sum(nccl_, x, n);
    case Backend::Shm: break;
  }
  ShmState* s = shm_;
  const int64_t cap = int64_t(s->slot_floats);
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t m = std::min(cap, n - off);
    std::memcpy(s->slot(rank_), x + off, size_t(m) * sizeof(float));
    shm_barrier(s, rank_);
    // Every rank sums the slots in rank order: bit-identical results on all ranks.
    float* y = x + off;
    std::memcpy(y, s->slot(0), size_t(m) * sizeof(float));
    for (int r = 1; r < world_; ++r) {
      const float* src = s->slot(r);
      for (int64_t i = 0; i < m; ++i) y[i] += src[i];
    }
    shm_barrier(s, rank_);  // nobody refills a slot before every rank has read it
  }
}

void Comm::all_gather(const float* x, int64_t n, float* out) {
  if (n < 0) fail("dist: all_gather of ", n, " elements");
  switch (backend_) {
    case Backend::Local:
      if (n > 0 && out != x) std::memmove(out, x, size_t(n) * sizeof(float));
      return;
    case Backend::Nccl: return nccl_all_gather(nccl_, x, n, out);
    case Backend::Shm: break;
  }
  ShmState* s = shm_;
  const int64_t cap = int64_t(s->slot_floats);
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t m = std::min(cap, n - off);
    std::memcpy(s->slot(rank_), x + off, size_t(m) * sizeof(float));
    shm_barrier(s, rank_);
    for (int r = 0; r < world_; ++r) std::memcpy(out + int64_t(r) * n + off, s->slot(r), size_t(m) * sizeof(float));
    shm_barrier(s, rank_);
  }
}

void Comm::barrier() {
  switch (backend_) {
    case Backend::Local: return;
    case Backend::Nccl: return nccl_barrier(nccl_);
    case Backend::Shm: return shm_barrier(shm_, rank_);
  }
}

// ---- run_ranks ----

void run_ranks(int world, const std::function<void(Comm&)>& fn, size_t slot_floats, double timeout_s) {
  auto g = ShmGroup::create(world, slot_floats, timeout_s);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      g->abort(-1, std::string("fork: ") + std::strerror(errno));
      break;
    }
    if (pid == 0) {
      int rc = 0;
      try {
        set_num_threads(1);  // the parent's workers do not exist in the child
        Comm c = g->comm(r);
        fn(c);
      } catch (const std::exception& e) {
        g->abort(r, e.what());
        rc = 1;
      } catch (...) {
        g->abort(r, "unknown exception");
        rc = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::string first_bad;
  for (size_t done = 0; done < pids.size(); ++done) {
    int st = 0;
    const pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) break;
    int r = 0;
    while (r < int(pids.size()) && pids[size_t(r)] != pid) ++r;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    const std::string how = WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                            : "exited with status " + std::to_string(WEXITSTATUS(st));
    if (first_bad.empty()) first_bad = "rank " + std::to_string(r) + " " + how;
    g->abort(r, how);  // wakes the ranks still waiting (no-op when the rank aborted itself)
  }
  const std::string msg = g->abort_message();
  if (!msg.empty()) fail("dist: run_ranks(", world, "): ", msg);
  if (!first_bad.empty()) fail("dist: run_ranks(", world, "): ", first_bad);
  if (int(pids.size()) != world) fail("dist: run_ranks(", world, "): started only ", pids.size(), " ranks");
}

}  // namespace kvboost::dist
