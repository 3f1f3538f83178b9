// Layer streaming in the engine's paged device runner (kvboost/gpu.h PagedRunnerOptions::
// vram_budget; CUDA builds only). At create, plan_layer_stream splits the layers under the
// budget: a prefix stays resident in ResidentWeights, the rest are packed once into pinned host
// memory (device_weights.h HostLayers; AWQ layers as 4-bit Q4_Z / Q4_Z128 blocks, so they cross
// the bus packed) and copied each pass on a copy stream into n_slots device slots. The runner
// replays walk_layer_stream (stream_walk.cpp, tested on the host): run_layer asks ptrs_for(l),
// which issues layer l's `before` copies and makes the compute stream wait on filled[slot];
// layer_done(l) records free[slot] and issues the copy that refills it, so layer i computes
// while layer i + 1 (or the next pass's first layers) copies. The same packed blocks and kernels
// as the resident runner: logits are bit-identical.
//
// A pass that throws midway leaves work in flight; the next pass then starts at layer 0 where
// another layer was due, synchronizes both streams and walks cold (the prologue again).
#include "paged_runner_impl.h"

namespace kvboost::gpu {

struct PagedRunner::Impl::Streamer {
  int device = 0;
  StreamPlan plan;
  std::vector<LayerStreamActions> cold_walk, warm_walk;
  HostLayers host;
  DevBuf slots;  // n_slots blocks of plan.slot_bytes
  cudaStream_t copy = nullptr;
  std::vector<cudaEvent_t> filled, freed;  // per slot
  int64_t pos = 0;        // the layer due next in the pass
  bool entered = false;   // pos's `before` and wait are issued
  bool cold = true;       // no copy of an earlier pass is pending: walk with the prologue
  uint64_t bytes_h2d = 0;

  ~Streamer() {
    cudaSetDevice(device);
    if (copy) cudaStreamSynchronize(copy);
    for (cudaEvent_t e : filled) cudaEventDestroy(e);
    for (cudaEvent_t e : freed) cudaEventDestroy(e);
    if (copy) cudaStreamDestroy(copy);
  }
  const LayerStreamActions& at(int64_t l) const { return (cold ? cold_walk : warm_walk)[size_t(l)]; }
  void issue(const StreamCopy& c, const std::vector<LayerLayout>& layouts) {
    const size_t slot = size_t(c.slot);
    if (c.wait_free) check(cudaStreamWaitEvent(copy, freed[slot], 0), "cudaStreamWaitEvent(slot free)");
    const size_t bytes = layouts[size_t(c.layer)].bytes;
    check(cudaMemcpyAsync(slots.as<uint8_t>() + slot * plan.slot_bytes, host.buf.as<uint8_t>() + host.off[size_t(c.layer)],
                          bytes, cudaMemcpyHostToDevice, copy),
          "cudaMemcpyAsync(streamed layer)");
    check(cudaEventRecord(filled[slot], copy), "cudaEventRecord(slot filled)");
    bytes_h2d += bytes;
  }
};

namespace {
// Device bytes of a pass's scratch at rows_hint rows (Impl::reserve_scratch), the cuBLAS workspace
// and the pass's staging copy: what the budget holds besides weights and pools.
uint64_t scratch_bytes(const ModelConfig& c, int64_t rows, bool q4) {
  const PassScratch sc = scratch_for(c, rows, 1);
  uint64_t b = uint64_t(2 * sc.x + 2 * sc.q + 2 * sc.kv + 2 * sc.gate + sc.logit_x + sc.logits) * 4;
  b += uint64_t(std::max(sc.xh, sc.logit_x)) * 2;
  if (q4 && rows > cuda::kGemvMaxM)
    b += uint64_t(std::max({c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size}) * c.hidden_size) * 2;
  b += uint64_t(32) << 20;  // cuBLAS workspace (create)
  b += staging_layout(rows, rows, 1, c.head_dim).bytes;
  return b;
}
}  // namespace

void PagedRunner::Impl::load_weights(const Model& model, const TpPlan* tp) {
  const std::string dn = device_name(opt.device);
  if (opt.vram_budget == 0) {
    w = upload_resident(model, dn.c_str(), {}, nullptr, tp);
    return;
  }
  if (tp && tp->world > 1) fail(dn, ": tensor parallelism with layer streaming (vram_budget) is not supported");
  auto t = std::make_shared<Streamer>();
  t->device = opt.device;
  const uint64_t kv_bytes = 2 * pool.pool_bytes();
  const int64_t rows = std::max<int64_t>(1, opt.rows_hint);
  auto choose = [&](const std::vector<LayerLayout>& layouts, size_t nonlayer) {
    bool q4 = false;
    StreamPlanInput in;
    for (const LayerLayout& lay : layouts) {
      in.layer_bytes.push_back(lay.bytes);
      for (const Piece& pc : lay.piece) q4 = q4 || (pc.present && (pc.wt == WType::Q4_Z || pc.wt == WType::Q4_Z128));
    }
    const uint64_t scratch = scratch_bytes(c, rows, q4);
    in.fixed_bytes = nonlayer + kv_bytes + scratch;
    in.vram_budget = opt.vram_budget;
    in.n_slots = 2;
    const std::string parts = std::to_string(nonlayer) + " bytes of embeddings, head and final norm, " +
                              std::to_string(kv_bytes) + " of K/V pools (--kv-budget), " + std::to_string(scratch) +
                              " of pass scratch for " + std::to_string(rows) + " rows";
    try {
      t->plan = plan_layer_stream(in);
    } catch (const Error& e) {
      fail(dn, ": ", e.what(), " (", parts, ")");
    }
    const StreamPlan& p = t->plan;
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    if (p.device_bytes > free_b)
      fail(dn, ": --vram-budget ", opt.vram_budget, ": ", layouts.size() - p.streamed.size(), " resident layers (",
           p.resident_layer_bytes, " bytes), ", p.n_slots, " streaming slots of ", p.slot_bytes, " bytes and ", parts,
           " need ", p.device_bytes, " bytes; ", free_b, " of ", total_b, " are free on the device");
    return p.resident;
  };
  w = upload_resident(model, dn.c_str(), choose, &t->host);
  if (!t->plan.streaming) return;  // the budget holds every layer
  t->cold_walk = walk_layer_stream(t->plan, true);
  t->warm_walk = walk_layer_stream(t->plan, false);
  t->slots = DevBuf(size_t(t->plan.n_slots) * t->plan.slot_bytes);
  check(cudaStreamCreateWithFlags(&t->copy, cudaStreamNonBlocking), "cudaStreamCreate(copy)");
  for (int64_t i = 0; i < t->plan.n_slots; ++i) {
    cudaEvent_t a = nullptr, b = nullptr;
    check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "cudaEventCreate");
    t->filled.push_back(a);
    check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "cudaEventCreate");
    t->freed.push_back(b);
  }
  stream = std::move(t);
}

