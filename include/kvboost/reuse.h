// kvboost/reuse.h — chunk-level K/V reuse as one module: the policy a request asks for, the
// chunk keys, the plan of a prompt (which positions come from which cache, which rows each
// repair recomputes), the escalation ladder's cost model and the adaptive guard (its error
// statistics, thresholds and their file). Uses kvboost/kv.h (chunking, chunk keys, the chunk
// store) and kvboost/common.h; the engine (kvboost/engine.h) applies a plan through its model
// runner, which is the only code that writes K/V memory. docs/chunk-reuse.md has the method.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvboost/kv.h"

namespace kvboost {

// How a prompt reuses cached K/V beyond its exact cached prefix (chunk-level reuse).
enum class ReuseMode {
  kPrefixOnly,  // exact prefix hits only (paged block cache, chunk store prefix keys)
  kNone,        // chunks found at other positions are reused as they are (re-positioned keys)
  kSelective,   // ... and the first repair_tokens tokens of each reused run are recomputed (EPIC)
  kCacheBlend,  // ... and the most deviated blend_ratio of reused tokens is recomputed (CacheBlend)
  // The default: exact prefix first; for chunks found at other positions a ladder of repairs,
  // each step kept only when the guard's per-mode error model allows it: selective (or
  // cacheblend first, when the learned trip rates make selective the costlier start), then
  // cacheblend over the rows selective left as they were, then an exact recompute of only the
  // approximate span [first approximate token, n). Each step reuses the K/V the previous one
  // left (docs/chunk-reuse.md, "auto").
  kAuto,
};
const char* reuse_mode_name(ReuseMode m);
ReuseMode parse_reuse_mode(std::string_view s);  // auto | prefix | none | selective | cacheblend

struct ReusePolicy {
  ReuseMode mode = ReuseMode::kAuto;
  int64_t repair_tokens = 16;   // selective: tokens recomputed at the start of each reused run
  int64_t overlap_tokens = 0;   // selective: also recompute this many tokens before the run
  int64_t sink_tokens = 0;      // tokens at the start of the prompt that are always computed
  float blend_ratio = 0.15f;    // cacheblend: fraction of reused tokens recomputed
  int64_t blend_check_layer = 1;
  // cacheblend: the first this many tokens of each reused run are recomputed first, out of the
  // same budget (blend_ratio of the reused tokens); the deviation picks the rest. A run's first
  // tokens are where its K/V missed the most context (EPIC); 0: deviation alone (CacheBlend).
  int64_t blend_run_starts = 0;
  // cacheblend gradual filtering: select this fraction at the check layer, then narrow to
  // blend_ratio over the next blend_taper_layers layers, each ranking the survivors by its own
  // K/V deviation. <= blend_ratio: one selection at the check layer. Reused tokens whose K/V
  // drift only in later layers are invisible at the check layer; a wider first selection lets
  // the next layer find them (measured: docs/chunk-reuse.md).
  float blend_first_ratio = 0.5f;
  int64_t blend_taper_layers = 1;
  // Guard (none, selective, cacheblend): when the prompt's K/V were partly approximate (chunks
  // computed in another context, or read back from a quantized store) and the first token's top
  // logit leads the runner-up by less than a threshold, the approximate part is recomputed
  // exactly before that token is sampled: a near-tie the approximation could flip gets the full
  // prefill's answer (and K/V), at the cost of that prefill. The first tokens a repair changed
  // were close calls as the reuse saw them, which is why a lead threshold catches them.
  // guard_lead: the threshold until the guard has learned one (below), or always with
  // guard_risk 0; 0: off. The starting value is chosen for a model whose reuse errs by tenths
  // of a logit, so that the first prompts, before any error has been observed, are safe;
  // `kvboost bench reuse --guard-lead 0` estimates the curve for a model (docs/chunk-reuse.md).
  float guard_lead = 0.3f;
  // Adaptive guard: every prompt the guard recomputed shows how far the approximate lead of its
  // top two tokens was from the full prefill's (the error). Where that error hardly depends on
  // the lead (as measured on Gemma 3 270M, docs/chunk-reuse.md), the close calls the guard
  // recomputes stand for the prompts that pass.
  // Once the engine has seen kGuardMinErrors errors for a repair mode, the threshold is the
  // lead that an error drawn like them exceeds with probability guard_risk (guard_threshold):
  // a prompt passes only if its first token changes with at most that chance. A model whose
  // reuse errs by hundredths of a logit, or only ever shrinks leads, stops paying for near-ties
  // after a few prompts; one that errs by tenths either way recomputes more.
  // 0: the fixed guard_lead.
  float guard_risk = 0.05f;
  bool store = true;            // store computed chunks and blocks for later requests (false:
                                // the request leaves no trace in any cache)
  bool pin = false;             // stored chunks stay in RAM (Engine::warm)
  std::string pin_owner;        // whose pin budget they count against (the server's tenant)
  // Multi-token guard (src/runtime/guard_tokens.cpp): the guard checks the lead of each of the
  // first guard_tokens generated tokens while the prompt's K/V are approximate, not only the
  // first one's. The tokens are decoded on the approximate K/V with their text, logprobs and
  // logits held back from the caller; when one of them is a close call the request escalates as
  // at the first token (the ladder's next rung, else the exact recompute of the approximate
  // span), the held tokens are discarded and decoding starts again on the new K/V. Nothing the
  // caller has seen is ever taken back; the holding counts in ttft_ms (the first token's text
  // reaches the caller when the K tokens have passed). A model that writes a number as a space
  // token then digits decides the answer at the second token, which a first-token guard never
  // sees (docs/measurements/2026-12-01-reuse-quality.md). 1: the first token only.
  int guard_tokens = 1;
};

// The adaptive guard's threshold (ReusePolicy::guard_risk): the lead L that the error of a new
// prompt exceeds with probability `risk` (its first token can change only if the error of its
// top-two lead, approximate minus the full prefill's lead of the same two tokens, exceeds its
// lead). The errors are taken as draws from a normal distribution of unknown mean and spread:
// a new one then follows Student's t with n-1 degrees of freedom around their median, scaled
// by their standard deviation (about the median) times sqrt(1 + 1/n), the prediction interval,
// so a few samples give a wide threshold and a long run a tight one. A model whose reuse only
// shrinks leads (errors consistently negative) gets 0. Returns `fallback` with fewer than
// kGuardMinErrors errors; clamped to [0, kGuardMaxLead].
inline constexpr size_t kGuardMinErrors = 4;
inline constexpr float kGuardMaxLead = 4.0f;
inline constexpr size_t kGuardWindow = 64;  // errors remembered per repair mode
float guard_threshold(std::span<const float> errors, float risk, float fallback);
// The p-quantile of Student's t distribution with nu > 0 degrees of freedom (0 < p < 1).
double student_t_quantile(double p, double nu);

// What the guard has learned, per repair mode (indexed by ReuseMode; prefix-only: a quantized
// store's hits): the last kGuardWindow lead errors, prompts checked and tripped.
struct GuardCalibration {
  std::array<std::vector<float>, 4> errors;
  std::array<int64_t, 4> n_checked{}, n_tripped{};
};

namespace reuse {

// ---- chunk keys ---------------------------------------------------------------------------
// The repair settings that decide which tokens a request recomputes. A chunk computed after
// approximate K/V (a content entry stored past the first content hit) holds bytes that depend
// on them, so such entries are keyed with them too (dirty_content_key): a request finds them
// only under its own settings, and clean content entries (computed in an exact context) under
// any.
std::string repair_tag(const ReusePolicy& p);
uint64_t dirty_content_key(const std::string& model_id, const ReusePolicy& p, std::string_view ns,
                           std::span<const int32_t> tokens);

// ---- the ladder's cost model (rows: one token through every layer) -------------------------
// CacheBlend's cost over an approximate span of `span` positions, n_new of them new and
// n_approx reused (the default settings: the span to the check layer, then the new tokens and
// the budgets).
double blend_cost(int64_t n_layers, int64_t span, int64_t n_new, int64_t n_approx);
// ReuseMode::kAuto's first step: the rung whose expected cost, escalations included, is the
// least. Selective computes sel_rows; the exact recompute computes the span. p_sel, p_blend:
// the chance that each step trips the guard (Guard::trip_rate).
ReuseMode first_rung(int64_t n_layers, int64_t sel_rows, int64_t span, int64_t n_new, int64_t n_approx,
                     double p_sel, double p_blend);
// After selective tripped: the CacheBlend step only when it is worth its cost,
// c_blend + p_blend c_full < c_full; otherwise straight to the exact recompute.
bool blend_step_pays(int64_t n_layers, int64_t span, int64_t n_new, int64_t n_approx, double p_blend);

// ---- the adaptive guard's state --------------------------------------------------------------
// Thread-safe: engines check and learn from several request threads' steps.
class Guard {
 public:
  // The threshold a prompt repaired by `rung` is held to: policy.guard_lead (0: off), or the
  // learned guard_threshold over that rung's errors when policy.guard_risk > 0.
  float threshold(ReuseMode rung, const ReusePolicy& policy) const;
  void record_check(ReuseMode rung, bool tripped);
  // A check recorded as passed whose step tripped later (the multi-token guard: a close call at
  // a later token): counted as tripped now.
  void record_late_trip(ReuseMode rung);
  // How often `rung` has tripped: Laplace's rule, (tripped + 1) / (checked + 2).
  double trip_rate(ReuseMode rung) const;
  // One error sample (approximate lead minus the full prefill's) for a repair (not kAuto:
  // Error); the oldest leaves after kGuardWindow.
  void observe(ReuseMode rung, float error);
  GuardCalibration calibration() const;
  // Persistence (a small text file keyed by the model identity, written to a temporary name and
  // renamed). load throws Error naming the file and the line for a corrupt, truncated or other
  // model's file, and leaves the calibration as it was.
  void save(const std::string& path, const std::string& model_id) const;
  void load(const std::string& path, const std::string& model_id);

