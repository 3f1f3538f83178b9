// kvboost/dist.h — collectives for tensor parallelism (issue 29): all-reduce (sum), all-gather
// and barrier over the ranks of one group. Uses kvboost/common.h only.
//
// A Comm is a plain value (rank, world, backend, a pointer to the backend's state); each call
// switches on the backend (no virtual call at the call site):
//   Local  world 1: every collective is the identity (TP=1 runs the same code).
//   Shm    processes on one machine over a POSIX shared-memory segment (shm_open + mmap): each
//          rank writes its contribution into its own slot, a process-shared barrier orders the
//          phases, and every rank reduces the slots in rank order, so all ranks hold bit-identical
//          sums. A rank that fails marks the group aborted; the others' next wait throws instead
//          of hanging, and a wait past the group's timeout throws naming the ranks that arrived.
//   Nccl   NCCL over CUDA devices (built only with -DKVBOOST_CUDA=ON; otherwise create says
//          "built without CUDA"). Pointers are then device pointers and the collectives are
//          enqueued on the Comm's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvboost::dist {

enum class Backend : uint8_t { Local, Shm, Nccl };
const char* backend_name(Backend b);  // "local", "shm", "nccl"

struct ShmState;   // src/dist/shm.cpp
struct NcclState;  // src/dist/nccl.cpp (CUDA builds) / nccl_stub.cpp

class Comm {
 public:
  static Comm local() { return Comm(); }
  int rank() const { return rank_; }
  int world() const { return world_; }
  Backend backend() const { return backend_; }

  // x [n] := the elementwise sum of every rank's x [n].
  void all_reduce_sum(float* x, int64_t n);
  // out [world, n]: rank r's x [n] at out + r * n, on every rank. x may not alias out.
  void all_gather(const float* x, int64_t n, float* out);
  void barrier();

  // Backend constructors (ShmGroup::comm, nccl_comm).
  Comm(Backend b, int rank, int world, ShmState* shm, NcclState* nccl)
      : backend_(b), rank_(rank), world_(world), shm_(shm), nccl_(nccl) {}

 private:
  friend void nccl_destroy(Comm& c);
  friend void* nccl_stream(const Comm& c);
  friend int nccl_device(const Comm& c);
  Comm() = default;
  Backend backend_ = Backend::Local;
  int rank_ = 0, world_ = 1;
  ShmState* shm_ = nullptr;
  NcclState* nccl_ = nullptr;
};

// One shared-memory group of `world` ranks: create it before fork(); each child then takes
// comm(rank). `slot_floats` bounds one rank's contribution per phase (larger collectives run in
// pieces); `timeout_s` bounds any one wait. The segment is unlinked at once (it lives while a
// process maps it).
class ShmGroup {
 public:
  static std::unique_ptr<ShmGroup> create(int world, size_t slot_floats = size_t(1) << 20, double timeout_s = 120);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;
  Comm comm(int rank);
  int world() const;
  // Marks the group failed with `message` (first one wins): every wait in progress or to come
  // throws Error naming the rank and message.
  void abort(int rank, const std::string& message);
  std::string abort_message() const;  // "" while not aborted

 private:
  ShmGroup() = default;
  ShmState* s_ = nullptr;
  size_t bytes_ = 0;
};

// Runs fn(comm) in `world` forked processes of one ShmGroup and waits for them all. Returns
// normally when every rank returned; throws Error naming the first failing rank and its message
// (an exception's text, or how the process ended). The children run with one compute thread
// (the thread pool is not carried across fork); call it from a process whose kernels have not
// started worker threads yet, or give up that guarantee knowingly (docs/gpu.md).
void run_ranks(int world, const std::function<void(Comm&)>& fn, size_t slot_floats = size_t(1) << 20,
               double timeout_s = 120);

// ---- NCCL (CUDA builds) ----
// An ncclUniqueId's 128 bytes, made by rank 0 and handed to every rank before nccl_comm.
struct NcclId {
  std::vector<uint8_t> bytes;
};
NcclId nccl_unique_id();
// ncclCommInitRank on CUDA device `device` with a stream of its own; the state lives until
// nccl_destroy. Without CUDA: Error "built without CUDA (-DKVBOOST_CUDA=ON)".
Comm nccl_comm(const NcclId& id, int rank, int world, int device);
void nccl_destroy(Comm& c);
bool nccl_built();
// The CUDA stream (cudaStream_t) a NCCL Comm enqueues on; nullptr for the other backends.
void* nccl_stream(const Comm& c);
// The CUDA device a NCCL Comm was made on; -1 for the other backends.
int nccl_device(const Comm& c);

}  // namespace kvboost::dist
