// The engine's paged device runner (kvboost/gpu.h PagedRunner; CUDA builds only): the
// Llama-family pass of src/model/forward.cpp over the batch's rows (every sequence's rows back to
// back, as Model::forward_batch runs them), with K/V in device pools laid out as the CPU's so the
// kv manager's block ids index them unchanged. What runs is planned on the host first
// (pass_plan.cpp: rows, slots, tables, kernels per run, buffer sizes); this file uploads it in
// one copy and launches. All work is on one stream: block copies, chunk copy-ins and passes are
// ordered as the engine issues them, and every call that hands data to the host synchronizes.
#include <optional>

#include "paged_runner_impl.h"

namespace kvboost::gpu {

PagedRunner::Impl::Staged PagedRunner::Impl::stage(const PassPlan& plan) {
  const int64_t n = plan.n_rows, m = int64_t(plan.logit_rows.size()), half = hd / 2;
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
  Staged g;
  g.tokens = reinterpret_cast<const int32_t*>(sd + sl.tokens);
  g.slots = reinterpret_cast<const int64_t*>(sd + sl.slots);
  g.tables = reinterpret_cast<const int32_t*>(sd + sl.tables);
  g.logit_rows = reinterpret_cast<const int64_t*>(sd + sl.logit_rows);
  g.cos = reinterpret_cast<const float*>(sd + sl.cos);
  g.sin = reinterpret_cast<const float*>(sd + sl.sin);
  return g;
}

void PagedRunner::Impl::head_logits(int64_t m, const int64_t* logit_rows) {
  if (m <= 0) return;
  cuda::gather_rows(x.as<float>(), logit_rows, lx.as<float>(), m, H, s);
  cuda::rms_norm(lx.as<float>(), w.final_norm.as<float>(), lx.as<float>(), m, H, float(c.rms_norm_eps), s);
  cuda::matmul(blas, lx.as<float>(), w.lm_head, w.lm_head_wt, nullptr, logits.as<float>(), m, c.vocab_size, H, xh.p,
               s);
  check(cudaMemcpyAsync(logits_h.p, logits.p, size_t(m * c.vocab_size) * 4, cudaMemcpyDeviceToHost, s),
        "download logits");
}

void PagedRunner::Impl::forward(const PagedSeq* seqs, int64_t n_seqs) {
  const PassPlan plan = plan_pass(seqs, n_seqs, pool, c.vocab_size);
  const int64_t n = plan.n_rows, m = int64_t(plan.logit_rows.size());
  if (n == 0) return;
  const Staged g = stage(plan);
  cuda::embed(g.tokens, w.embed_w.p, w.embed_wt, x.as<float>(), n, H, s);
  for (int64_t l = 0; l < c.n_layers; ++l) run_layer(plan, l, g.slots, g.tables, g.cos, g.sin);
  head_logits(m, g.logit_rows);
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

PagedRunner::PagedRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PagedRunner::~PagedRunner() = default;

std::unique_ptr<PagedRunner> PagedRunner::create(const Model& model, const PagedRunnerOptions& opt) {
  const std::string dn = device_name(opt.device);
  // Tensor parallelism: the rank's shard, planned as TpShard plans it on the CPU (its errors
  // first: the rank, the architecture, heads that do not split over the world).
  std::optional<TpPlan> tp;
  if (opt.comm.world() > 1) {
    tp = tp_plan(model.config(), opt.comm.rank(), opt.comm.world());
    if (opt.vram_budget) fail(dn, ": tensor parallelism with layer streaming (vram_budget) is not supported");
  }
  const ModelConfig& c = tp ? tp->config : model.config();
  // Gemma 3's sandwich norms, GELU gate, embedding scale and local RoPE base are CPU-only.
  if (c.model_type == "gemma3" || c.sandwich_norms || c.hidden_act != "silu" || c.embed_scale != 1.0f ||
      c.norm_weight_offset != 0.0f)
    fail(dn, ": model_type ", c.model_type, " does not run on the device runner yet (sandwich norms, GELU gate, "
         "embedding scale: the CPU runs it; use --device cpu)");
  if (c.head_dim > 256 || c.head_dim % 2 != 0) fail(dn, ": head_dim ", c.head_dim, " (the device kernels take even head dims up to 256)");
  if (opt.pool.n_layers != c.n_layers || opt.pool.n_kv_heads != c.n_kv_heads || opt.pool.head_dim != c.head_dim ||
      opt.pool.n_blocks <= 0 || opt.pool.block_size <= 0)
    fail(dn, ": the K/V pool layout does not match the model", tp ? " shard" : "", " (", opt.pool.n_layers, " layers x ",
         opt.pool.n_kv_heads, " x ", opt.pool.head_dim, ", ", opt.pool.n_blocks, " blocks of ", opt.pool.block_size,
         "; the model", tp ? " shard" : "", " has ", c.n_layers, " layers x ", c.n_kv_heads, " K/V heads x ", c.head_dim, ")");
  require_device(opt.device);
  if (opt.comm.backend() == dist::Backend::Nccl && dist::nccl_device(opt.comm) != opt.device)
    fail(dn, ": tensor parallel rank ", opt.comm.rank(), "'s NCCL communicator is on device cuda:",
         dist::nccl_device(opt.comm), ", not on this runner's device");
  auto m = std::make_unique<Impl>();
  m->opt = opt;
  m->c = c;
  m->comm = opt.comm;
  m->pool = opt.pool;
  m->inv_freq = model.rope_inv_freq();
  m->H = c.hidden_size, m->I = c.intermediate_size, m->hd = c.head_dim;
  m->nq = c.n_heads * c.head_dim, m->nkv = c.n_kv_heads * c.head_dim;
  m->scale = 1.0f / std::sqrt(float(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_dim)));
  m->load_weights(model, tp ? &*tp : nullptr);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const uint64_t kv_bytes = 2 * m->pool.pool_bytes();
  if (kv_bytes > free_b)
    fail(dn, ": the K/V pools (", m->pool.n_blocks, " blocks of ", m->pool.block_size, " tokens) need ", kv_bytes,
         " bytes, ", free_b, " are free after the weights; lower kv_budget_bytes (--kv-budget)");
  m->k_pool = DevBuf(m->pool.pool_bytes()), m->v_pool = DevBuf(m->pool.pool_bytes());
  if (opt.comm.backend() == dist::Backend::Nccl) {
    // Everything on the comm's stream: the all-reduces are ordered with the kernels around them.
    m->s = static_cast<cudaStream_t>(dist::nccl_stream(opt.comm));
    m->own_stream = false;
  } else {
    check(cudaStreamCreateWithFlags(&m->s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  // Zeroed as the host pools are (an anonymous mapping): a pass never reads cudaMalloc's garbage
  // (a NaN bit pattern in an unwritten key would poison its whole softmax row).
  check(cudaMemsetAsync(m->k_pool.p, 0, m->k_pool.bytes, m->s), "zero the K pool");
  check(cudaMemsetAsync(m->v_pool.p, 0, m->v_pool.bytes, m->s), "zero the V pool");
  // cuBLAS on the stream with a fixed workspace (run-to-run identical results), no TF32.
  check(cublasCreate(&m->blas), "cublasCreate");
  check(cublasSetStream(m->blas, m->s), "cublasSetStream");
  check(cublasSetMathMode(m->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  m->blas_ws = DevBuf(size_t(32) << 20);
  check(cublasSetWorkspace(m->blas, m->blas_ws.p, m->blas_ws.bytes), "cublasSetWorkspace");
  m->reserve_scratch(std::max<int64_t>(1, opt.rows_hint), 1);
  m->rot_cs = DevBuf(size_t(m->hd) * 4);
  return std::unique_ptr<PagedRunner>(new PagedRunner(std::move(m)));
}

void PagedRunner::forward_batch(const PagedSeq* seqs, int64_t n_seqs) {
  impl_->use();
  impl_->forward(seqs, n_seqs);
}

void PagedRunner::copy_block(kv::BlockId src, kv::BlockId dst) {
  Impl& m = *impl_;
  m.use();
  const PoolLayout& p = m.pool;
  if (src < 0 || src >= p.n_blocks || dst < 0 || dst >= p.n_blocks)
    fail("device copy_block: block ", src, " -> ", dst, " outside the pool of ", p.n_blocks);
  const size_t bytes = size_t(p.block_floats()) * 4;
  for (int64_t l = 0; l < p.n_layers; ++l)
    for (DevBuf* b : {&m.k_pool, &m.v_pool})
      check(cudaMemcpyAsync(b->as<float>() + p.offset(l, dst), b->as<float>() + p.offset(l, src), bytes,
                            cudaMemcpyDeviceToDevice, m.s),
            "copy_block");
}

void PagedRunner::write_rows(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n, const float* k,
                             const float* v) {
  Impl& m = *impl_;
  m.use();
  const int64_t row = m.pool.row();
  // Pageable sources: cudaMemcpyAsync returns once it has staged them, so the caller may reuse
  // its buffers at once; the copies stay ordered with the passes on the stream.
  for (const SlotRun& r : slot_runs(table, m.pool.block_size, m.pool.n_blocks, pos0, n)) {
    const int64_t off = m.pool.offset(layer, 0) + r.slot * row;
    const size_t bytes = size_t(r.m * row) * 4;
    if (k) check(cudaMemcpyAsync(m.k_pool.as<float>() + off, k + r.t * row, bytes, cudaMemcpyHostToDevice, m.s), "write K rows");
    if (v) check(cudaMemcpyAsync(m.v_pool.as<float>() + off, v + r.t * row, bytes, cudaMemcpyHostToDevice, m.s), "write V rows");
  }
}

void PagedRunner::read_rows(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n, float* k,
                            float* v) {
  Impl& m = *impl_;
  m.use();
  const int64_t row = m.pool.row();
  for (const SlotRun& r : slot_runs(table, m.pool.block_size, m.pool.n_blocks, pos0, n)) {
    const int64_t off = m.pool.offset(layer, 0) + r.slot * row;
    const size_t bytes = size_t(r.m * row) * 4;
    if (k) check(cudaMemcpyAsync(k + r.t * row, m.k_pool.as<float>() + off, bytes, cudaMemcpyDeviceToHost, m.s), "read K rows");
    if (v) check(cudaMemcpyAsync(v + r.t * row, m.v_pool.as<float>() + off, bytes, cudaMemcpyDeviceToHost, m.s), "read V rows");
  }
  check(cudaStreamSynchronize(m.s), "read_rows");
}

void PagedRunner::rotate_keys(int64_t layer, std::span<const kv::BlockId> table, int64_t pos0, int64_t n,
                              int64_t delta) {
  if (delta == 0 || n <= 0) return;
  Impl& m = *impl_;
  m.use();
  const int64_t half = m.hd / 2, row = m.pool.row();
  // kernels::rope_shift's table: cos / sin of delta * inv_freq in double, rounded to float.
  std::vector<float> cs(size_t(2 * half));
  for (int64_t i = 0; i < half; ++i) {
    const double ang = double(delta) * double(m.inv_freq[size_t(i)]);
    cs[size_t(i)] = float(std::cos(ang));
    cs[size_t(half + i)] = float(std::sin(ang));
  }
  check(cudaMemcpyAsync(m.rot_cs.p, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice, m.s), "upload the shift");
  for (const SlotRun& r : slot_runs(table, m.pool.block_size, m.pool.n_blocks, pos0, n))
    cuda::rope_shift(m.k_pool.as<float>() + m.pool.offset(layer, 0) + r.slot * row, m.rot_cs.as<float>(),
                     m.rot_cs.as<float>() + half, r.m, m.c.n_kv_heads, m.hd, m.s);
}

std::vector<float> PagedRunner::snapshot_rows(std::span<const kv::BlockId> table, std::span<const int64_t> rows) {
  Impl& m = *impl_;
  m.use();
  const PoolLayout& p = m.pool;
  const int64_t row = p.row(), L = p.n_layers, nr = int64_t(rows.size());
  std::vector<float> out(size_t(nr * L * 2 * row));
  if (nr == 0) return out;
  reserve(m.snap_h, out.size() * 4);
  float* hst = m.snap_h.as<float>();
  // One row copy per (row, layer, K/V) into pinned memory, then one synchronization: the probe
  // rows are a handful (the guard's), not worth a gather kernel.
  float* o = hst;
  for (int64_t r : rows) {
    const int64_t slot = slot_runs(table, p.block_size, p.n_blocks, r, 1)[0].slot;
    for (int64_t l = 0; l < L; ++l, o += 2 * row) {
      const int64_t off = p.offset(l, 0) + slot * row;
      check(cudaMemcpyAsync(o, m.k_pool.as<float>() + off, size_t(row) * 4, cudaMemcpyDeviceToHost, m.s), "snapshot K");
      check(cudaMemcpyAsync(o + row, m.v_pool.as<float>() + off, size_t(row) * 4, cudaMemcpyDeviceToHost, m.s), "snapshot V");
    }
  }
  check(cudaStreamSynchronize(m.s), "snapshot_rows");
  std::memcpy(out.data(), hst, out.size() * 4);
  return out;
}

const PoolLayout& PagedRunner::pool() const { return impl_->pool; }
int64_t PagedRunner::passes() const { return impl_->n_passes; }

}  // namespace kvboost::gpu
