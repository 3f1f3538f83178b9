// The host-side planning of the engine's device passes (kvboost/gpu.h: slot_runs, plan_pass,
// staging_layout, scratch_for). Plain code in every build, so the exact rows, slots, block tables
// and buffer sizes a device pass uses are tested on machines without a GPU (tests/gpu/
// test_pass_plan.cpp); the CUDA runner (paged_runner.cpp) only executes what this returns.
#include <algorithm>
#include <string>

#include "kvboost/gpu.h"

namespace kvboost::gpu {

namespace {

// The pool row of position p under `table`, checked: the device never sees a bad block id.
// seq < 0: the caller's rows belong to no pass (a copy-in or read-out), so no sequence is named.
int64_t slot_of(std::span<const kv::BlockId> table, int64_t block_size, int64_t n_blocks, int64_t p,
                const char* what, int64_t seq) {
  const std::string of = seq < 0 ? std::string() : " of sequence " + std::to_string(seq);
  const int64_t bi = p / block_size;
  if (p < 0 || bi >= int64_t(table.size()))
    fail(what, ": position ", p, of, " is past its block table (", table.size(), " blocks of ", block_size, ")");
  const kv::BlockId b = table[size_t(bi)];
  if (b == kv::kColdBlock) fail(what, ": position ", p, of, " is in a cold block (the device runner has no cold tier)");
  if (b < 0 || b >= n_blocks)
    fail(what, ": block id ", b, " (position ", p, of, ") is outside the device pool of ", n_blocks, " blocks");
  return int64_t(b) * block_size + p % block_size;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::vector<SlotRun> slot_runs(std::span<const kv::BlockId> table, int64_t block_size, int64_t n_blocks, int64_t pos0,
                               int64_t n) {
  if (block_size <= 0) fail("slot_runs: block size ", block_size);
  std::vector<SlotRun> out;
  for (int64_t t = 0; t < n;) {
    const int64_t p = pos0 + t, m = std::min(n - t, block_size - p % block_size);
    out.push_back({slot_of(table, block_size, n_blocks, p, "device K/V rows", -1), t, m});
    t += m;
  }
  return out;
}

AttnKernel attention_kernel_for(int64_t n_q, int64_t head_dim) {
  // The tiled kernels keep head_dim / 32 accumulators per lane (attention.cu).
  if (head_dim < 32 || head_dim > 256 || head_dim % 32 != 0) return AttnKernel::Simple;
  return n_q <= kSplitKMaxQueries ? AttnKernel::SplitK : AttnKernel::Flash;
}

PassPlan plan_pass(const PagedSeq* seqs, int64_t n_seqs, const PoolLayout& pool, int64_t vocab) {
  PassPlan p;
  const int64_t bs = pool.block_size;
  if (bs <= 0) fail("device pass: block size ", bs);
  p.table_off.resize(size_t(std::max<int64_t>(0, n_seqs)));
  p.logit_count.resize(p.table_off.size());
  for (int64_t s = 0; s < n_seqs; ++s) {
    const PagedSeq& q = seqs[s];
    if (q.n <= 0) fail("device pass: sequence ", s, " of the batch has no tokens");
    const int64_t row0 = p.n_rows;
    int64_t last = -1;
    for (int64_t i = 0; i < q.n; ++i) {
      const int32_t tok = q.tokens[i];
      if (tok < 0 || tok >= vocab) fail("token id ", tok, " is outside the vocabulary [0, ", vocab, ")");
      const int64_t pos = q.positions ? q.positions[i] : q.n_past + i;
      if (i > 0 && pos <= last) fail("device pass: positions of sequence ", s, " are not increasing at index ", i);
      if (pos > INT32_MAX) fail("device pass: position ", pos, " of sequence ", s, " does not fit 32 bits");
      p.tokens.push_back(tok);
      p.positions.push_back(int32_t(pos));
      p.slots.push_back(slot_of(q.block_table, bs, pool.n_blocks, pos, "device pass", s));
      if (!p.runs.empty() && p.runs.back().seq == s && p.runs.back().pos0 + p.runs.back().n == pos)
        ++p.runs.back().n;
      else
        p.runs.push_back(PassRun{s, p.n_rows, 1, pos, 0, AttnKernel::Flash});
      last = pos;
      ++p.n_rows;
    }
    // Keys [0, last] are read: the table entries that cover them (each checked to be a pool block).
    const int64_t n_entries = last / bs + 1;
    p.table_off[size_t(s)] = int64_t(p.tables.size());
    for (int64_t b = 0; b < n_entries; ++b) {
      slot_of(q.block_table, bs, pool.n_blocks, b * bs, "device pass", s);
      p.tables.push_back(q.block_table[size_t(b)]);
    }
    if (q.logits) {
      const int64_t k = std::clamp<int64_t>(q.n_logits, 0, q.n);
      for (int64_t i = q.n - k; i < q.n; ++i) p.logit_rows.push_back(row0 + i);
      p.logit_count[size_t(s)] = k;
    }
  }
  for (PassRun& r : p.runs) {
    r.table_off = p.table_off[size_t(r.seq)];
    r.kernel = attention_kernel_for(r.n, pool.head_dim);
    if (r.kernel == AttnKernel::SplitK) {
      p.max_split_k_queries = std::max(p.max_split_k_queries, r.n);
      p.max_split_k_keys = std::max(p.max_split_k_keys, r.pos0 + r.n);
    }
  }
  return p;
}

StagingLayout staging_layout(int64_t n_rows, int64_t n_table_entries, int64_t n_logit_rows, int64_t head_dim) {
  StagingLayout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align256(off + bytes);
    return at;
  };
  l.tokens = take(size_t(n_rows) * sizeof(int32_t));
  l.slots = take(size_t(n_rows) * sizeof(int64_t));
  l.tables = take(size_t(n_table_entries) * sizeof(int32_t));
  l.logit_rows = take(size_t(n_logit_rows) * sizeof(int64_t));
  l.cos = take(size_t(n_rows * (head_dim / 2)) * sizeof(float));
  l.sin = take(size_t(n_rows * (head_dim / 2)) * sizeof(float));
  l.bytes = off;
  return l;
}

PassScratch scratch_for(const ModelConfig& c, int64_t n_rows, int64_t n_logit_rows) {
  const int64_t nq = c.n_heads * c.head_dim, nkv = c.n_kv_heads * c.head_dim;
  PassScratch s;
  s.x = n_rows * c.hidden_size;
  s.q = n_rows * nq;
  s.kv = n_rows * nkv;
  s.gate = n_rows * c.intermediate_size;
  s.xh = n_rows * std::max({c.hidden_size, c.intermediate_size, nq});
  s.logit_x = n_logit_rows * c.hidden_size;
  s.logits = n_logit_rows * c.vocab_size;
  return s;
}

}  // namespace kvboost::gpu
