// The layer-streaming plan (kvboost/gpu.h plan_layer_stream, simulate_layer_stream): which
// layers stay on the device under --vram-budget and the copy / compute / event schedule over
// double-buffered slots. CPU-only logic: runs in every build.
#include <algorithm>
#include <numeric>

#include "kvboost/common.h"
#include "kvboost/gpu.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;
using gpu::StreamOp;
using gpu::StreamStep;

using kvboost::test::error_of;

namespace {
gpu::StreamPlanInput equal_layers(int n, uint64_t bytes, uint64_t fixed, uint64_t budget) {
  gpu::StreamPlanInput in;
  in.layer_bytes.assign(size_t(n), bytes);
  in.fixed_bytes = fixed;
  in.vram_budget = budget;
  return in;
}

bool same(const StreamStep& a, StreamOp op, int64_t layer, int64_t slot) {
  return a.op == op && a.layer == layer && a.slot == slot;
}

// Replays a plan's host-issued calls for `passes` passes and checks the invariants a CUDA
// executor relies on: each compute reads a slot whose last copy was of its layer, and no copy
// overwrites a slot whose last copied layer has not been computed yet.
void check_slot_safety(const gpu::StreamPlan& p, int passes) {
  std::vector<int64_t> holds(size_t(p.n_slots), -1);     // layer last copied into the slot
  std::vector<bool> consumed(size_t(p.n_slots), true);   // that layer computed since
  auto run = [&](const std::vector<StreamStep>& steps) {
    for (const StreamStep& s : steps) {
      if (s.op == StreamOp::Copy) {
        ASSERT_TRUE(consumed[size_t(s.slot)]) << "copy of layer " << s.layer << " over unread layer " << holds[size_t(s.slot)];
        holds[size_t(s.slot)] = s.layer;
        consumed[size_t(s.slot)] = false;
      } else if (s.op == StreamOp::Compute && s.slot >= 0) {
        ASSERT_EQ(holds[size_t(s.slot)], s.layer) << "compute of layer " << s.layer << " in slot " << s.slot;
        ASSERT_FALSE(consumed[size_t(s.slot)]);
        consumed[size_t(s.slot)] = true;
      }
    }
  };
  run(p.prologue);
  for (int q = 0; q < passes; ++q) run(p.steps);
}
}  // namespace

TEST(StreamPlan, BudgetSmallerThanOneLayerIsAClearError) {
  auto in = equal_layers(8, 1000, 500, 1400);  // 900 bytes for layers, a layer is 1000
  EXPECT_EQ(error_of([&] { gpu::plan_layer_stream(in); }),
            "--vram-budget 1400 bytes leave 900 bytes for layers after the 500 that stay on the device: less than one "
            "layer (1000 bytes)");
  in.vram_budget = 400;  // not even the fixed part
  EXPECT_NE(error_of([&] { gpu::plan_layer_stream(in); }).find("cannot hold the 500 bytes that stay on the device"),
            std::string::npos);
  in.vram_budget = 500 + 1500;  // one layer fits, two slots do not
  EXPECT_NE(error_of([&] { gpu::plan_layer_stream(in); }).find("fewer than 2 slots of the largest layer (1000 bytes each); give at least 2500 bytes"),
            std::string::npos);
  in.vram_budget = 1 << 20;
  in.n_slots = 1;
  EXPECT_NE(error_of([&] { gpu::plan_layer_stream(in); }).find("n_slots = 1"), std::string::npos);
  EXPECT_NE(error_of([] { gpu::plan_layer_stream({}); }).find("no layers"), std::string::npos);
}

TEST(StreamPlan, EverythingFitsMeansNoStreaming) {
  const auto p = gpu::plan_layer_stream(equal_layers(8, 1000, 500, 8500));  // exactly fits
  EXPECT_FALSE(p.streaming);
  EXPECT_EQ(p.n_slots, 0);
  EXPECT_EQ(p.bytes_per_pass, 0u);
  EXPECT_EQ(p.device_bytes, 8500u);
  EXPECT_TRUE(p.prologue.empty());
  ASSERT_EQ(p.steps.size(), 8u);
  for (int64_t l = 0; l < 8; ++l) EXPECT_TRUE(same(p.steps[size_t(l)], StreamOp::Compute, l, -1));
  EXPECT_TRUE(std::all_of(p.resident.begin(), p.resident.end(), [](bool r) { return r; }));
}

// A quarter of the layer bytes on the device = exactly two slots: every layer streamed, item i
// in slot i % 2, the copy of layer i + 2 issued right after layer i frees its slot, and the last
// two computes prefetch the next pass's layers 0 and 1.
TEST(StreamPlan, AQuarterFitsStreamsEveryLayerThroughTwoSlots) {
  const auto p = gpu::plan_layer_stream(equal_layers(8, 1000, 500, 500 + 2000));
  ASSERT_TRUE(p.streaming);
  EXPECT_EQ(p.n_slots, 2);
  EXPECT_EQ(p.slot_bytes, 1000u);
  EXPECT_EQ(p.streamed, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.bytes_per_pass, 8000u);
  EXPECT_EQ(p.device_bytes, 2500u);
  ASSERT_EQ(p.prologue.size(), 4u);
  EXPECT_TRUE(same(p.prologue[0], StreamOp::Copy, 0, 0));
  EXPECT_TRUE(same(p.prologue[1], StreamOp::RecordFilled, 0, 0));
  EXPECT_TRUE(same(p.prologue[2], StreamOp::Copy, 1, 1));
  ASSERT_EQ(p.steps.size(), 8u * 6);
  const std::vector<StreamStep> first = {p.steps.begin(), p.steps.begin() + 6};
  EXPECT_TRUE(same(first[0], StreamOp::WaitFilled, 0, 0));
  EXPECT_TRUE(same(first[1], StreamOp::Compute, 0, 0));
  EXPECT_TRUE(same(first[2], StreamOp::RecordFree, 0, 0));
  EXPECT_TRUE(same(first[3], StreamOp::WaitFree, 2, 0));
  EXPECT_TRUE(same(first[4], StreamOp::Copy, 2, 0));
  EXPECT_TRUE(same(first[5], StreamOp::RecordFilled, 2, 0));
  EXPECT_TRUE(same(p.steps[6 * 6 + 4], StreamOp::Copy, 0, 0));  // after layer 6: next pass's layer 0
  EXPECT_TRUE(same(p.steps[7 * 6 + 4], StreamOp::Copy, 1, 1));  // after layer 7: next pass's layer 1
  check_slot_safety(p, 3);
}

