// Engine: continuous batching over paged KV memory. Requests are queued by submit(); each step()
// is plan -> run -> process: the scheduler (scheduler.cpp) admits what fits and plans the step
// as data (StepPlan), the model runner (runner.cpp) executes its passes, the output stage
// (output.cpp) samples and streams. One step runs one forward pass holding a decode token of
// every decoding request and a bounded chunk of prompt tokens of prefilling ones (so a long
// prompt never stalls running decodes), samples, and streams text that is final (whole UTF-8 characters, never the start of a
// stop string). KV exhaustion preempts the newest request; it resumes by recomputation, which the
// prefix cache makes cheap.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "engine_impl.h"
#include "request.h"
#include "runner.h"
#include "scheduler.h"

namespace kvboost {

// ---- Request -----------------------------------------------------------------------------------

Request::Request(std::unique_ptr<State> s) : st_(std::move(s)) {}
Request::~Request() = default;
bool Request::done() const { return st_->done_flag.load(); }
void Request::cancel() { st_->cancel_flag.store(true); }
GenerateResult Request::result() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->res;
}

// ---- Engine ------------------------------------------------------------------------------------

Engine::Impl::Impl(std::unique_ptr<Model> m, Tokenizer t, const EngineOptions& opt)
    : model_(std::move(m)), tok_(std::move(t)), opt_(opt), block_size_(opt.block_size) {
  const ModelConfig& c = model_->config();
  if (block_size_ <= 0) fail("block size ", block_size_, " must be positive");
  if (opt_.max_batch < 1) fail("max_batch ", opt_.max_batch, " must be at least 1");
  if (opt_.prefill_chunk < 1) fail("prefill_chunk ", opt_.prefill_chunk, " must be at least 1");
  size_t budget = opt.kv_budget_bytes;
  if (budget == 0) {
    const size_t per_token = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
    budget = std::min<size_t>(per_token * size_t(c.max_position_embeddings + block_size_), size_t(2) << 30);
  }
  const int64_t n_blocks = kv::BlockPool::blocks_for_budget(budget, block_size_, c.n_layers, c.n_kv_heads, c.head_dim);
  if (n_blocks < 1) fail("KV budget of ", budget, " bytes holds no block of ", block_size_, " tokens");
  kv_ = std::make_unique<kv::KvCacheManager>(n_blocks, block_size_);
  // Under tensor parallelism this store is rank 0's K/V heads (the budget is the ranks' total).
  const int64_t store_heads = opt_.tp > 1 ? tp_plan(c, 0, opt_.tp).config.n_kv_heads : c.n_kv_heads;
  store_ = std::make_unique<kv::PagedKvStorage>(n_blocks, block_size_, c.n_layers, store_heads, c.head_dim);
  // A CUDA device: the weights go to the device and its pools take the store's shape (the host
  // store stays the kv manager's bookkeeping twin; its lazily committed pages are never touched).
  runner_ = std::make_unique<ModelRunner>(*model_, *kv_, *store_, !opt.cold_dir.empty(), opt_.load.device,
                                          opt_.prefill_chunk + opt_.max_batch, opt_.load.vram_budget, opt_.tp);
  if (!opt.cold_dir.empty()) {  // the store's blocks, or under TP every rank's parts of a block together
    kv::HotTier& hot = runner_->hot_tier();
    cold_ = std::make_unique<kv::FileColdStore>(opt.cold_dir, hot.block_bytes());
    kv_->attach_cold_tier(&hot, cold_.get());
  }
  // On a device the cold tier moves the device pools' blocks: pinned host slots before the files.
  if (cold_ && runner_->on_device()) runner_->attach_device_cold_tier(cold_.get(), opt_.cold_host_bytes);
  // Model identity for chunk keys (model_identity, src/model/identity.cpp): a content hash of
  // the weights, architecture, vocabulary and the store's K/V encoding; stored chunks of one
  // model are never used by another. With a disk tier, per-file hashes are remembered beside it.
  model_id_ = opt_.chunk_store.model_id;
  if (model_id_.empty()) {
    const kv::ChunkStoreOptions& cs = opt_.shared_chunk_store ? opt_.shared_chunk_store->options() : opt_.chunk_store;
    if (!cs.disk_dir.empty()) ::mkdir(cs.disk_dir.c_str(), 0755);  // (the store would create it next)
    const std::string cache = cs.disk_dir.empty() ? "" : path_join(cs.disk_dir, "model-identity.cache");
    model_id_ = model_identity(*model_, tok_, kv::kv_quant_name(cs.quant), cache);
    opt_.chunk_store.model_id = model_id_;
  }
  {  // the adaptive guard's calibration, beside the chunk store (guard_file.cpp)
    const std::string& disk = opt_.shared_chunk_store ? opt_.shared_chunk_store->options().disk_dir : opt_.chunk_store.disk_dir;
    guard_file_ = !opt_.guard_file.empty() ? opt_.guard_file : disk.empty() ? "" : path_join(disk, "guard-" + model_id_ + ".txt");
    if (!guard_file_.empty() && file_exists(guard_file_)) {
      try {
        load_guard_calibration(guard_file_);
      } catch (const Error& e) {
        std::fprintf(stderr, "kvboost: warning: %s; ignored (the guard relearns)\n", e.what());
      }
    }
  }
  if (opt_.chunk_size < 1) fail("chunk size ", opt_.chunk_size, " must be positive");
  const kv::ChunkShape shape{c.n_layers, c.n_kv_heads, c.head_dim};
  if (opt_.shared_chunk_store) {
    const kv::ChunkShape& s = opt_.shared_chunk_store->shape();
    if (s.n_layers != shape.n_layers || s.n_kv_heads != shape.n_kv_heads || s.head_dim != shape.head_dim)
      fail("shared_chunk_store holds chunks of ", s.n_layers, " layers x ", s.n_kv_heads, " x ", s.head_dim,
           " but the model's K/V are ", shape.n_layers, " x ", shape.n_kv_heads, " x ", shape.head_dim);
    chunks_ = opt_.shared_chunk_store;
  } else if (opt_.chunk_store.ram_bytes > 0) {
    chunks_ = std::make_shared<kv::ChunkStore>(shape, opt_.chunk_store);
  }
}

