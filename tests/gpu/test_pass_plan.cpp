// The engine's device runner, host side (kvboost/gpu.h: PoolLayout, slot_runs, plan_pass,
// staging_layout, scratch_for): the exact pool offsets, slots, block tables, kernel choices and
// buffer sizes a device pass uses, checked on a machine without a GPU. Every build.
#include "kvboost/gpu.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;
using namespace kvboost::gpu;
using kvboost::test::error_of;

namespace {

PoolLayout pool(int64_t head_dim = 64) { return PoolLayout{3, 10, 4, 2, head_dim}; }

}  // namespace

TEST(DevicePlan, PoolOffsetsFollowTheCpuLayoutLayerByLayer) {
  const PoolLayout p{3, 10, 4, 2, 8};
  EXPECT_EQ(p.row(), 16);
  EXPECT_EQ(p.block_floats(), 64);
  EXPECT_EQ(p.layer_floats(), 640);
  EXPECT_EQ(p.pool_bytes(), 3u * 640u * 4u);
  EXPECT_EQ(p.offset(0, 0), 0);
  EXPECT_EQ(p.offset(0, 1), 64);
  EXPECT_EQ(p.offset(1, 0), 640);
  EXPECT_EQ(p.offset(2, 7, 3), 2 * 640 + (7 * 4 + 3) * 16);  // 1776
  EXPECT_EQ(p.offset(2, 7, 3), 1776);
}

TEST(DevicePlan, SlotRunsSplitAtBlockBoundaries) {
  const std::vector<kv::BlockId> table = {5, 2, 9};
  const auto runs = slot_runs(table, 4, 10, 2, 7);  // positions 2..8
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], (SlotRun{5 * 4 + 2, 0, 2}));
  EXPECT_EQ(runs[1], (SlotRun{2 * 4, 2, 4}));
  EXPECT_EQ(runs[2], (SlotRun{9 * 4, 6, 1}));
  EXPECT_TRUE(slot_runs(table, 4, 10, 3, 0).empty());
  EXPECT_EQ(slot_runs(table, 4, 10, 11, 1)[0], (SlotRun{39, 0, 1}));
}

TEST(DevicePlan, SlotRunsRefuseWhatTheDeviceCannotHold) {
  const std::vector<kv::BlockId> ok = {5, 2}, table = {5, kv::kColdBlock, 12};
  EXPECT_EQ(error_of([&] { slot_runs(ok, 4, 10, 6, 4); }),
            "device K/V rows: position 8 is past its block table (2 blocks of 4)");
  EXPECT_EQ(error_of([&] { slot_runs(table, 4, 10, 2, 3); }),
            "device K/V rows: position 4 is in a cold block (the device runner has no cold tier)");
  EXPECT_EQ(error_of([&] { slot_runs(table, 4, 10, 8, 1); }),
            "device K/V rows: block id 12 (position 8) is outside the device pool of 10 blocks");
}

TEST(DevicePlan, AttentionKernelByQueriesAndHeadDim) {
  EXPECT_EQ(attention_kernel_for(1, 64), AttnKernel::SplitK);
  EXPECT_EQ(attention_kernel_for(8, 128), AttnKernel::SplitK);
  EXPECT_EQ(attention_kernel_for(9, 128), AttnKernel::Flash);
  EXPECT_EQ(attention_kernel_for(512, 256), AttnKernel::Flash);
  EXPECT_EQ(attention_kernel_for(1, 256), AttnKernel::SplitK);
  EXPECT_EQ(attention_kernel_for(1, 8), AttnKernel::Simple);  // stories260K
  EXPECT_EQ(attention_kernel_for(100, 8), AttnKernel::Simple);
  EXPECT_EQ(attention_kernel_for(100, 48), AttnKernel::Simple);
  EXPECT_EQ(attention_kernel_for(100, 288), AttnKernel::Simple);
}