LayerPtrs PagedRunner::Impl::stream_ptrs(int64_t l) {
  Streamer& t = *stream;
  if (l != t.pos) {
    // Only a new pass may start elsewhere than where the last one stopped: one that threw.
    if (l != 0) fail(device_name(opt.device), ": layer streaming: layer ", l, " runs where layer ", t.pos, " is due");
    check(cudaStreamSynchronize(s), "synchronize after a failed pass");
    check(cudaStreamSynchronize(t.copy), "synchronize the copy stream after a failed pass");
    t.pos = 0, t.entered = false, t.cold = true;
  }
  const LayerStreamActions& a = t.at(l);
  if (!t.entered) {  // once per layer and pass (CacheBlend asks twice: measure, then the layer)
    for (const StreamCopy& cp : a.before) t.issue(cp, w.layouts);
    if (a.wait_filled) check(cudaStreamWaitEvent(s, t.filled[size_t(a.slot)], 0), "cudaStreamWaitEvent(slot filled)");
    t.entered = true;
  }
  if (a.slot < 0) return w.ptrs(l);
  return layer_ptrs(t.slots.as<uint8_t>() + size_t(a.slot) * t.plan.slot_bytes, w.layouts[size_t(l)]);
}

void PagedRunner::Impl::stream_done(int64_t l) {
  Streamer& t = *stream;
  if (l != t.pos || !t.entered) fail(device_name(opt.device), ": layer streaming: layer ", l, " done before it began");
  const LayerStreamActions& a = t.at(l);
  if (a.record_free) check(cudaEventRecord(t.freed[size_t(a.slot)], s), "cudaEventRecord(slot free)");
  for (const StreamCopy& cp : a.after) t.issue(cp, w.layouts);
  t.entered = false;
  if (++t.pos == c.n_layers) t.pos = 0, t.cold = false;
}

size_t PagedRunner::device_weight_bytes() const { return impl_->w.bytes() + (impl_->stream ? impl_->stream->slots.bytes : 0); }
int64_t PagedRunner::streamed_layers() const { return impl_->stream ? int64_t(impl_->stream->plan.streamed.size()) : 0; }
uint64_t PagedRunner::bytes_h2d() const { return impl_->stream ? impl_->stream->bytes_h2d : 0; }

}  // namespace kvboost::gpu
