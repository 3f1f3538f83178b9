// The layer-streaming walk (kvboost/gpu.h walk_layer_stream): the per-layer copy / compute /
// event calls the device runner issues, replayed here on a model of two CUDA streams with
// events, and checked for what the runner relies on: no slot is overwritten while a compute
// that reads it may run, every streamed layer is copied before its compute (by exactly the copy
// it reads), resident layers are never copied, and back-to-back passes prefetch the next pass's
// first streamed layers at the end of the pass before. CPU-only: every build.
#include <algorithm>
#include <string>

#include "kvboost/gpu.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;
using namespace kvboost::gpu;
using kvboost::test::error_of;

namespace {

StreamPlanInput equal_layers(int n, uint64_t bytes, uint64_t fixed, uint64_t budget, int64_t slots = 2) {
  StreamPlanInput in;
  in.layer_bytes.assign(size_t(n), bytes);
  in.fixed_bytes = fixed;
  in.vram_budget = budget;
  in.n_slots = slots;
  return in;
}

// Two streams (0: copy, 1: compute) as a happens-before graph: each op follows the previous op
// of its stream; cudaStreamWaitEvent follows the latest record of the event issued so far (none:
// no edge, as CUDA treats a never-recorded event); a synchronization follows everything.
struct TwoStreams {
  enum Kind { Copy, Compute, Record, Wait, Sync };
  struct Op {
    Kind kind;
    int stream;
    int64_t layer, slot, pass;
  };
  std::vector<Op> ops;
  std::vector<std::vector<bool>> anc;  // anc[i][j]: op j happens before op i
  int64_t last[2] = {-1, -1};
  std::vector<int64_t> last_filled, last_free;  // latest record per slot
  int64_t last_sync = -1;

  explicit TwoStreams(int64_t n_slots) : last_filled(size_t(n_slots), -1), last_free(size_t(n_slots), -1) {}

  int64_t add(Kind k, int stream, int64_t layer, int64_t slot, int64_t pass, int64_t wait_on = -1) {
    const int64_t i = int64_t(ops.size());
    ops.push_back({k, stream, layer, slot, pass});
    std::vector<bool> a(size_t(i + 1), false);
    auto from = [&](int64_t j) {
      if (j < 0) return;
      a[size_t(j)] = true;
      for (int64_t q = 0; q < j; ++q)
        if (anc[size_t(j)][size_t(q)]) a[size_t(q)] = true;
    };
    from(last[stream]);
    from(wait_on);
    from(last_sync);
    anc.push_back(std::move(a));
    last[stream] = i;
    return i;
  }
  bool before(int64_t a, int64_t b) const { return a < b && anc[size_t(b)][size_t(a)]; }

  void copy(const StreamCopy& c, int64_t pass) {
    if (c.wait_free) add(Wait, 0, c.layer, c.slot, pass, last_free[size_t(c.slot)]);
    add(Copy, 0, c.layer, c.slot, pass);
    last_filled[size_t(c.slot)] = add(Record, 0, c.layer, c.slot, pass);
  }
  // One pass of the walk; stop >= 0: the pass fails inside layer `stop` (its compute enqueued,
  // its slot never freed, nothing after it issued).
  void pass(const std::vector<LayerStreamActions>& walk, int64_t pass_no, int64_t stop = -1) {
    for (const LayerStreamActions& a : walk) {
      for (const StreamCopy& c : a.before) copy(c, pass_no);
      if (a.wait_filled) add(Wait, 1, a.layer, a.slot, pass_no, last_filled[size_t(a.slot)]);
      add(Compute, 1, a.layer, a.slot, pass_no);
      if (a.layer == stop) return;
      if (a.record_free) last_free[size_t(a.slot)] = add(Record, 1, a.layer, a.slot, pass_no);
      for (const StreamCopy& c : a.after) copy(c, pass_no);
    }
  }
  void sync() { last_sync = add(Sync, 0, -1, -1, -1, last[1]), last[0] = last[1] = last_sync; }

  // The first violated invariant, or "".
  std::string check(const StreamPlan& plan) const {
    std::vector<int> reads(ops.size(), 0);
    for (size_t c = 0; c < ops.size(); ++c) {
      const Op& o = ops[c];
      if (o.kind == Copy && plan.resident[size_t(o.layer)]) return "resident layer " + std::to_string(o.layer) + " copied";
      if (o.kind != Compute) continue;
      const std::string at = "pass " + std::to_string(o.pass) + " layer " + std::to_string(o.layer);
      if (plan.resident[size_t(o.layer)] != (o.slot < 0)) return at + ": wrong slot " + std::to_string(o.slot);
      if (o.slot < 0) continue;
      int64_t src = -1;
      for (size_t p = 0; p < ops.size(); ++p) {
        if (ops[p].kind != Copy || ops[p].slot != o.slot) continue;
        if (before(int64_t(p), int64_t(c))) src = int64_t(p);  // copies are ordered on one stream
        else if (!before(int64_t(c), int64_t(p)))
          return at + ": races the copy of layer " + std::to_string(ops[p].layer) + " into slot " + std::to_string(o.slot);
      }
      if (src < 0) return at + ": computes before any copy into slot " + std::to_string(o.slot);
      if (ops[size_t(src)].layer != o.layer)
        return at + ": reads slot " + std::to_string(o.slot) + " holding layer " + std::to_string(ops[size_t(src)].layer);
      if (++reads[size_t(src)] > 1) return at + ": reads a copy an earlier compute already read (no fresh copy)";
    }
    return "";
  }
};

int count_copies(const std::vector<LayerStreamActions>& w, int64_t layer = -1) {
  int n = 0;
  for (const auto& a : w)
    for (const auto* v : {&a.before, &a.after})
      for (const StreamCopy& c : *v) n += layer < 0 || c.layer == layer;
  return n;
}

}  // namespace