Engine::Impl::~Impl() = default;

std::unique_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opt) {
  // The device before any file is read: first the options the device runner does not support
  // yet (a conflict of options, the same answer on every machine), then whether the device is
  // usable here (kernels::require_device: built without CUDA, no device, an index past the count).
  const kernels::Device& dev = opt.load.device;
  if (dev.is_cpu() && opt.load.vram_budget > 0)
    fail("vram_budget (--vram-budget) ", opt.load.vram_budget, " bytes is for a CUDA device (--device cuda); on the "
         "CPU, layer streaming is weight_budget (--weight-budget)");
  if (!dev.is_cpu()) {
    if (opt.load.weight_budget > 0)
      fail("device ", dev.name(), ": layer streaming from disk (weight_budget, --weight-budget) is CPU-only; on a "
           "CUDA device, layers stream from pinned host memory under vram_budget (--vram-budget)");
  }
  if (opt.tp < 1 || opt.tp > 64) fail("tp (--tp) ", opt.tp, ": tensor parallelism needs 1 .. 64 ranks");
  if (opt.tp > 1) {
    if (opt.load.vram_budget > 0)
      fail("tensor parallelism (tp ", opt.tp, ") with layer streaming on a device (vram_budget, --vram-budget) is not "
           "supported");
    if (!opt.cold_dir.empty() && !dev.is_cpu())
      fail("tensor parallelism (tp ", opt.tp, ") over CUDA devices with a cold tier (cold_dir, --kv-cold-dir) is not "
           "supported: each device's pools would need a spill chain of their own");
  }
  kernels::require_device(dev, "device");
  // A GGUF model: tokenizer files beside the .gguf win; without them, the tokenizer stored in it.
  const std::string gguf = gguf_model_file(dir);
  std::string tok_dir = dir;
  if (!gguf.empty()) {
    const size_t slash = gguf.find_last_of('/');
    tok_dir = slash == std::string::npos ? "." : gguf.substr(0, slash);
  }
  if (opt.tp > 1) {
    // The split before anything large is read (a model's own load errors come from Model::load).
    std::optional<ModelConfig> cfg;
    try {
      cfg = gguf.empty() ? ModelConfig::from_dir(dir) : ModelConfig::from_gguf(gguf);
    } catch (const Error&) {
    }
    if (cfg) {
      try {
        tp_plan(*cfg, 0, opt.tp);
      } catch (const Error& e) {
        fail(dir, ": ", e.what());
      }
    }
  }
  Tokenizer tok = [&] {
    if (gguf.empty() || file_exists(path_join(tok_dir, "tokenizer.json"))) return Tokenizer::from_dir(tok_dir);
    const GgufTokenizerFiles t = gguf_tokenizer_files(gguf);
    return Tokenizer::from_json(t.tokenizer_json, t.tokenizer_config_json, gguf + " (tokenizer.ggml.*)");
  }();
  // On a device the host model keeps its config, tokenizer checks, RoPE tables and identity;
  // its weights are not packed or prefaulted (the device runner reads them from the files).
  LoadOptions host = opt.load;
  if (!dev.is_cpu()) host.device = {}, host.pack_weights = false, host.prefault = false;
  if (opt.tp > 1) host.pack_weights = false;  // the shards slice the file layout (TpShard)
  auto model = Model::load(dir, host);
  if (opt.tp > 1) {  // tp_plan's Errors (heads that do not split, an architecture without TP), naming the model
    try {
      tp_plan(model->config(), 0, opt.tp);
    } catch (const Error& e) {
      fail(dir, ": ", e.what());
    }
  }
  if (tok.vocab_size() > model->config().vocab_size)
    fail(dir, ": tokenizer.json has ", tok.vocab_size(), " tokens but config.json vocab_size is ",
         model->config().vocab_size);
  auto impl = std::make_unique<Impl>(std::move(model), std::move(tok), opt);
  if (!opt.spec.draft_model.empty()) impl->draft_ = load_draft_model(opt.spec.draft_model, *impl->model_, impl->tok_, opt);
  else if (opt.spec.mode == SpecMode::kDraft) fail("speculative mode \"draft\" needs a draft model (--draft-model DIR)");
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

int64_t Engine::Impl::context_length() const { return model_->config().max_position_embeddings; }

kv::KvStats Engine::Impl::kv_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_->stats();
}

