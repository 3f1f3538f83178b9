// Internal (CUDA builds): PagedRunner::Impl, the device runner's state and its layer pass,
// shared by paged_runner.cpp (the dense pass, block and row copies) and paged_blend.cpp
// (CacheBlend's selective recompute on the device). See paged_runner.cpp for the design.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_weights.h"

namespace kvboost::gpu {

using namespace dev;

inline std::string device_name(int d) { return "device cuda:" + std::to_string(d); }

// Grows a buffer to at least `bytes` (contents are not kept: scratch only): by half again, but
// never more than 256 MiB past the request, so that one large pass (all-logits over a big
// vocabulary) does not ask for twice what it needs.
inline size_t grown(size_t have, size_t want) { return std::min(std::max(want, have + have / 2), want + (size_t(256) << 20)); }
inline void reserve(DevBuf& b, size_t bytes) {
  if (b.bytes < bytes) b = DevBuf(grown(b.bytes, bytes));
}
inline void reserve(HostBuf& b, size_t bytes) {
  if (b.bytes < bytes) b = HostBuf(grown(b.bytes, bytes));
}

struct PagedRunner::Impl {
  PagedRunnerOptions opt;
  ModelConfig c;
  PoolLayout pool;
  std::vector<float> inv_freq;
  int64_t H = 0, I = 0, hd = 0, nq = 0, nkv = 0;
  float scale = 1;
  ResidentWeights w;
  DevBuf k_pool, v_pool;
  cudaStream_t s = nullptr;
  bool own_stream = true;  // false: s is the NCCL comm's stream (tensor parallelism over NCCL)
  cublasHandle_t blas = nullptr;
  DevBuf blas_ws;
  // Scratch (PassScratch sizes) and the pass's uploaded plan (StagingLayout).
  DevBuf x, h, q, k, v, att, gate, up, xh, wq, lx, logits, ws, stage_d, rot_cs;
  HostBuf stage_h, logits_h, snap_h;
  HostBuf reduce_h;  // tensor parallelism over shared memory: the partial sums on the host
  DevBuf dev_d, sel_d;    // CacheBlend: deviations, kept row indices (paged_blend.cpp)
  HostBuf dev_h, sel_h;
  int64_t n_passes = 0;
  // Tensor parallelism (opt.comm; Local: the whole model): c, nq, nkv, I and the pools are the
  // rank's shard (tp_plan), and all_reduce completes the O and down projections.
  dist::Comm comm = dist::Comm::local();
  // Layer streaming under opt.vram_budget (paged_stream.cpp); null: every layer resident.
  struct Streamer;
  std::shared_ptr<Streamer> stream;

  // The current device is per-thread CUDA state and the engine may be driven from any thread
  // (the server's): every entry point selects the runner's device first.
  void use() const { check(cudaSetDevice(opt.device), "cudaSetDevice"); }

  ~Impl() {
    if (s) cudaSetDevice(opt.device), cudaStreamSynchronize(s);
    if (blas) cublasDestroy(blas);
    if (s && own_stream) cudaStreamDestroy(s);
  }

  // x [count] (device) := the sum of every rank's x: nothing at world 1; NCCL on the device
  // pointer (enqueued on s, the comm's stream); shared memory through reduce_h (the stream
  // synchronized, the host sum, copied back on s: the next kernel on s sees the sum).
  void all_reduce(float* x, int64_t count) {
    switch (comm.backend()) {
      case dist::Backend::Local: return;
      case dist::Backend::Nccl: comm.all_reduce_sum(x, count); return;
      case dist::Backend::Shm: break;
    }
    const size_t bytes = size_t(count) * 4;
    reserve(reduce_h, bytes);
    check(cudaMemcpyAsync(reduce_h.p, x, bytes, cudaMemcpyDeviceToHost, s), "tensor parallel: copy the partial sums out");
    check(cudaStreamSynchronize(s), "tensor parallel: wait for the partial sums");
    comm.all_reduce_sum(reduce_h.as<float>(), count);
    check(cudaMemcpyAsync(x, reduce_h.p, bytes, cudaMemcpyHostToDevice, s), "tensor parallel: copy the sums in");
  }

