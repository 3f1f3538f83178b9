// CacheBlend's selective recompute on the device (kvboost/gpu.h PagedRunner::forward_blend;
// CUDA builds only): Model::forward_blend (src/model/blend.cpp) over the device pools. Every
// token through the layers below the check layer; at the check layer (and each taper layer) the
// current rows' fresh K/V are measured against the cached K/V their slots hold
// (cuda::kv_deviation), the deviations come back to the host, where the same BlendSchedule as the
// CPU's selects the rows kept; the fresh K/V of every current row are stored, the kept rows'
// residuals gathered, and the pass goes on over a re-planned set of rows (plan_pass with their
// scattered positions: one attention run per contiguous span). Under tensor parallelism the
// rows' deviation sums over each rank's K/V heads are all-reduced before the selection.
#include <numeric>

#include "paged_runner_impl.h"

namespace kvboost::gpu {

BlendStats PagedRunner::Impl::forward_blend(const int32_t* tokens, int64_t n, int64_t n_past,
                                            std::span<const kv::BlockId> table, const BlendOptions& opt,
                                            float* logits_out) {
  if (n <= 0) fail("forward_blend: no tokens");
  if (n_past < 0 || n_past + n > INT32_MAX) fail("forward_blend: positions ", n_past, " .. ", n_past + n);
  const BlendSchedule sched(opt, n, c.n_layers);
  const int64_t check_l = sched.check_layer();
  // The plan of the rows whose token indices are `tk` (increasing); the last row gives logits.
  float logit_marker = 0;
  auto plan_for = [&](const std::vector<int64_t>& tk) {
    std::vector<int32_t> ids(tk.size()), pos(tk.size());
    for (size_t i = 0; i < tk.size(); ++i) ids[i] = tokens[tk[i]], pos[i] = int32_t(n_past + tk[i]);
    PagedSeq q;
    q.tokens = ids.data(), q.positions = pos.data(), q.n = int64_t(tk.size());
    q.block_table = table, q.logits = &logit_marker, q.n_logits = 1;
    return plan_pass(&q, 1, pool, c.vocab_size);
  };
  std::vector<int64_t> tok(static_cast<size_t>(n));
  std::iota(tok.begin(), tok.end(), int64_t(0));
  PassPlan plan = plan_for(tok);
  Staged g = stage(plan);
  cuda::embed(g.tokens, w.embed_w.p, w.embed_wt, x.as<float>(), n, H, s);
  for (int64_t l = 0; l < check_l; ++l) run_layer(plan, l, g.slots, g.tables, g.cos, g.sin);
  BlendStats st;
  st.n_full_layers = check_l;
  int64_t n_kept = sched.n_candidates();
  std::vector<float> dev;
  for (int64_t l = check_l; l < c.n_layers; ++l) {
    if (sched.selects_at(l, n_kept)) {
      const int64_t nr = plan.n_rows;
      float* kp = k_pool.as<float>() + pool.offset(l, 0);
      float* vp = v_pool.as<float>() + pool.offset(l, 0);
      // Fresh K/V of every current row, measured against what the slots hold (the cache).
      project_kv(nr, l, ptrs_for(l), g.cos, g.sin);
      if (comm.world() == 1) {
        reserve(dev_d, size_t(nr) * 4), reserve(dev_h, size_t(nr) * 4);
        cuda::kv_deviation(k.as<float>(), v.as<float>(), g.slots, kp, vp, dev_d.as<float>(), nr, nkv, s);
        check(cudaMemcpyAsync(dev_h.p, dev_d.p, size_t(nr) * 4, cudaMemcpyDeviceToHost, s), "download deviations");
        check(cudaStreamSynchronize(s), "CacheBlend measure");
        dev.assign(dev_h.as<float>(), dev_h.as<float>() + nr);
      } else {
        // Tensor parallelism: this rank's sums over its K/V heads, summed over the ranks (every
        // rank the same bits), then combined: all ranks keep the same rows, those TP = 1 keeps
        // up to float reassociation (TpShard::forward_blend does the same on the CPU).
        reserve(dev_d, size_t(nr) * 16), reserve(dev_h, size_t(nr) * 16);
        cuda::kv_deviation_sums(k.as<float>(), v.as<float>(), g.slots, kp, vp, dev_d.as<float>(), nr, nkv, s);
        all_reduce(dev_d.as<float>(), nr * 4);
        check(cudaMemcpyAsync(dev_h.p, dev_d.p, size_t(nr) * 16, cudaMemcpyDeviceToHost, s), "download deviation sums");
        check(cudaStreamSynchronize(s), "CacheBlend measure");
        const float* sums = dev_h.as<float>();
        dev.assign(size_t(nr), 0.0f);
        for (int64_t r = 0; r < nr; ++r) {
          const double d[4] = {sums[r * 4], sums[r * 4 + 1], sums[r * 4 + 2], sums[r * 4 + 3]};
          dev[size_t(r)] = BlendSchedule::deviation_of_sums(d);
        }
      }
      // Stored for every current row: a row dropped here keeps its fresh K/V of this layer, as
      // on the CPU. (Queued before the next upload into the staging buffer its slots are in.)
      cuda::kv_write_slots(k.as<float>(), v.as<float>(), g.slots, kp, vp, nr, nkv, s);
      int64_t n_sel = 0;
      const std::vector<uint8_t> keep = sched.select(l, tok, dev, &n_sel);
      std::vector<int64_t> next_tok, rows;
      for (size_t r = 0; r < tok.size(); ++r)
        if (keep[r]) next_tok.push_back(tok[r]), rows.push_back(int64_t(r));
      // The kept rows' residuals, in order, into h; then h is the residual stream.
      const int64_t m = int64_t(rows.size());
      reserve(sel_h, size_t(m) * 8), reserve(sel_d, size_t(m) * 8);
      std::memcpy(sel_h.p, rows.data(), size_t(m) * 8);
      check(cudaMemcpyAsync(sel_d.p, sel_h.p, size_t(m) * 8, cudaMemcpyHostToDevice, s), "upload the kept rows");
      cuda::gather_rows(x.as<float>(), sel_d.as<int64_t>(), h.as<float>(), m, H, s);
      std::swap(x, h);
      tok = std::move(next_tok);
      plan = plan_for(tok);
      g = stage(plan);
      n_kept = n_sel;
    }
    run_layer(plan, l, g.slots, g.tables, g.cos, g.sin);
    st.n_row_layers += plan.n_rows;
  }
  st.n_selected = n_kept;
  st.n_rows_late = plan.n_rows;
  head_logits(1, g.logit_rows);
  check(cudaStreamSynchronize(s), "device CacheBlend pass");
  ++n_passes;
  std::memcpy(logits_out, logits_h.p, size_t(c.vocab_size) * 4);
  return st;
}

BlendStats PagedRunner::forward_blend(const int32_t* tokens, int64_t n, int64_t n_past,
                                      std::span<const kv::BlockId> table, const BlendOptions& opt, float* logits) {
  impl_->use();
  return impl_->forward_blend(tokens, n, n_past, table, opt, logits);
}

}  // namespace kvboost::gpu
