// Internal: tensor parallelism under the engine (EngineOptions::tp, docs/gpu.md "Tensor
// parallelism under the engine"). `world` ranks in the engine's process: rank 0 runs on the
// caller's thread, ranks 1 .. world - 1 on threads of their own. Each rank holds its shard of the
// model (tp_plan's rules: its heads, its slice of the MLP) and the K/V of its K/V heads for every
// block id of the engine's kv manager, so the scheduler, the block tables and the prefix cache
// stay one; the collectives join the ranks. On the CPU a rank is a TpShard over a
// kv::PagedKvStorage of the shard's heads (rank 0's is the engine's store), the collectives
// dist::ShmGroup's, each rank's kernels on its own share of the compute threads (a ThreadTeam);
// on CUDA devices a rank is a gpu::PagedRunner on device first + r over NCCL
// (shared memory through pinned host copies where NCCL was not built).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvboost/dist.h"
#include "kvboost/gpu.h"
#include "kvboost/kv.h"
#include "kvboost/model.h"

namespace kvboost {

// The ranks' K/V pools as the kv manager's one hot tier (a cold tier under TP, on the CPU): the
// pieces of a block are every rank's pieces of it in rank order, so a spilled block carries all
// the heads and a page-in restores every rank's part at once.
class TpHotTier final : public kv::HotTier {
 public:
  explicit TpHotTier(std::vector<kv::PagedKvStorage*> stores) : stores_(std::move(stores)) {}
  int64_t n_blocks() const override { return stores_[0]->n_blocks(); }
  int64_t block_size() const override { return stores_[0]->block_size(); }
  size_t block_bytes() const override;
  std::vector<kv::IoPiece> block_pieces(kv::BlockId b) override;

 private:
  std::vector<kv::PagedKvStorage*> stores_;
};

class TpRanks {
 public:
  struct Rank {
    TpPlan plan;
    std::unique_ptr<TpShard> shard;               // the CPU
    kv::PagedKvStorage* store = nullptr;          // the CPU: the rank's K/V pools
    std::unique_ptr<kv::PagedKvStorage> own;      // ranks 1 ..: their pools
    std::unique_ptr<gpu::PagedRunner> dev;        // a CUDA device
    dist::Comm comm = dist::Comm::local();
  };
  // Errors: tp_plan's (heads that do not split, an architecture without TP), a packed model
  // (TpShard::create_group; a layer-streamed one shares its streamer over the ranks), and for a
  // device: vram_budget, a device index past the count, gpu::PagedRunner::create's.
  TpRanks(const Model& model, int world, kv::PagedKvStorage& store0, const kernels::Device& device,
          int64_t rows_hint, uint64_t vram_budget);
  ~TpRanks();
  TpRanks(const TpRanks&) = delete;
  TpRanks& operator=(const TpRanks&) = delete;

  int world() const { return int(ranks_.size()); }
  Rank& rank(int r) { return ranks_[size_t(r)]; }
  bool on_device() const { return on_device_; }
  // Every rank's pools as one hot tier (TpHotTier); Error on devices (not built there).
  kv::HotTier& hot_tier();
  // fn(r) on every rank at once (rank 0 on this thread); returns when all have. A rank's
  // exception aborts the group (the others' collectives throw instead of waiting), and the first
  // rank's message is rethrown after all have stopped; the shared-memory group is then made anew
  // so that the next call starts clean.
  void run(const std::function<void(int)>& fn);

 private:
  void worker(int r);
  void release();  // stops the threads, then the device runners and their communicators
  void new_group();
  std::vector<Rank> ranks_;
  bool on_device_ = false;
  std::unique_ptr<TpHotTier> hot_;
  std::unique_ptr<dist::ShmGroup> group_;
  bool nccl_ = false;
  // The team: a generation counter wakes the worker threads for each run.
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t gen_ = 0;
  int pending_ = 0;
  bool quit_ = false;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
  // The CPU: a thread team per rank, each an equal share of the process's compute threads, so
  // the ranks compute side by side instead of one taking the whole pool and the others running
  // on one thread over the same cores.
  std::vector<std::unique_ptr<ThreadTeam>> teams_;
};

}  // namespace kvboost
