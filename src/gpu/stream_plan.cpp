// Layer-streaming plan and its predicted timeline (kvboost/gpu.h): CPU-side logic of the GPU
// path, built and tested in every configuration (tests/gpu/test_stream_plan.cpp).
#include <algorithm>
#include <numeric>

#include "kvboost/common.h"
#include "kvboost/gpu.h"

namespace kvboost::gpu {

const char* stream_op_name(StreamOp op) {
  switch (op) {
    case StreamOp::WaitFree: return "wait_free";
    case StreamOp::Copy: return "copy";
    case StreamOp::RecordFilled: return "record_filled";
    case StreamOp::WaitFilled: return "wait_filled";
    case StreamOp::Compute: return "compute";
    case StreamOp::RecordFree: return "record_free";
  }
  return "?";
}

namespace {
void push_copy(std::vector<StreamStep>& v, int64_t layer, int64_t slot, bool wait) {
  if (wait) v.push_back({StreamOp::WaitFree, layer, slot});
  v.push_back({StreamOp::Copy, layer, slot});
  v.push_back({StreamOp::RecordFilled, layer, slot});
}
}  // namespace

StreamPlan plan_layer_stream(const StreamPlanInput& in) {
  const int64_t n = int64_t(in.layer_bytes.size());
  if (n == 0) fail("layer stream plan: no layers");
  if (in.n_slots < 2) fail("layer stream plan: n_slots = ", in.n_slots, " (at least 2: one copies while one computes)");
  if (in.fixed_bytes > in.vram_budget)
    fail("--vram-budget ", in.vram_budget, " bytes cannot hold the ", in.fixed_bytes,
         " bytes that stay on the device (embeddings, head, norms, activations, K/V)");
  const uint64_t avail = in.vram_budget - in.fixed_bytes;
  const uint64_t total = std::accumulate(in.layer_bytes.begin(), in.layer_bytes.end(), uint64_t(0));
  StreamPlan p;
  p.resident.assign(size_t(n), true);
  if (total <= avail) {  // everything fits: no slots, no copies
    p.resident_layer_bytes = total;
    p.device_bytes = in.fixed_bytes + total;
    for (int64_t l = 0; l < n; ++l) p.steps.push_back({StreamOp::Compute, l, -1});
    return p;
  }
  const uint64_t largest = *std::max_element(in.layer_bytes.begin(), in.layer_bytes.end());
  if (avail < largest)
    fail("--vram-budget ", in.vram_budget, " bytes leave ", avail, " bytes for layers after the ", in.fixed_bytes,
         " that stay on the device: less than one layer (", largest, " bytes)");
  // The most resident layers (a prefix: while they compute, the copy stream fills the slots
  // for the first streamed ones) such that prefix + slots of the largest streamed layer fit.
  int64_t best_k = -1, best_s = 0;
  uint64_t best_slot = 0, prefix = 0;
  std::vector<uint64_t> suffix_max(size_t(n) + 1, 0);
  for (int64_t l = n - 1; l >= 0; --l) suffix_max[size_t(l)] = std::max(suffix_max[size_t(l) + 1], in.layer_bytes[size_t(l)]);
  for (int64_t k = 0; k < n; ++k) {  // k resident, n - k >= 1 streamed
    const int64_t s = std::min<int64_t>(in.n_slots, n - k);
    const uint64_t slot = suffix_max[size_t(k)];
    if (prefix + uint64_t(s) * slot <= avail && (s >= 2 || n - k == 1)) best_k = k, best_s = s, best_slot = slot;
    prefix += in.layer_bytes[size_t(k)];
  }
  if (best_k < 0)
    fail("--vram-budget ", in.vram_budget, " bytes leave ", avail, " bytes for layers: fewer than ", in.n_slots,
         " slots of the largest layer (", largest, " bytes each); give at least ",
         in.fixed_bytes + uint64_t(in.n_slots) * largest, " bytes");
  p.streaming = true;
  p.n_slots = best_s;
  p.slot_bytes = best_slot;
  for (int64_t l = 0; l < n; ++l) {
    p.resident[size_t(l)] = l < best_k;
    if (l < best_k) p.resident_layer_bytes += in.layer_bytes[size_t(l)];
    else p.streamed.push_back(l), p.bytes_per_pass += in.layer_bytes[size_t(l)];
  }
  p.device_bytes = in.fixed_bytes + p.resident_layer_bytes + uint64_t(best_s) * best_slot;
  const int64_t m = int64_t(p.streamed.size()), S = p.n_slots;
  for (int64_t j = 0; j < S; ++j) push_copy(p.prologue, p.streamed[size_t(j)], j % S, false);
  for (int64_t l = 0, i = 0; l < n; ++l) {
    if (p.resident[size_t(l)]) {
      p.steps.push_back({StreamOp::Compute, l, -1});
      continue;
    }
    const int64_t slot = i % S;
    p.steps.push_back({StreamOp::WaitFilled, l, slot});
    p.steps.push_back({StreamOp::Compute, l, slot});
    p.steps.push_back({StreamOp::RecordFree, l, slot});
    // Item i is the last user of its slot in this pass when i + S >= m: the slot then takes the
    // next pass's item i % S (items m - S .. m - 1 cover every slot once, so each of the next
    // pass's first S items is copied exactly once, into the slot it is read from).
    const int64_t next = i + S < m ? i + S : i % S;
    push_copy(p.steps, p.streamed[size_t(next)], slot, true);
    ++i;
  }
  return p;
}

StreamTimeline simulate_layer_stream(const StreamPlan& plan, const std::vector<uint64_t>& layer_bytes,
                                     double h2d_bytes_per_s, const std::vector<double>& compute_s, int passes) {
  if (!(h2d_bytes_per_s > 0)) fail("simulate_layer_stream: bandwidth must be > 0");
  if (compute_s.size() != layer_bytes.size() || plan.resident.size() != layer_bytes.size())
    fail("simulate_layer_stream: ", layer_bytes.size(), " layers, ", compute_s.size(), " compute times, a plan of ",
         plan.resident.size());
  if (passes < 1) fail("simulate_layer_stream: passes = ", passes);
  const size_t S = size_t(std::max<int64_t>(plan.n_slots, 1));
  std::vector<double> free_t(S, 0), filled_t(S, 0);
  double t_copy = 0, t_comp = 0, pass_start = 0;
  StreamTimeline tl;
  std::vector<int64_t> item_of(layer_bytes.size(), -1);
  for (size_t i = 0; i < plan.streamed.size(); ++i) item_of[size_t(plan.streamed[i])] = int64_t(i);
  const size_t m = plan.streamed.size();
  std::vector<double> cs(m), ce(m);
  auto run = [&](const std::vector<StreamStep>& steps, bool record) {
    for (const StreamStep& st : steps) {
      const size_t slot = st.slot < 0 ? 0 : size_t(st.slot);
      switch (st.op) {
        case StreamOp::WaitFree: t_copy = std::max(t_copy, free_t[slot]); break;
        case StreamOp::Copy: {
          const double start = t_copy;
          t_copy += double(layer_bytes[size_t(st.layer)]) / h2d_bytes_per_s;
          // The copy belongs to the pass whose compute reads it: record it when that compute
          // comes (copies issued for the next pass are recorded there).
          const size_t i = size_t(item_of[size_t(st.layer)]);
          cs[i] = start, ce[i] = t_copy;
          break;
        }
        case StreamOp::RecordFilled: filled_t[slot] = t_copy; break;
        case StreamOp::WaitFilled: t_comp = std::max(t_comp, filled_t[slot]); break;
        case StreamOp::Compute: {
          const double start = t_comp;
          t_comp += compute_s[size_t(st.layer)];
          if (record && st.slot >= 0) {
            const size_t i = size_t(item_of[size_t(st.layer)]);
            tl.copy_start.push_back(cs[i] - pass_start), tl.copy_end.push_back(ce[i] - pass_start);
            tl.compute_start.push_back(start - pass_start), tl.compute_end.push_back(t_comp - pass_start);
          }
          break;
        }
        case StreamOp::RecordFree: free_t[slot] = t_comp; break;
      }
    }
  };
  run(plan.prologue, false);
  for (int q = 0; q < passes; ++q) {
    const bool last = q == passes - 1;
    pass_start = t_comp;
    run(plan.steps, last);
    if (last) tl.pass_s = t_comp - pass_start;
  }
  return tl;
}

}  // namespace kvboost::gpu