TEST(StreamPlan, LeftoverBudgetKeepsAPrefixResident) {
  auto p = gpu::plan_layer_stream(equal_layers(8, 1000, 500, 500 + 4000));  // half
  ASSERT_TRUE(p.streaming);
  EXPECT_EQ(p.n_slots, 2);
  EXPECT_EQ(p.streamed, (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.resident_layer_bytes, 2000u);
  EXPECT_TRUE(same(p.steps[0], StreamOp::Compute, 0, -1));
  EXPECT_TRUE(same(p.steps[1], StreamOp::Compute, 1, -1));
  EXPECT_TRUE(same(p.steps[3], StreamOp::Compute, 2, 0));
  check_slot_safety(p, 3);
  // One byte short of another resident layer changes nothing; one byte short of everything
  // keeps 5 resident (6 resident + 2 slots would need the whole 8000).
  p = gpu::plan_layer_stream(equal_layers(8, 1000, 500, 500 + 4999));
  EXPECT_EQ(p.streamed.size(), 6u);
  p = gpu::plan_layer_stream(equal_layers(8, 1000, 500, 500 + 7999));
  EXPECT_EQ(p.streamed, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(p.n_slots, 2);
  check_slot_safety(p, 3);
  EXPECT_LE(p.device_bytes, 500u + 7999);
}

// Odd streamed counts and more slots: slots stay safe across passes (each of the next pass's
// first S layers is copied once, into the slot it is then read from).
TEST(StreamPlan, SlotsStaySafeForOddCountsAndMoreSlots) {
  for (int n : {2, 3, 5, 7, 9})
    for (int64_t S : {2, 3, 4}) {
      auto in = equal_layers(n, 100, 0, uint64_t(S) * 100);
      in.n_slots = S;
      if (S >= n) continue;  // S slots of n layers: everything fits
      const auto p = gpu::plan_layer_stream(in);
      ASSERT_TRUE(p.streaming);
      ASSERT_EQ(p.n_slots, S);
      SCOPED_TRACE("n=" + std::to_string(n) + " S=" + std::to_string(S));
      check_slot_safety(p, 4);
      int copies = 0;
      for (const auto& s : p.steps) copies += s.op == StreamOp::Copy;
      EXPECT_EQ(copies, n);  // every layer copied once per pass
    }
  // Uneven layers: slots are sized for the largest streamed one.
  gpu::StreamPlanInput in;
  in.layer_bytes = {300, 100, 100, 100, 500, 100};
  in.vram_budget = 1000;
  const auto p = gpu::plan_layer_stream(in);
  EXPECT_EQ(p.slot_bytes, 500u);
  EXPECT_LE(p.device_bytes, 1000u);
  check_slot_safety(p, 3);
}

// Double buffering overlaps: with copy time == compute time per layer, a streamed pass takes
// about n layer-times (not 2n), layer i + 1 copies while layer i computes; copy-bound it takes
// bytes_per_pass / bandwidth.
TEST(StreamPlan, TimelineOverlapsCopyWithCompute) {
  const int n = 8;
  const auto p = gpu::plan_layer_stream(equal_layers(n, 1000, 0, 2000));
  const std::vector<uint64_t> bytes(size_t(n), 1000);
  const std::vector<double> comp(size_t(n), 1.0);  // 1 s per layer, copy 1000 B at 1000 B/s = 1 s
  const auto tl = gpu::simulate_layer_stream(p, bytes, 1000.0, comp, 4);
  EXPECT_NEAR(tl.pass_s, double(n), 1e-9);
  ASSERT_EQ(tl.compute_start.size(), size_t(n));
  for (int i = 0; i + 1 < n; ++i) {
    EXPECT_LT(tl.copy_start[size_t(i + 1)], tl.compute_end[size_t(i)]) << i;
    EXPECT_GT(tl.copy_end[size_t(i + 1)], tl.compute_start[size_t(i)]) << i;
    EXPECT_GE(tl.compute_start[size_t(i)], tl.copy_end[size_t(i)]) << i;  // never reads a slot before its copy ends
  }
  // Copy-bound: compute negligible, the pass is the bytes over the bandwidth.
  const auto fast = gpu::simulate_layer_stream(p, bytes, 1000.0, std::vector<double>(size_t(n), 1e-6), 4);
  EXPECT_NEAR(fast.pass_s, 8.0, 1e-3);
  // Compute-bound: copies hide entirely.
  const auto slow = gpu::simulate_layer_stream(p, bytes, 1e9, comp, 4);
  EXPECT_NEAR(slow.pass_s, double(n), 1e-3);
  // Everything resident: the sum of the computes.
  const auto all = gpu::plan_layer_stream(equal_layers(n, 1000, 0, 8000));
  EXPECT_NEAR(gpu::simulate_layer_stream(all, bytes, 1.0, comp, 2).pass_s, double(n), 1e-9);
}