// A decode row and a scattered prefill (positions 0, 1, 2 then 6, 7: a reuse plan's recompute
// set) in one pass: rows, slots, tables, runs and logit rows exactly.
TEST(DevicePlan, DecodeAndScatteredPrefillInOnePass) {
  const std::vector<kv::BlockId> ta = {3, 1}, tb = {4, 0};
  const int32_t tok_a[] = {7};
  const int32_t tok_b[] = {10, 11, 12, 13, 14};
  const int32_t pos_b[] = {0, 1, 2, 6, 7};
  float la[512], lb[2 * 512];
  PagedSeq s[2];
  s[0].tokens = tok_a, s[0].n = 1, s[0].n_past = 5, s[0].block_table = ta, s[0].logits = la, s[0].n_logits = 1;
  s[1].tokens = tok_b, s[1].positions = pos_b, s[1].n = 5, s[1].block_table = tb, s[1].logits = lb, s[1].n_logits = 2;
  const PassPlan p = plan_pass(s, 2, pool(), 512);
  EXPECT_EQ(p.n_rows, 6);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{7, 10, 11, 12, 13, 14}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{5, 0, 1, 2, 6, 7}));
  // position 5 of a: block 1 of its table (id 1), row 1; b's 0..2 in id 4, 6..7 in id 0
  EXPECT_EQ(p.slots, (std::vector<int64_t>{5, 16, 17, 18, 2, 3}));
  EXPECT_EQ(p.tables, (std::vector<int32_t>{3, 1, 4, 0}));
  EXPECT_EQ(p.table_off, (std::vector<int64_t>{0, 2}));
  ASSERT_EQ(p.runs.size(), 3u);
  const PassRun r0 = p.runs[0], r1 = p.runs[1], r2 = p.runs[2];
  EXPECT_EQ(r0.seq, 0);
  EXPECT_EQ(r0.row0, 0);
  EXPECT_EQ(r0.n, 1);
  EXPECT_EQ(r0.pos0, 5);
  EXPECT_EQ(r0.table_off, 0);
  EXPECT_EQ(r1.seq, 1);
  EXPECT_EQ(r1.row0, 1);
  EXPECT_EQ(r1.n, 3);
  EXPECT_EQ(r1.pos0, 0);
  EXPECT_EQ(r1.table_off, 2);
  EXPECT_EQ(r2.seq, 1);
  EXPECT_EQ(r2.row0, 4);
  EXPECT_EQ(r2.n, 2);
  EXPECT_EQ(r2.pos0, 6);
  EXPECT_EQ(r2.table_off, 2);
  for (const PassRun& r : p.runs) EXPECT_EQ(r.kernel, AttnKernel::SplitK);
  EXPECT_EQ(p.logit_rows, (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(p.logit_count, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.max_split_k_queries, 3);
  EXPECT_EQ(p.max_split_k_keys, 8);
}

// A 12-token prefill chunk without logits (a prompt that continues next step) and a 2-row
// decode (a token and one draft): the table covers the keys read, [0, last position].
TEST(DevicePlan, PrefillChunkWithoutLogitsAndADraftRow) {
  const std::vector<kv::BlockId> ta = {6, 7, 8, 9}, tb = {2};
  std::vector<int32_t> tok_a(12, 1);
  const int32_t tok_b[] = {4, 5};
  float lb[2 * 100];
  PagedSeq s[2];
  s[0].tokens = tok_a.data(), s[0].n = 12, s[0].block_table = ta, s[0].logits = nullptr;
  s[1].tokens = tok_b, s[1].n = 2, s[1].n_past = 1, s[1].block_table = tb, s[1].logits = lb, s[1].n_logits = 2;
  const PassPlan p = plan_pass(s, 2, pool(), 100);
  EXPECT_EQ(p.n_rows, 14);
  EXPECT_EQ(p.tables, (std::vector<int32_t>{6, 7, 8, 2}));  // 12 keys: 3 blocks of 4; b: 3 keys, 1 block
  EXPECT_EQ(p.table_off, (std::vector<int64_t>{0, 3}));
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.runs[0].kernel, AttnKernel::Flash);
  EXPECT_EQ(p.runs[0].n, 12);
  EXPECT_EQ(p.runs[1].kernel, AttnKernel::SplitK);
  EXPECT_EQ(p.runs[1].pos0, 1);
  EXPECT_EQ(p.slots[11], 8 * 4 + 3);
  EXPECT_EQ(p.slots[12], 2 * 4 + 1);
  EXPECT_EQ(p.logit_rows, (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(p.logit_count, (std::vector<int64_t>{0, 2}));
  // head_dim 8 (stories260K): the plain kernel whatever the run's length
  const PassPlan q = plan_pass(s, 2, pool(8), 100);
  EXPECT_EQ(q.runs[0].kernel, AttnKernel::Simple);
  EXPECT_EQ(q.runs[1].kernel, AttnKernel::Simple);
  EXPECT_EQ(q.max_split_k_queries, 0);
}

TEST(DevicePlan, BadPassesNameTheSequence) {
  const std::vector<kv::BlockId> t = {1, 2};
  const int32_t tok[] = {3, 4, 600};
  const int32_t pos[] = {2, 2, 3};
  PagedSeq s;
  s.tokens = tok, s.n = 0, s.block_table = t;
  EXPECT_EQ(error_of([&] { plan_pass(&s, 1, pool(), 512); }), "device pass: sequence 0 of the batch has no tokens");
  s.n = 3;
  EXPECT_EQ(error_of([&] { plan_pass(&s, 1, pool(), 512); }), "token id 600 is outside the vocabulary [0, 512)");
  s.n = 2, s.positions = pos;
  EXPECT_EQ(error_of([&] { plan_pass(&s, 1, pool(), 512); }),
            "device pass: positions of sequence 0 are not increasing at index 1");
  s.positions = nullptr, s.n_past = 7;
  EXPECT_EQ(error_of([&] { plan_pass(&s, 1, pool(), 512); }),
            "device pass: position 8 of sequence 0 is past its block table (2 blocks of 4)");
}

TEST(DevicePlan, StagingPiecesAre256ByteAligned) {
  const StagingLayout l = staging_layout(3, 4, 3, 64);
  EXPECT_EQ(l.tokens, 0u);
  EXPECT_EQ(l.slots, 256u);
  EXPECT_EQ(l.tables, 512u);
  EXPECT_EQ(l.logit_rows, 768u);
  EXPECT_EQ(l.cos, 1024u);
  EXPECT_EQ(l.sin, 1536u);  // 3 rows x 32 floats = 384 bytes, rounded up
  EXPECT_EQ(l.bytes, 2048u);
  const StagingLayout e = staging_layout(1, 1, 0, 8);
  EXPECT_EQ(e.logit_rows, e.cos);  // an empty piece takes no room
  EXPECT_EQ(e.bytes, 5u * 256u);
}

TEST(DevicePlan, ScratchForABatch) {
  ModelConfig c;  // stories260K's shape
  c.hidden_size = 64, c.intermediate_size = 172, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 8, c.vocab_size = 512;
  const PassScratch s = scratch_for(c, 10, 2);
  EXPECT_EQ(s.x, 640);
  EXPECT_EQ(s.q, 640);
  EXPECT_EQ(s.kv, 320);
  EXPECT_EQ(s.gate, 1720);
  EXPECT_EQ(s.xh, 1720);  // max(H, I, n_heads * hd) = I
  EXPECT_EQ(s.logit_x, 128);
  EXPECT_EQ(s.logits, 1024);
}