// Half the layers' bytes: layers 0 and 1 resident, 2..7 streamed through two slots. The cold
// walk issues the prologue before layer 0 (so the first copies overlap the resident layers);
// item i's compute frees its slot and the copy of item i + 2 follows; the last two streamed
// layers prefetch the next pass's first two. The warm walk is the same without the prologue.
TEST(StreamWalk, HalfTheLayersStreamedExactActions) {
  const StreamPlan p = plan_layer_stream(equal_layers(8, 1000, 500, 500 + 4000));
  ASSERT_EQ(p.streamed, (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
  const auto cold = walk_layer_stream(p, true), warm = walk_layer_stream(p, false);
  ASSERT_EQ(cold.size(), 8u);
  ASSERT_EQ(warm.size(), 8u);
  ASSERT_EQ(cold[0].before.size(), 2u);
  EXPECT_EQ(cold[0].before[0].layer, 2);
  EXPECT_EQ(cold[0].before[0].slot, 0);
  EXPECT_FALSE(cold[0].before[0].wait_free);
  EXPECT_EQ(cold[0].before[1].layer, 3);
  EXPECT_EQ(cold[0].before[1].slot, 1);
  EXPECT_TRUE(warm[0].before.empty());
  for (const auto* w : {&cold, &warm}) {
    for (int64_t l : {0, 1}) {
      EXPECT_EQ((*w)[size_t(l)].slot, -1);
      EXPECT_FALSE((*w)[size_t(l)].wait_filled);
      EXPECT_FALSE((*w)[size_t(l)].record_free);
      EXPECT_TRUE((*w)[size_t(l)].after.empty());
    }
    const int64_t next[8] = {0, 0, 4, 5, 6, 7, 2, 3};  // the copy after each streamed layer
    for (int64_t l = 2; l < 8; ++l) {
      const LayerStreamActions& a = (*w)[size_t(l)];
      EXPECT_EQ(a.slot, (l - 2) % 2) << l;
      EXPECT_TRUE(a.wait_filled && a.record_free) << l;
      EXPECT_TRUE(a.before.empty()) << l;
      ASSERT_EQ(a.after.size(), 1u) << l;
      EXPECT_EQ(a.after[0].layer, next[l]) << l;
      EXPECT_EQ(a.after[0].slot, a.slot) << l;  // into the slot just freed
      EXPECT_TRUE(a.after[0].wait_free) << l;
    }
  }
  EXPECT_EQ(count_copies(cold), 8);  // 6 of this pass (2 of them in the prologue) + 2 for the next
  EXPECT_EQ(count_copies(warm), 6);
  for (int64_t l = 2; l < 8; ++l) EXPECT_EQ(count_copies(warm, l), 1) << l;
  for (int64_t l = 0; l < 2; ++l) EXPECT_EQ(count_copies(cold, l), 0) << l;
}

// Every plan shape (prefixes resident or not, odd counts, 2..4 slots) replayed cold then warm
// for several passes on the two-stream model: no race on a slot, every compute reads a fresh
// copy of its own layer, and each warm pass's first streamed layers were copied during the pass
// before (before that pass's last compute, i.e. prefetched behind it).
TEST(StreamWalk, BackToBackPassesAreRaceFreeForEveryShape) {
  for (int n : {2, 3, 5, 8, 9})
    for (int64_t S : {2, 3, 4})
      for (uint64_t extra : {0, 150, 300, 450}) {
        const uint64_t budget = uint64_t(S) * 100 + extra;
        if (budget >= uint64_t(n) * 100) continue;  // everything fits: no streaming
        const StreamPlan p = plan_layer_stream(equal_layers(n, 100, 0, budget, S));
        ASSERT_TRUE(p.streaming);
        SCOPED_TRACE("n=" + std::to_string(n) + " S=" + std::to_string(S) + " extra=" + std::to_string(extra));
        const auto cold = walk_layer_stream(p, true), warm = walk_layer_stream(p, false);
        TwoStreams t(p.n_slots);
        t.pass(cold, 0);
        for (int q = 1; q < 4; ++q) t.pass(warm, q);
        EXPECT_EQ(t.check(p), "");
        EXPECT_EQ(count_copies(warm), int(p.streamed.size()));
        // Prefetch: in passes >= 1 the copy each of the first n_slots streamed computes reads
        // was issued in the pass before.
        for (size_t c = 0; c < t.ops.size(); ++c) {
          const auto& o = t.ops[c];
          if (o.kind != TwoStreams::Compute || o.pass < 1 || o.slot < 0) continue;
          const auto it = std::find(p.streamed.begin(), p.streamed.end(), o.layer);
          if (it - p.streamed.begin() >= p.n_slots) continue;
          int64_t src_pass = -1;
          for (size_t q = 0; q < c; ++q)
            if (t.ops[q].kind == TwoStreams::Copy && t.ops[q].slot == o.slot) src_pass = t.ops[q].pass;
          EXPECT_EQ(src_pass, o.pass - 1) << "layer " << o.layer << " pass " << o.pass;
        }
      }
}

// A pass that fails midway leaves copies and computes in flight: the runner synchronizes both
// streams and the next pass walks cold again (the prologue, no waits: nothing is pending).
// Without the synchronization the prologue's copies would race the failed pass's computes --
// the model sees that, so the synchronization is not decoration.
TEST(StreamWalk, AFailedPassRestartsColdAfterASync) {
  const StreamPlan p = plan_layer_stream(equal_layers(8, 1000, 0, 3000));  // 1 resident, 2 slots
  ASSERT_TRUE(p.streaming);
  const auto cold = walk_layer_stream(p, true), warm = walk_layer_stream(p, false);
  for (int64_t stop : {0, 1, 3, 6}) {
    SCOPED_TRACE("stop=" + std::to_string(stop));
    TwoStreams t(p.n_slots);
    t.pass(cold, 0);
    t.pass(warm, 1, stop);
    t.sync();
    t.pass(cold, 2);
    t.pass(warm, 3);
    EXPECT_EQ(t.check(p), "");
  }
  TwoStreams bad(p.n_slots);
  bad.pass(cold, 0);
  bad.pass(warm, 1, 3);  // layer 3 (slot 0) still computing
  bad.pass(cold, 2);     // no sync: the prologue copies layer 1 into slot 0 at once
  EXPECT_NE(bad.check(p).find("races the copy of layer 1 into slot 0"), std::string::npos) << bad.check(p);
}

// The model catches broken schedules: a copy that does not wait for its slot's compute, a
// compute that does not wait for its copy, a compute whose slot is never freed, a walk used warm
// on the first pass (nothing copied yet).
TEST(StreamWalk, TheCheckerCatchesBrokenSchedules) {
  const StreamPlan p = plan_layer_stream(equal_layers(6, 100, 0, 200));  // every layer streamed
  const auto cold = walk_layer_stream(p, true), warm = walk_layer_stream(p, false);
  auto run = [&](std::vector<LayerStreamActions> c) {
    TwoStreams t(p.n_slots);
    t.pass(c, 0);
    t.pass(warm, 1);
    return t.check(p);
  };
  EXPECT_EQ(run(cold), "");
  auto no_wait_free = cold;
  no_wait_free[2].after[0].wait_free = false;
  EXPECT_NE(run(no_wait_free).find("races the copy"), std::string::npos);
  auto no_wait_filled = cold;
  no_wait_filled[3].wait_filled = false;
  EXPECT_NE(run(no_wait_filled), "");
  auto no_free = cold;
  no_free[1].record_free = false;
  EXPECT_NE(run(no_free), "");
  TwoStreams t(p.n_slots);
  t.pass(warm, 0);
  EXPECT_NE(t.check(p).find("before any copy"), std::string::npos);
}

TEST(StreamWalk, ResidentPlansWalkWithoutCopiesAndBadPlansAreErrors) {
  const StreamPlan all = plan_layer_stream(equal_layers(4, 100, 0, 400));
  ASSERT_FALSE(all.streaming);
  for (bool cold : {true, false}) {
    const auto w = walk_layer_stream(all, cold);
    ASSERT_EQ(w.size(), 4u);
    for (int64_t l = 0; l < 4; ++l) {
      EXPECT_EQ(w[size_t(l)].layer, l);
      EXPECT_EQ(w[size_t(l)].slot, -1);
      EXPECT_EQ(count_copies(w), 0);
    }
  }
  StreamPlan p = plan_layer_stream(equal_layers(4, 100, 0, 200));
  std::swap(p.steps[1], p.steps[2]);  // compute before its wait
  EXPECT_NE(error_of([&] { walk_layer_stream(p, true); }), "");
  p = plan_layer_stream(equal_layers(4, 100, 0, 200));
  p.steps.resize(p.steps.size() - 6);  // the last layer missing
  EXPECT_NE(error_of([&] { walk_layer_stream(p, true); }).find("computes 3 of 4 layers"), std::string::npos);
}