int64_t Engine::Impl::device_passes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runner_ ? runner_->device_passes() : 0;
}

bool Engine::Impl::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiting_.empty() || !running_.empty();
}

bool Engine::Impl::idle_work() {
  // On a device the host pools are never written: nothing to prefault.
  if (opt_.kv_prefault_tokens <= 0 || !opt_.cold_dir.empty() || prefault_failed_ || runner_->on_device()) return false;
  int64_t first, n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t want = std::min(store_->n_blocks(), kv_->pool().high_water() + (opt_.kv_prefault_tokens + block_size_ - 1) / block_size_);
    first = std::max(prefaulted_, kv_->pool().high_water());
    // A slice of about 8 MiB: a request that arrives meanwhile waits at most that long.
    n = std::min<int64_t>(want - first, std::max<int64_t>(1, int64_t((size_t(8) << 20) / store_->block_bytes())));
  }
  if (n <= 0) return false;
  // Blocks at or above high_water were never handed out, so nothing reads or writes them now;
  // a block handed out meanwhile is only populated, never changed.
  if (!store_->prefault(kv::BlockId(first), n)) {
    prefault_failed_ = true;
    return false;
  }
  prefaulted_ = first + n;
  return true;
}

GenerateResult Engine::Impl::generate(std::string_view prompt, const GenerateOptions& opt) {
  return generate_ids(tok_.encode(prompt, opt.add_special), opt);
}

GenerateResult Engine::Impl::generate_ids(const std::vector<int32_t>& ids, const GenerateOptions& opt) {
  std::shared_ptr<Request> req = submit(ids, opt);
  while (!req->done()) step();
  GenerateResult r = req->result();
  if (r.finish_reason == "error") fail(r.error);
  return r;
}

