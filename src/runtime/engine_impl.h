// Internal: the engine's state and its step (Engine::Impl, the opaque handle of kvboost/engine.h).
// Engine's public methods forward here (engine_api.cpp); the runtime's files define these
// members: engine.cpp (construction, submit, the step loop), scheduler.cpp (the plan),
// runner.h (the passes), output.cpp (sampling and streaming), reuse.cpp (the reuse module's
// plan applied, the guard), speculative.cpp, verify.cpp.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvboost/engine.h"

namespace kvboost {

struct SpecDraftModel;  // speculative.h
struct StepPlan;        // scheduler.h
class ModelRunner;      // runner.h

struct Engine::Impl {
  Impl(std::unique_ptr<Model> m, Tokenizer t, const EngineOptions& opt);
  ~Impl();

  // The public API's bodies (kvboost/engine.h documents them).
  int64_t context_length() const;
  GenerateResult generate(std::string_view prompt, const GenerateOptions& opt);
  GenerateResult generate_ids(const std::vector<int32_t>& prompt_ids, const GenerateOptions& opt);
  GenerateResult generate_segments(const std::vector<std::string>& segments, const GenerateOptions& opt);
  std::vector<int32_t> encode_segments(const std::vector<std::string>& segments, bool add_special,
                                       std::vector<int64_t>* segment_starts) const;
  std::shared_ptr<Request> submit(std::vector<int32_t> prompt_ids, GenerateOptions opt);
  StepStats step();
  bool has_work() const;
  bool idle_work();
  kv::KvStats kv_stats() const;
  int64_t device_passes() const;
  SpecStats spec_stats() const;
  GuardCalibration guard_calibration() const;
  void guard_observe(ReuseMode mode, float error);
  void save_guard_calibration(const std::string& path) const;
  void load_guard_calibration(const std::string& path);
  int64_t warm(const std::vector<int32_t>& ids, const std::vector<int64_t>& segment_starts,
               const std::string& cache_namespace);
  Agreement verify_correctness(const std::vector<int32_t>& ids, const GenerateOptions& reuse_opt, int n_tokens);
  std::vector<Agreement> verify_correctness(const std::vector<std::vector<int32_t>>& prompts,
                                            const GenerateOptions& reuse_opt, int n_tokens);

  struct Live;
  // step() is plan -> run -> process: schedule() (scheduler.cpp) returns the step as data, the
  // runner_ (runner.h) executes its passes, after_logits (output.cpp) samples and streams.
  StepPlan schedule();
  // The plan's passes (the runner), then the output stage over their logits; the guard and the
  // chunk store after each prefill. step() = schedule() + execute() under mu_ (tests call the
  // two on their own, single-threaded, to look at the plan in between).
  StepStats execute(StepPlan& plan);
  bool admit(Request::State& r, StepPlan& plan);
  // A CUDA device with a cold tier (scheduler.cpp): the running requests whose whole block
  // tables this step's pass can hold in the device pool, taken in turn; the rest sit the step out.
  std::vector<const Request::State*> device_slice();
  size_t slice_start_ = 0;
  int64_t slice_steps_ = 0;
  bool slice_for_testing_ = false;  // tests: slice on the CPU too (its cold tier pages by range)
  void release(Request::State& r);
  void finish(Request::State& r, const char* reason);
  void fail_request(Request::State& r, const std::string& why);
  void preempt(Request::State& r);
  void after_logits(Request::State& r, float* logits, int32_t chosen = -1);
  KvView view_of(Request::State& r, int64_t n_past);
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Model> model_;
  Tokenizer tok_;
  EngineOptions opt_;
  int64_t block_size_;
  mutable std::mutex mu_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<kv::PagedKvStorage> store_;
  std::unique_ptr<kv::FileColdStore> cold_;
  std::vector<std::shared_ptr<Request>> waiting_, running_;
  std::shared_ptr<kv::ChunkStore> chunks_;
  std::string model_id_;
  // speculative.cpp: drafting before the pass, acceptance after it (docs/speculative.md).
  std::unique_ptr<SpecDraftModel> draft_;
  SpecStats spec_totals_;
  void spec_setup(Request::State& r);                         // at submit: resolves, validates
  int64_t spec_plan(Request::State& r, int64_t n_decoding);  // drafts; returns their count
  bool spec_accept(Request::State& r);  // after the pass; false: no drafts (a plain decode)
  void spec_release(Request::State& r);
  // The cost of a drafted row relative to the whole pass, measured: decode-only passes without
  // drafts (by batch size) against those with drafts (speculative.cpp).
  void spec_observe(const StepStats& ss);
  std::array<double, 65> spec_plain_ms_{};
  double spec_row_cost_ = 0.1;
  // Batch 1: a pass with k drafts measured relative to a plain pass, per k (0: not measured).
  // The cost is not linear in k (a 2-row pass can cost as much as a 5-row one per row less).
  std::array<double, 33> spec_k_cost_{};
  // reuse.cpp: chunk lookups at admission, and storing computed chunks after the prefill.
  void plan_reuse(Request::State& r, int64_t n_cached, StepPlan& plan);
  // The planner's input for r from n_cached on (its is_break refers to r: use it while r lives).
  reuse::PromptInput reuse_input(Request::State& r, int64_t n_cached);
  void apply_reuse_plan(Request::State& r, reuse::PromptPlan& p, StepPlan& plan);
  void replan_reuse(Request::State& r, int64_t from, StepPlan& plan);
  int64_t remote_poll(Request::State& r, StepPlan& plan);  // the remote lookup overlapped with the prefill
  void store_chunks(Request::State& r);
  bool guard_trips(Request::State& r);
  float repaired_deviation(Request::State& r) const;
  void guard_learn(Request::State& r);
  void guard_escalate(Request::State& r, ReuseMode to);
  ReuseMode guard_next_rung(Request::State& r, ReuseMode rung);  // after `rung` tripped
  // guard_tokens.cpp: a held token's lead under the threshold; escalates, discards the held tokens.
  bool guard_hold_trips(Request::State& r);
  // The adaptive guard's state (kvboost/reuse.h): the last kGuardWindow lead errors per repair.
  reuse::Guard guard_;
  std::string guard_file_;
  kv::SeqId next_seq_ = 1;
  int64_t prefaulted_ = 0;        // KV blocks [0, prefaulted_) committed by idle_work
  bool prefault_failed_ = false;  // the kernel refused MADV_POPULATE_WRITE: idle_work stops
};

}  // namespace kvboost