  void reserve_scratch(int64_t n_rows, int64_t n_logit_rows) {
    const PassScratch sc = scratch_for(c, n_rows, n_logit_rows);
    reserve(x, size_t(sc.x) * 4), reserve(h, size_t(sc.x) * 4);
    reserve(q, size_t(sc.q) * 4), reserve(att, size_t(sc.q) * 4);
    reserve(k, size_t(sc.kv) * 4), reserve(v, size_t(sc.kv) * 4);
    reserve(gate, size_t(sc.gate) * 4), reserve(up, size_t(sc.gate) * 4);
    reserve(xh, size_t(std::max(sc.xh, sc.logit_x)) * 2);
    reserve(lx, size_t(sc.logit_x) * 4), reserve(logits, size_t(sc.logits) * 4);
    reserve(logits_h, size_t(sc.logits) * 4);
    // AWQ prefill dequantizes one matrix to bf16 for cuBLAS (cuda::matmul_q4).
    if (w.q4 && n_rows > cuda::kGemvMaxM) reserve(wq, size_t(std::max({nq * H, nkv * H, I * H})) * 2);
  }

  // Uploads the weights: all resident, or split by plan_layer_stream under opt.vram_budget
  // (paged_stream.cpp, which also checks that the budget's share fits the device); `tp`: the
  // rank's shard (resident only).
  void load_weights(const Model& model, const TpPlan* tp);
  // Layer l's weight pointers for the pass now running: resident, or its streaming slot once the
  // compute stream waits for the slot's copy. layer_done(l) after l's last kernel frees the slot
  // and issues the copy that refills it. Every layer of a pass goes through both, in order.
  LayerPtrs ptrs_for(int64_t l) { return stream ? stream_ptrs(l) : w.ptrs(l); }
  void layer_done(int64_t l) {
    if (stream) stream_done(l);
  }
  LayerPtrs stream_ptrs(int64_t l);
  void stream_done(int64_t l);

  void mm(const LayerLayout& lay, const LayerPtrs& p, int id, const float* in, const float* bias, float* out,
          int64_t n, int64_t N, int64_t K) {
    const WType wt = lay.piece[id].wt;
    if (wt == WType::Q4_Z || wt == WType::Q4_Z128) cuda::matmul_q4(blas, in, p.m[id], wt, bias, out, n, N, K, wq.p, xh.p, s);
    else cuda::matmul(blas, in, p.m[id], wt, bias, out, n, N, K, xh.p, s);
  }

  void attention(const PassPlan& plan, int64_t l, const int32_t* tables, int64_t window) {
    const float* kp = k_pool.as<float>() + pool.offset(l, 0);
    const float* vp = v_pool.as<float>() + pool.offset(l, 0);
    for (const PassRun& r : plan.runs) {
      const float* qr = q.as<float>() + r.row0 * nq;
      float* o = att.as<float>() + r.row0 * nq;
      const int32_t* t = tables + r.table_off;
      const int64_t end = r.pos0 + r.n;
      switch (r.kernel) {
        case AttnKernel::Flash:
          cuda::flash_attention_paged(qr, kp, vp, WType::F32, t, o, r.n, r.pos0, end, pool.block_size, c.n_heads,
                                      c.n_kv_heads, hd, window, scale, s);
          break;
        case AttnKernel::SplitK:
          cuda::decode_attention_paged(qr, kp, vp, WType::F32, t, o, r.n, r.pos0, end, pool.block_size, c.n_heads,
                                       c.n_kv_heads, hd, window, scale, 0, ws.as<float>(), s);
          break;
        case AttnKernel::Simple:
          cuda::paged_attention_simple(qr, kp, vp, t, o, r.n, r.pos0, end, pool.block_size, c.n_heads, c.n_kv_heads, hd,
                                       window, scale, s);
          break;
      }
    }
  }

