// Internal: the model runner. It executes what the scheduler planned (scheduler.h) and is the
// engine's only code that runs the model's forward passes or touches K/V memory: block copies,
// the reuse plan's chunk copy-ins (kvboost/reuse.h), reading chunks out for the chunk store and
// the guard's probe rows. It turns a plan's rows into the model's SeqBatch/KvView over the
// paged pools and times the passes.
// It reads block tables from the kv manager but never allocates; with a cold tier, the view's
// kv::Pager (kvboost/kv_layout.h) makes each attention range resident before it is read.
//
// Two backends, chosen once at construction: the CPU (the model's forward passes over the host
// pools of kv::PagedKvStorage; the default) and a CUDA device (gpu::PagedRunner, kvboost/gpu.h:
// device weights and device pools indexed by the same block ids). Each method switches on the
// backend once per call, never inside a loop over rows or layers' kernels. What the device
// backend does not run is an Error naming it and the device (docs/gpu.md).
//
// Tensor parallelism (tp > 1; tp_ranks.h): every method runs on the ranks at once, each over
// its shard and the K/V pools of its heads (the CPU's TpShard, or a device runner per rank);
// chunks and probe rows are scattered to and gathered from the ranks' heads, so chunks stored
// under TP are the same bytes as without it (runner_tp.cpp).
#pragma once

#include <memory>
#include <vector>

#include "kvboost/gpu.h"
#include "kvboost/kv.h"
#include "kvboost/model.h"
#include "kvboost/reuse.h"
#include "scheduler.h"
#include "tp_ranks.h"

namespace kvboost {

class ModelRunner {
 public:
  // device: the CPU, or a CUDA device (the weights are uploaded here, the device pools take
  // store's shape; rows_hint sizes the device scratch of a pass; vram_budget: layer streaming,
  // LoadOptions::vram_budget, an Error on the CPU). Errors for a device: see
  // gpu::PagedRunner::create. A cold tier on a device: attach_device_cold_tier.
  // tp > 1: tensor parallelism over tp ranks; store is then rank 0's pools (n_kv_heads / tp
  // heads). Errors: a cold tier with tp > 1 on devices, TpRanks'.
  // cold_tier: the kv manager spills hot_tier()'s blocks (the engine attaches the pair).
  ModelRunner(const Model& model, kv::KvCacheManager& kv, kv::PagedKvStorage& store, bool cold_tier,
              const kernels::Device& device = {}, int64_t rows_hint = 512, uint64_t vram_budget = 0, int tp = 1);
  ~ModelRunner();
  bool on_device() const;
  int tp() const;
  // The memory the kv manager's cold tier moves on the CPU: the engine's store, or under tensor
  // parallelism every rank's pools of a block together (TpHotTier). On a device the engine then
  // swaps in the device chain (attach_device_cold_tier).
  kv::HotTier& hot_tier();
  // On a device, the kv manager's cold tier becomes the chain device pools -> pinned host slots
  // (host_bytes of them; kv::HostColdStore over PagedRunner::spill_copy) -> `disk` (the engine's
  // kv::FileColdStore, which must outlive the runner's passes). Every device pass then first
  // makes the whole block table of each sequence it touches resident (Error naming the blocks
  // and the pool when they cannot all be). Error on the CPU.
  void attach_device_cold_tier(kv::ColdStore* disk, size_t host_bytes);
  int64_t device_passes() const;  // PagedRunner::passes(); 0 on the CPU

  // A sequence's K/V as the model sees them: the pools, its block table, n_past stored tokens.
  // The host pools: Error on a device (nothing on the device reads a host view).
  KvView view(kv::SeqId seq, int64_t n_past) const;
  // Copy-on-write of a shared block, all layers, K and V.
  void copy_block(const kv::CopyOp& c) {
    if (tp_) tp_copy_block(c);
    else if (dev_) dev_->copy_block(c.src, c.dst);
    else store_.copy_block(c.src, c.dst);
  }
  // A reuse plan's copy-in: a stored chunk's rows into the sequence's slots, keys re-rotated
  // from the chunk's position to the new one.
  void copy_in(kv::SeqId seq, const reuse::CopyIn& c, const kv::ChunkShape& shape);
  // The K/V of positions [begin, begin + len) into `out` (kv::chunk_init'ed for len tokens).
  void read_chunk(kv::SeqId seq, int64_t begin, int64_t len, const kv::ChunkShape& shape, kv::Chunk& out);
  // The K/V of `rows`, [row][layer][K nkv, V nkv] (the selective step's probe).
  std::vector<float> snapshot_rows(kv::SeqId seq, std::span<const int64_t> rows) const;
  // The mean over rows and layers of ||now - then||² / ||now||², K plus V, for a snapshot of
  // the same rows (CacheBlend's deviation measure).
  float deviation(kv::SeqId seq, std::span<const int64_t> rows, std::span<const float> snapshot) const;

  // The step's batched pass over plan.batch; returns its wall time in ms. Throws what the model
  // throws (the engine fails every request of the pass).
  double run_batch(std::vector<PlannedRows>& rows);
  // One CacheBlend repair pass; *ms gets its wall time. Error on a device (not built there yet).
  BlendStats run_blend(const PlannedBlend& b, double* ms);

 private:
  const Model& model_;
  kv::KvCacheManager& kv_;
  kv::PagedKvStorage& store_;
  bool cold_;
  kernels::Device device_;
  std::unique_ptr<gpu::PagedRunner> dev_;  // null: the CPU backend
  // The device spill tiers (after dev_: destroyed first). Null without a cold tier.
  std::unique_ptr<gpu::DeviceHotTier> dev_hot_;
  std::unique_ptr<kv::HostColdStore> dev_cold_;
  // With dev_cold_: blocks [first, first + n) of seq (n < 0: its whole table), or the whole
  // tables of all of seqs, resident in the device pool.
  void resident(kv::SeqId seq, int64_t first = 0, int64_t n = -1) const;
  void resident(std::span<const kv::SeqId> seqs) const;
  // The blocks holding rows [begin, begin + n) of seq resident (nothing for n <= 0).
  void resident_rows(kv::SeqId seq, int64_t begin, int64_t n) const;
  std::vector<kv::SeqId> pass_seqs_;  // scratch
  std::vector<gpu::PagedSeq> dev_batch_;   // scratch, reused across steps
  std::vector<SeqBatch> batch_;  // scratch, reused across steps
  std::vector<float> kbuf_, vbuf_;
  // Tensor parallelism (runner_tp.cpp); null: one rank.
  std::unique_ptr<TpRanks> tp_;
  void tp_copy_block(const kv::CopyOp& c);
  void tp_copy_in(kv::SeqId seq, const reuse::CopyIn& c, const kv::ChunkShape& shape);
  void tp_read_chunk(kv::SeqId seq, int64_t begin, int64_t len, const kv::ChunkShape& shape, kv::Chunk& out);
  std::vector<float> tp_snapshot_rows(kv::SeqId seq, std::span<const int64_t> rows) const;
  double tp_run_batch(std::vector<PlannedRows>& rows);
  BlendStats tp_run_blend(const PlannedBlend& b);
};

}  // namespace kvboost