std::shared_ptr<Request> Engine::Impl::submit(std::vector<int32_t> ids, GenerateOptions opt) {
  if (ids.empty()) fail("the prompt is empty (no tokens)");
  if (opt.max_new_tokens < 0) fail("max_new_tokens = ", opt.max_new_tokens, " must be >= 0");
  const int64_t ctx = context_length();
  if (int64_t(ids.size()) >= ctx)
    fail("the prompt has ", ids.size(), " tokens but the model's context is ", ctx,
         " (max_position_embeddings): no room to generate");
  const ModelConfig& cfg = model_->config();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
      fail("prompt token ", i, " has id ", ids[i], ", outside the vocabulary [0, ", cfg.vocab_size, ")");
  for (size_t i = 0; i < opt.segment_starts.size(); ++i) {
    const int64_t s = opt.segment_starts[i];
    if (s <= 0 || s >= int64_t(ids.size()) || (i > 0 && s <= opt.segment_starts[i - 1]))
      fail("segment start ", s, " (index ", i, ") must be increasing and inside (0, ", ids.size(), ")");
  }
  if (opt.logprobs < -1 || opt.logprobs > 20) fail("logprobs = ", opt.logprobs, " is out of range (-1 = off, or 0..20)");
  const SamplingParams sc = resolve_sampling(opt.sampling, cfg.generation);
  validate_sampling(sc);
  auto st = std::make_unique<Request::State>(std::move(ids), std::move(opt), sc, tok_);
  Request::State& r = *st;
  r.eos = cfg.eos_token_ids;
  if (r.eos.empty() && tok_.eos_id()) r.eos.push_back(*tok_.eos_id());
  r.res.prompt_ids = r.prompt;
  r.res.finish_reason = "length";
  r.history = r.prompt;
  r.context = r.prompt;
  r.logits.resize(size_t(cfg.vocab_size));
  spec_setup(r);  // speculative decoding: may enlarge logits to [1 + k, vocab]
  // Without prefix caching no block is ever registered under this namespace, so nothing is hit.
  r.ns = r.opt.prefix_cache ? "u:" + r.opt.cache_namespace : std::string("\x01uncached");
  r.t_submit = now_ms();
  auto req = std::make_shared<Request>(std::move(st));
  std::lock_guard<std::mutex> lock(mu_);
  if (r.opt.max_new_tokens == 0) {
    r.phase = Request::State::Phase::kDone;
    r.done_flag = true;
    return req;
  }
  waiting_.push_back(req);
  return req;
}

KvView Engine::Impl::view_of(Request::State& r, int64_t n_past) { return runner_->view(r.seq, n_past); }

StepStats Engine::Impl::step() {
  std::lock_guard<std::mutex> lock(mu_);
  StepPlan plan = schedule();
  return execute(plan);
}

StepStats Engine::Impl::execute(StepPlan& plan) {
  using Phase = Request::State::Phase;
  StepStats ss;
  ss.n_decode = plan.n_decode;
  ss.n_prefill_tokens = plan.n_prefill_tokens;
  ss.n_drafted = plan.n_drafted;
  // The batched pass, then the output stage over its rows in order.
  bool ran = true;
  try {
    if (!plan.batch.empty()) {
      ss.forward_ms += runner_->run_batch(plan.batch);
      if (plan.blends.empty()) spec_observe(ss);
    }
  } catch (const std::exception& e) {
    for (const PlannedRows& b : plan.batch) fail_request(*b.req, e.what());
    ran = false;
  }
  for (size_t i = 0; ran && i < plan.batch.size(); ++i) {
    Request::State& r = *plan.batch[i].req;
    if (r.phase == Phase::kPrefill) {
      r.todo_next += plan.batch[i].tokens.size();
      if (r.todo_next < r.todo.size() || guard_trips(r)) continue;
      r.history = r.context;  // (a resumed request's context is its history)
      if (r.res.output_ids.empty() && !r.hold.active) store_chunks(r);
    } else if (spec_accept(r)) {  // speculation: the drafts verified (decode)
      continue;
    } else if (guard_hold_trips(r)) {  // a held token was a close call: escalated (guard_tokens.cpp)
      continue;
    }
    after_logits(r, r.logits.data());
  }
  // Each CacheBlend repair: its pass, then the guard, the chunk store and the output stage.
  for (const PlannedBlend& pb : plan.blends) {
    Request::State* r = pb.req;
    try {
      double ms = 0;
      const BlendStats bs = runner_->run_blend(pb, &ms);
      ss.forward_ms += ms;
      ss.n_prefill_tokens += pb.n;
      {
        std::lock_guard<std::mutex> l(r->mu);
        r->res.n_recomputed = bs.n_selected + r->blend_forced;
      }
      r->blend_rows = bs.n_rows_late;
      if (guard_trips(*r)) continue;
      r->history = r->context;
      if (!r->hold.active) store_chunks(*r);
      after_logits(*r, r->logits.data());
    } catch (const std::exception& e) {
      fail_request(*r, e.what());
    }
  }
  auto st = [](const std::shared_ptr<Request>& q) -> Request::State& { return q->state(); };
  std::erase_if(running_, [&](const auto& q) { return st(q).phase == Phase::kDone; });
  ss.n_running = int64_t(running_.size());
  ss.n_waiting = int64_t(waiting_.size());
  return ss;
}

}  // namespace kvboost
