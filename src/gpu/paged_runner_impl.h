// Internal (CUDA builds): PagedRunner::Impl, the device runner's state and its layer pass,
// shared by paged_runner.cpp (the dense pass, block and row copies) and paged_blend.cpp
// (CacheBlend's selective recompute on the device). See paged_runner.cpp for the design.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
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
  cublasHandle_t blas = nullptr;
  DevBuf blas_ws;
  // Scratch (PassScratch sizes) and the pass's uploaded plan (StagingLayout).
  DevBuf x, h, q, k, v, att, gate, up, xh, wq, lx, logits, ws, stage_d, rot_cs;
  HostBuf stage_h, logits_h, snap_h;
  int64_t n_passes = 0;

  // The current device is per-thread CUDA state and the engine may be driven from any thread
  // (the server's): every entry point selects the runner's device first.
  void use() const { check(cudaSetDevice(opt.device), "cudaSetDevice"); }

  ~Impl() {
    if (s) cudaSetDevice(opt.device), cudaStreamSynchronize(s);
    if (blas) cublasDestroy(blas);
    if (s) cudaStreamDestroy(s);
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

  // One layer over all rows: the decoder's layer (gpu_decoder.cpp run_layer) with the K/V write
  // into the paged slots and attention per run.
  void run_layer(const PassPlan& plan, int64_t l, const int64_t* slots, const int32_t* tables, const float* cs,
                 const float* sn) {
    const int64_t n = plan.n_rows;
    const LayerLayout& lay = w.layouts[size_t(l)];
    const LayerPtrs p = w.ptrs(l);
    const float eps = float(c.rms_norm_eps);
    cuda::rms_norm(x.as<float>(), p.v[kAttnNorm - 7], h.as<float>(), n, H, eps, s);
    mm(lay, p, kWq, h.as<float>(), p.v[kQBias - 7], q.as<float>(), n, nq, H);
    mm(lay, p, kWk, h.as<float>(), p.v[kKBias - 7], k.as<float>(), n, nkv, H);
    mm(lay, p, kWv, h.as<float>(), p.v[kVBias - 7], v.as<float>(), n, nkv, H);
    if (c.qk_norm) {
      cuda::rms_norm(q.as<float>(), p.v[kQNorm - 7], q.as<float>(), n * c.n_heads, hd, eps, s);
      cuda::rms_norm(k.as<float>(), p.v[kKNorm - 7], k.as<float>(), n * c.n_kv_heads, hd, eps, s);
    }
    cuda::rope_rotate_half(q.as<float>(), cs, sn, n, c.n_heads, hd, s);
    cuda::rope_rotate_half(k.as<float>(), cs, sn, n, c.n_kv_heads, hd, s);
    // Every row's K/V before any attention, so a run attends to rows of earlier runs (blocks.h).
    cuda::kv_write_slots(k.as<float>(), v.as<float>(), slots, k_pool.as<float>() + pool.offset(l, 0),
                         v_pool.as<float>() + pool.offset(l, 0), n, nkv, s);
    attention(plan, l, tables, lay.window);
    mm(lay, p, kWo, att.as<float>(), p.v[kOBias - 7], h.as<float>(), n, H, nq);
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
    cuda::rms_norm(x.as<float>(), p.v[kMlpNorm - 7], h.as<float>(), n, H, eps, s);
    mm(lay, p, kGate, h.as<float>(), nullptr, gate.as<float>(), n, I, H);
    mm(lay, p, kUp, h.as<float>(), nullptr, up.as<float>(), n, I, H);
    cuda::silu_mul(gate.as<float>(), up.as<float>(), gate.as<float>(), n * I, s);
    mm(lay, p, kDown, gate.as<float>(), nullptr, h.as<float>(), n, H, I);
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
  }

  void forward(const PagedSeq* seqs, int64_t n_seqs) {
    const PassPlan plan = plan_pass(seqs, n_seqs, pool, c.vocab_size);
    const int64_t n = plan.n_rows, m = int64_t(plan.logit_rows.size()), half = hd / 2;
    if (n == 0) return;
    reserve_scratch(n, m);
    // The split-K workspace: the split count depends on each run's queries and keys (fewer
    // queries, more splits), so the largest need over the runs, not the largest run's.
    int64_t ws_floats = 0;
    for (const PassRun& r : plan.runs)
      if (r.kernel == AttnKernel::SplitK)
        ws_floats = std::max(ws_floats, cuda::decode_workspace_floats(
                                            r.n, c.n_heads, hd, cuda::decode_splits(r.n, c.n_heads, r.pos0 + r.n, 0)));
    reserve(ws, size_t(ws_floats) * 4);
    const StagingLayout sl = staging_layout(n, int64_t(plan.tables.size()), m, hd);
    // The previous pass has synchronized, so the pinned staging buffer is free to refill.
    reserve(stage_h, sl.bytes), reserve(stage_d, sl.bytes);
    uint8_t* st = stage_h.as<uint8_t>();
    std::memcpy(st + sl.tokens, plan.tokens.data(), plan.tokens.size() * 4);
    std::memcpy(st + sl.slots, plan.slots.data(), plan.slots.size() * 8);
    std::memcpy(st + sl.tables, plan.tables.data(), plan.tables.size() * 4);
    std::memcpy(st + sl.logit_rows, plan.logit_rows.data(), plan.logit_rows.size() * 8);
    float* cs_h = reinterpret_cast<float*>(st + sl.cos);
    float* sn_h = reinterpret_cast<float*>(st + sl.sin);
    // The CPU's tables (blocks::rope_table): float angle, cos / sin in double.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const float ang = float(plan.positions[size_t(t)]) * inv_freq[size_t(i)];
        cs_h[t * half + i] = float(std::cos(double(ang)));
        sn_h[t * half + i] = float(std::sin(double(ang)));
      }
    check(cudaMemcpyAsync(stage_d.p, stage_h.p, sl.bytes, cudaMemcpyHostToDevice, s), "upload the pass plan");
    const uint8_t* sd = stage_d.as<uint8_t>();
    const auto* tokens = reinterpret_cast<const int32_t*>(sd + sl.tokens);
    const auto* slots = reinterpret_cast<const int64_t*>(sd + sl.slots);
    const auto* tables = reinterpret_cast<const int32_t*>(sd + sl.tables);
    const auto* lrows = reinterpret_cast<const int64_t*>(sd + sl.logit_rows);
    cuda::embed(tokens, w.embed_w.p, w.embed_wt, x.as<float>(), n, H, s);
    for (int64_t l = 0; l < c.n_layers; ++l)
      run_layer(plan, l, slots, tables, reinterpret_cast<const float*>(sd + sl.cos),
                reinterpret_cast<const float*>(sd + sl.sin));
    if (m > 0) {
      cuda::gather_rows(x.as<float>(), lrows, lx.as<float>(), m, H, s);
      cuda::rms_norm(lx.as<float>(), w.final_norm.as<float>(), lx.as<float>(), m, H, float(c.rms_norm_eps), s);
      cuda::matmul(blas, lx.as<float>(), w.lm_head, w.lm_head_wt, nullptr, logits.as<float>(), m, c.vocab_size, H,
                   xh.p, s);
      check(cudaMemcpyAsync(logits_h.p, logits.p, size_t(m * c.vocab_size) * 4, cudaMemcpyDeviceToHost, s),
            "download logits");
    }
    check(cudaStreamSynchronize(s), "device forward pass");
    ++n_passes;
    const float* lh = logits_h.as<float>();
    for (int64_t i = 0, at = 0; i < n_seqs; ++i) {
      const int64_t k_rows = plan.logit_count[size_t(i)];
      if (k_rows == 0) continue;
      std::memcpy(seqs[i].logits, lh + at * c.vocab_size, size_t(k_rows * c.vocab_size) * 4);
      at += k_rows;
    }
  }
};

}  // namespace kvboost::gpu