 private:
  mutable std::mutex mu_;
  GuardCalibration cal_;
};

// ---- the plan of a prompt ------------------------------------------------------------------
enum class ChunkSrc : uint8_t { kBlockCache, kStorePrefix, kStoreContent, kComputed };
enum PosState : uint8_t { kNew = 0, kExact = 1, kApprox = 2 };

// Rows [from, begin + len) of a stored chunk go to positions begin.., keys re-rotated from the
// chunk's position (chunk->pos0) to `begin`. The engine's runner applies these.
struct CopyIn {
  std::shared_ptr<const kv::Chunk> chunk;
  int64_t begin = 0, from = 0;
};

// One CacheBlend pass over [from, n) (PlannedBlend in the engine).
struct BlendPlan {
  int64_t from = 0;
  std::vector<uint8_t> reused;   // per position from `from` on: 1 = a candidate (reused K/V)
  float ratio = 0;               // share of the remaining candidates to recompute
  float first_ratio = 0;         // ... selected at the check layer (gradual filtering)
  int64_t forced = 0;            // run-start tokens recomputed ahead of the selection
};
// The candidates of a pass over [from, n): approximate positions past the sink tokens; the first
// blend_run_starts tokens of each run in `starts` leave the candidates first, out of the same
// budget (the ratio over the remaining candidates shrinks so that the total stays the same).
BlendPlan plan_blend(const ReusePolicy& p, std::span<const uint8_t> pos_state, int64_t from,
                     std::span<const int64_t> starts);

struct PromptPlan {
  std::vector<kv::ChunkSpan> chunks;
  std::vector<kv::ChunkKeys> chunk_keys;
  std::vector<ChunkSrc> chunk_src;
  std::vector<CopyIn> copy_ins;      // in order; exact prefix hits first
  std::vector<uint8_t> pos_state;    // PosState per position
  std::vector<int64_t> run_starts;   // first positions of runs of approximate reused chunks
  int64_t frontier = 0;              // exact K/V (block cache + lossless prefix hits) end here
  int64_t first_approx = 0;          // n when nothing is approximate
  int64_t exact_limit = INT64_MAX;   // only positions below it may become prefix-cache entries
  int64_t context_limit = INT64_MAX; // chunks below it are stored under prefix keys
  ReuseMode rung = ReuseMode::kPrefixOnly;  // the repair the first pass applies
  std::vector<int32_t> todo;         // positions the first pass computes (empty with a blend)
  bool blend = false;
  BlendPlan blend_plan;
  std::vector<int64_t> probe_rows;   // selective: approximate rows whose reused K/V to keep
  int64_t n_cached = 0, n_reused = 0, n_recomputed = 0, n_new = 0;  // GenerateResult's counts
  int64_t n_remote_chunks = 0;
  double remote_ms = 0;
  std::vector<size_t> remote_ask;    // PromptInput::remote_async: the chunks to look up remotely
  bool approximate() const { return first_approx < int64_t(pos_state.size()); }
};

struct PromptInput {
  std::span<const int32_t> context;
  std::span<const int64_t> segment_starts;
  int64_t n_cached = 0;              // positions the paged block cache holds exactly
  int64_t chunk_size = 128, chunk_window = 16;
  std::function<bool(int64_t)> is_break;  // a natural break before position p (kv::cut_chunks)
  kv::ChunkStore* store = nullptr;   // nullptr: no lookups (chunks are still cut and keyed)
  std::string_view model_id, ns;
  const ReusePolicy* policy = nullptr;
  int64_t n_layers = 1;
  const Guard* guard = nullptr;      // kAuto's first rung (trip rates); nullptr: no history
  // The remote tier (store->has_remote()): looked up first, in one round trip, unless
  // remote_async (then only listed in remote_ask, for the caller to fetch while it prefills) or
  // !remote_lookup (a plan made again once that fetch is in).
  bool remote_lookup = true, remote_async = false;
};
// Cuts the prompt into chunks, keys them, looks them up (exact prefix keys while the chain
// holds, then content keys), and chooses what the first pass computes. Reads the store, writes
// no K/V: the copy-ins are listed for the runner.
PromptPlan plan_prompt(const PromptInput& in);

}  // namespace reuse
}  // namespace kvboost
