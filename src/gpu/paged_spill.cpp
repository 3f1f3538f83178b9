// The device half of the KV spill chain VRAM -> pinned host -> disk (kvboost/gpu.h
// PagedRunner::block_pieces / spill_copy, DeviceHotTier; CUDA builds only). The store logic --
// host slots, overflow to the disk tier, staging, merging copies of adjacent blocks -- is
// kv::HostColdStore's (src/kv/host_cold_store.cpp, host-tested with memcpy); this file only says
// where a block lives in the device pools and copies with the runtime.
#include "paged_runner_impl.h"

namespace kvboost::gpu {

std::vector<kv::IoPiece> PagedRunner::block_pieces(kv::BlockId b) {
  Impl& m = *impl_;
  const PoolLayout& p = m.pool;
  if (b < 0 || b >= p.n_blocks) fail("device KV spill: block ", b, " outside the pool of ", p.n_blocks);
  const size_t bytes = size_t(p.block_floats()) * sizeof(float);
  std::vector<kv::IoPiece> out;
  out.reserve(size_t(2 * p.n_layers));
  for (int64_t l = 0; l < p.n_layers; ++l) {
    out.push_back({m.k_pool.as<float>() + p.offset(l, b), bytes});
    out.push_back({m.v_pool.as<float>() + p.offset(l, b), bytes});
  }
  return out;
}

kv::SlotCopy PagedRunner::spill_copy() {
  kv::SlotCopy c;
  c.ctx = impl_.get();
  // On the runner's stream (non-blocking: a legacy-stream cudaMemcpy would not wait for its
  // kernels): a spill reads K/V that the pass before it wrote, a page-in lands before the pass
  // after it reads. cudaMemcpyDefault: UVA tells device from (pinned or pageable) host memory.
  c.copy = [](void* ctx, void* dst, const void* src, size_t bytes) {
    auto* m = static_cast<Impl*>(ctx);
    m->use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, m->s), "device KV spill copy");
  };
  c.wait = [](void* ctx) {
    auto* m = static_cast<Impl*>(ctx);
    m->use();
    check(cudaStreamSynchronize(m->s), "device KV spill");
  };
  c.alloc = [](void* ctx, size_t bytes) -> void* {
    static_cast<Impl*>(ctx)->use();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
      fail("device KV spill: cannot pin ", bytes, " bytes of host memory for the host KV tier (", cudaGetErrorString(e),
           "); lower cold_host_bytes (--cold-host-budget)");
    return p;
  };
  // No use of ctx: the store may outlive a failed runner's stream, never its pinned memory.
  c.release = [](void*, void* p) { cudaFreeHost(p); };
  return c;
}

}  // namespace kvboost::gpu
