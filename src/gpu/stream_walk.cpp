// The layer-streaming plan as the device runner issues it, layer by layer (kvboost/gpu.h
// walk_layer_stream): plain host code in every build, tested without a device
// (tests/gpu/test_stream_walk.cpp). The runner (src/gpu/paged_stream.cpp) only replays it.
#include "kvboost/common.h"
#include "kvboost/gpu.h"

namespace kvboost::gpu {

std::vector<LayerStreamActions> walk_layer_stream(const StreamPlan& plan, bool cold) {
  const int64_t n = int64_t(plan.resident.size());
  std::vector<LayerStreamActions> out;
  out.reserve(size_t(n));
  if (!plan.streaming) {
    for (int64_t l = 0; l < n; ++l) {
      LayerStreamActions a;
      a.layer = l;
      out.push_back(std::move(a));
    }
    return out;
  }
  // Copies issued before the first compute (the prologue on a cold pass) go before layer 0; a
  // copy issued after layer l's compute goes into l's `after`: the host issues it right after
  // that compute is enqueued, which is where the plan puts it.
  std::vector<StreamCopy> pending;
  bool wait_pending = false, waited_filled = false;
  auto copy_into = [&](const StreamStep& st) {
    if (st.slot < 0 || st.slot >= plan.n_slots)
      fail("layer stream walk: a copy of layer ", st.layer, " into slot ", st.slot, " (", plan.n_slots, " slots)");
    if (st.layer < 0 || st.layer >= n || plan.resident[size_t(st.layer)])
      fail("layer stream walk: a copy of layer ", st.layer, ", which is not a streamed layer");
    const StreamCopy c{st.layer, st.slot, wait_pending};
    wait_pending = false;
    if (out.empty()) pending.push_back(c);
    else out.back().after.push_back(c);
  };
  auto replay = [&](const std::vector<StreamStep>& steps) {
    for (const StreamStep& st : steps) switch (st.op) {
        case StreamOp::WaitFree: wait_pending = true; break;
        case StreamOp::Copy: copy_into(st); break;
        case StreamOp::RecordFilled: break;  // every copy is followed by it
        case StreamOp::WaitFilled: waited_filled = true; break;
        case StreamOp::Compute: {
          const int64_t l = int64_t(out.size());
          if (st.layer != l) fail("layer stream walk: the plan computes layer ", st.layer, " where layer ", l, " comes");
          if ((st.slot < 0) != plan.resident[size_t(l)])
            fail("layer stream walk: layer ", l, " computes from slot ", st.slot, " but is ",
                 plan.resident[size_t(l)] ? "resident" : "streamed");
          if (st.slot >= 0 && !waited_filled) fail("layer stream walk: layer ", l, " computes without waiting for its copy");
          LayerStreamActions a;
          a.layer = l, a.slot = st.slot;
          a.wait_filled = waited_filled;
          if (l == 0) a.before = std::move(pending);
          out.push_back(std::move(a));
          waited_filled = false;
          break;
        }
        case StreamOp::RecordFree:
          if (out.empty() || out.back().slot != st.slot) fail("layer stream walk: slot ", st.slot, " freed by no compute");
          out.back().record_free = true;
          break;
      }
  };
  if (cold) replay(plan.prologue);
  replay(plan.steps);
  if (int64_t(out.size()) != n) fail("layer stream walk: the plan computes ", out.size(), " of ", n, " layers");
  return out;
}

}  // namespace kvboost::gpu
