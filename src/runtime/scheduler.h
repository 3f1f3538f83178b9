// Internal: one engine step as data. The scheduler (scheduler.cpp: Engine::schedule) decides
// what runs -- admissions, preemptions, decode slots, drafts, prefill chunks, repairs -- and
// writes it down here; the model runner (runner.h) executes the passes; the output stage
// (output.h) turns each pass's logits into tokens and text. engine.cpp is the loop between them.
// (vLLM v1: Scheduler.schedule() -> SchedulerOutput -> GPUModelRunner.execute_model.)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvboost/kv.h"
#include "kvboost/model.h"
#include "kvboost/reuse.h"
#include "request.h"

namespace kvboost {

// One sequence's rows in the step's batched forward pass: a decode token (with the drafts that
// speculation verifies in the same pass), or a chunk of prompt positions.
struct PlannedRows {
  Request::State* req = nullptr;  // whose rows (for the output stage; the runner reads only what follows)
  bool decode = false;
  kv::SeqId seq = 0;
  std::span<const int32_t> tokens;     // [n]
  // Prefill: the positions of those tokens (increasing, possibly scattered after a reuse plan);
  // empty for decode rows, which sit at n_past, n_past + 1, ...
  std::span<const int32_t> positions;
  int64_t n_past = 0;                  // decode: tokens whose K/V are stored before the rows
  float* logits = nullptr;             // [n_logits, vocab], nullptr: no logits wanted (a chunk
  int64_t n_logits = 1;                // of a prefill that continues in a later step)
  std::vector<int32_t> gathered;       // prefill: the tokens, gathered from the context by position
};

// A CacheBlend repair of one prompt (docs/chunk-reuse.md): positions [n_past, n_past + n) run
// through the layers below opts.check_layer in full and, from there on, only the rows the
// deviation selects (plus the new tokens): "these rows at these layers", in its own pass.
struct PlannedBlend {
  Request::State* req = nullptr;
  kv::SeqId seq = 0;
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  int64_t n_past = 0;
  BlendOptions opts;
  float* logits = nullptr;          // [vocab]
};

struct StepPlan {
  std::vector<PlannedRows> batch;    // one forward pass: decode rows first in running order
  std::vector<PlannedBlend> blends;  // then one pass per CacheBlend repair
  // Block copies (copy-on-write of a shared block) that this step's allocations asked for. The
  // kv manager requires them before its next call and a reuse plan's copy-in may write into
  // the copied block, so the scheduler has the runner apply them as they come; they are listed
  // here for the record (tests, traces).
  std::vector<kv::CopyOp> copies;
  // The reuse plans' chunk copy-ins (kvboost/reuse.h) of the requests admitted in this step, in
  // the order the runner applied them (after the copies their allocations asked for, before
  // any pass): stored chunks into these sequences' slots, keys re-rotated.
  struct CopyIn {
    kv::SeqId seq = 0;
    reuse::CopyIn op;
  };
  std::vector<CopyIn> copy_ins;
  // Requests whose state the scheduling changed: admitted (KV allocated, a prefill planned),
  // preempted (KV freed, back to the queue), finished (cancelled, or failed at admission or
  // for lack of KV memory).
  std::vector<Request::State*> admitted, preempted, finished;
  int64_t n_decode = 0, n_prefill_tokens = 0, n_drafted = 0;
  bool empty() const { return batch.empty() && blends.empty(); }
};

}  // namespace kvboost