  // The layer's K and V of n rows (rms norm into h, projections, k norm, RoPE) into k, v: the
  // first half of run_layer, and CacheBlend's measure (paged_blend.cpp).
  void project_kv(int64_t n, int64_t l, const LayerPtrs& p, const float* cs, const float* sn) {
    const LayerLayout& lay = w.layouts[size_t(l)];
    const float eps = float(c.rms_norm_eps);
    cuda::rms_norm(x.as<float>(), p.v[kAttnNorm - 7], h.as<float>(), n, H, eps, s);
    mm(lay, p, kWk, h.as<float>(), p.v[kKBias - 7], k.as<float>(), n, nkv, H);
    mm(lay, p, kWv, h.as<float>(), p.v[kVBias - 7], v.as<float>(), n, nkv, H);
    if (c.qk_norm) cuda::rms_norm(k.as<float>(), p.v[kKNorm - 7], k.as<float>(), n * c.n_kv_heads, hd, eps, s);
    cuda::rope_rotate_half(k.as<float>(), cs, sn, n, c.n_kv_heads, hd, s);
  }

  // One layer over all rows: the decoder's layer (gpu_decoder.cpp run_layer) with the K/V write
  // into the paged slots and attention per run.
  void run_layer(const PassPlan& plan, int64_t l, const int64_t* slots, const int32_t* tables, const float* cs,
                 const float* sn) {
    const int64_t n = plan.n_rows;
    const LayerLayout& lay = w.layouts[size_t(l)];
    const LayerPtrs p = ptrs_for(l);
    const float eps = float(c.rms_norm_eps);
    project_kv(n, l, p, cs, sn);
    mm(lay, p, kWq, h.as<float>(), p.v[kQBias - 7], q.as<float>(), n, nq, H);
    if (c.qk_norm) cuda::rms_norm(q.as<float>(), p.v[kQNorm - 7], q.as<float>(), n * c.n_heads, hd, eps, s);
    cuda::rope_rotate_half(q.as<float>(), cs, sn, n, c.n_heads, hd, s);
    // Every row's K/V before any attention, so a run attends to rows of earlier runs (blocks.h).
    cuda::kv_write_slots(k.as<float>(), v.as<float>(), slots, k_pool.as<float>() + pool.offset(l, 0),
                         v_pool.as<float>() + pool.offset(l, 0), n, nkv, s);
    attention(plan, l, tables, lay.window);
    mm(lay, p, kWo, att.as<float>(), p.v[kOBias - 7], h.as<float>(), n, H, nq);
    all_reduce(h.as<float>(), n * H);  // tensor parallelism: the rank's heads' share of O
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
    cuda::rms_norm(x.as<float>(), p.v[kMlpNorm - 7], h.as<float>(), n, H, eps, s);
    mm(lay, p, kGate, h.as<float>(), nullptr, gate.as<float>(), n, I, H);
    mm(lay, p, kUp, h.as<float>(), nullptr, up.as<float>(), n, I, H);
    cuda::silu_mul(gate.as<float>(), up.as<float>(), gate.as<float>(), n * I, s);
    mm(lay, p, kDown, gate.as<float>(), nullptr, h.as<float>(), n, H, I);
    all_reduce(h.as<float>(), n * H);  // and its intermediate slice's share of down
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
    layer_done(l);
  }

  // A pass's plan on the device: what stage() uploaded (one pinned copy), as typed pointers.
  struct Staged {
    const int32_t* tokens = nullptr;
    const int64_t* slots = nullptr;
    const int32_t* tables = nullptr;
    const int64_t* logit_rows = nullptr;
    const float* cos = nullptr;
    const float* sin = nullptr;
  };
  // Sizes the scratch and the split-K workspace for `plan`, fills the pinned staging buffer
  // (the stream must have no copy from it pending: every pass synchronizes before returning)
  // and uploads it. Defined in paged_runner.cpp.
  Staged stage(const PassPlan& plan);
  // The final norm and head over the plan's m logit rows of x, downloaded (asynchronously) into
  // logits_h.
  void head_logits(int64_t m, const int64_t* logit_rows);
  void forward(const PagedSeq* seqs, int64_t n_seqs);
  // CacheBlend's selective recompute on the device (paged_blend.cpp).
  BlendStats forward_blend(const int32_t* tokens, int64_t n, int64_t n_past, std::span<const kv::BlockId> table,
                           const BlendOptions& opt, float* logits);
};

}  // namespace kvboost::gpu
