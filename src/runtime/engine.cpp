// Engine: paged KV memory with automatic prefix caching; prefill the uncached part of the prompt
// in one batched forward pass, then decode one token at a time, streaming text that is final
// (whole UTF-8 characters, never the start of a stop string).
#include <algorithm>

#include "kvboost/runtime.h"

namespace kvboost {

Engine::Engine(std::unique_ptr<Model> m, Tokenizer t, const EngineOptions& opt)
    : model_(std::move(m)), tok_(std::move(t)), block_size_(opt.block_size) {
  const ModelConfig& c = model_->config();
  if (block_size_ <= 0) fail("block size ", block_size_, " must be positive");
  size_t budget = opt.kv_budget_bytes;
  if (budget == 0) {
    const size_t per_token = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
    budget = std::min<size_t>(per_token * size_t(c.max_position_embeddings + block_size_), size_t(2) << 30);
  }
  const int64_t n_blocks = kv::BlockPool::blocks_for_budget(budget, block_size_, c.n_layers, c.n_kv_heads, c.head_dim);
  if (n_blocks < 1) fail("KV budget of ", budget, " bytes holds no block of ", block_size_, " tokens");
  kv_ = std::make_unique<kv::KvCacheManager>(n_blocks, block_size_);
  store_ = std::make_unique<kv::PagedKvStorage>(n_blocks, block_size_, c.n_layers, c.n_kv_heads, c.head_dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    k_pools_.push_back(store_->k_pool(l));
    v_pools_.push_back(store_->v_pool(l));
  }
  if (!opt.cold_dir.empty()) {
    cold_ = std::make_unique<kv::FileColdStore>(opt.cold_dir, store_->block_bytes());
    kv_->attach_cold_tier(store_.get(), cold_.get());
  }
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opt) {
  // A .gguf file path: its tokenizer files are read from the directory that holds it.
  std::string tok_dir = dir;
  if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0 && file_exists(dir)) {
    const size_t slash = dir.find_last_of('/');
    tok_dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  Tokenizer tok = Tokenizer::from_dir(tok_dir);
  auto model = Model::load(dir, opt.load);
  if (tok.vocab_size() > model->config().vocab_size)
    fail(dir, ": tokenizer.json has ", tok.vocab_size(), " tokens but config.json vocab_size is ",
         model->config().vocab_size);
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tok), opt));
}

int64_t Engine::context_length() const { return model_->config().max_position_embeddings; }

kv::KvStats Engine::kv_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_->stats();
}

GenerateResult Engine::generate(std::string_view prompt, const GenerateOptions& opt) {
  return generate_ids(tok_.encode(prompt, opt.add_special), opt);
}

GenerateResult Engine::generate_ids(const std::vector<int32_t>& ids, const GenerateOptions& opt) {
  if (ids.empty()) fail("the prompt is empty (no tokens)");
  if (opt.max_new_tokens < 0) fail("max_new_tokens = ", opt.max_new_tokens, " must be >= 0");
  const int64_t ctx = context_length();
  if (int64_t(ids.size()) >= ctx)
    fail("the prompt has ", ids.size(), " tokens but the model's context is ", ctx,
         " (max_position_embeddings): no room to generate");
  std::lock_guard<std::mutex> lock(mu_);
  const kv::SeqId seq = next_seq_++;
  // The sequence's blocks go back to the pool (staying cached) however the request ends.
  struct Release {
    kv::KvCacheManager* kv;
    kv::SeqId seq;
    ~Release() {
      if (kv->has_seq(seq)) kv->free(seq);
    }
  } release{kv_.get(), seq};
  return run(ids, opt, seq);
}

GenerateResult Engine::run(const std::vector<int32_t>& ids, const GenerateOptions& opt, kv::SeqId seq) {
  const ModelConfig& cfg = model_->config();
  const int64_t ctx = context_length();
  Sampler sampler(resolve_sampling(opt.sampling, cfg.generation));
  std::vector<int32_t> eos = cfg.eos_token_ids;
  if (eos.empty() && tok_.eos_id()) eos.push_back(*tok_.eos_id());

  GenerateResult r;
  r.prompt_ids = ids;
  r.finish_reason = "length";
  if (opt.max_new_tokens == 0) return r;

  // Without prefix caching no block is ever registered under this namespace, so nothing is hit.
  const std::string ns = opt.prefix_cache ? "u:" + opt.cache_namespace : std::string("\x01uncached");
  const double t0 = now_ms();
  auto alloc = kv_->allocate_for_prompt(seq, ids, ns);
  if (!alloc)
    fail("KV memory exhausted: the prompt needs ", (ids.size() + block_size_ - 1) / block_size_, " blocks of ",
         block_size_, " tokens but the pool has ", kv_->stats().blocks_free, " free (raise the KV budget)");
  for (const auto& c : alloc->copies) store_->copy_block(c.src, c.dst);
  r.n_cached = alloc->n_cached;
  auto view = [&](int64_t n_past) {
    KvView v;
    v.k_pools = k_pools_.data();
    v.v_pools = v_pools_.data();
    v.block_table = kv_->block_table(seq).data();
    v.block_size = block_size_;
    v.n_past = n_past;
    if (cold_) {
      // Half the hot pool per attention range leaves room for the blocks being written.
      v.range_blocks = std::max<int64_t>(1, store_->n_blocks() / 2);
      v.page_in = [this, seq](int64_t first, int64_t n) {
        if (!kv_->ensure_resident(seq, first, n))
          fail("KV memory exhausted: cannot page in ", n, " blocks (hot pool of ", store_->n_blocks(), " blocks)");
        return kv_->block_table(seq).data();
      };
    }
    return v;
  };
  std::vector<float> logits(size_t(cfg.vocab_size));
  model_->forward(ids.data() + r.n_cached, int64_t(ids.size()) - r.n_cached, view(r.n_cached), logits.data());
  if (opt.prefix_cache) kv_->commit_full_blocks(seq, ids);
  r.prefill_ms = now_ms() - t0;

  StreamDecoder dec(tok_, /*skip_special=*/true);
  StopMatcher stop(opt.stop);
  std::vector<int32_t> history = ids;
  double t_first = 0;
  bool cancelled = false;
  auto emit = [&](const std::string& s) {
    if (s.empty() || cancelled) return;
    r.text += s;
    if (opt.on_text && !opt.on_text(s)) cancelled = true;
  };
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t tok = sampler.sample(logits.data(), cfg.vocab_size, history);
    if (i == 0) {
      t_first = now_ms();
      r.ttft_ms = t_first - t0;
    }
    r.output_ids.push_back(tok);
    history.push_back(tok);
    if (!opt.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      r.finish_reason = "stop";
      break;
    }
    emit(stop.push(dec.push(tok)));
    if (stop.stopped()) {
      r.finish_reason = "stop";
      break;
    }
    if (cancelled) {
      r.finish_reason = "cancelled";
      break;
    }
    // prompt + output never exceed the context (max_position_embeddings)
    if (i + 1 == opt.max_new_tokens || int64_t(history.size()) >= ctx) break;
    auto slot = kv_->append_slot(seq);
    if (!slot)
      fail("KV memory exhausted after ", history.size() - 1, " tokens (raise the KV budget)");
    if (slot->copy) store_->copy_block(slot->copy->src, slot->copy->dst);
    model_->forward(&tok, 1, view(int64_t(history.size()) - 1), logits.data());
    if (opt.prefix_cache) kv_->commit_full_blocks(seq, history);
  }
  if (!stop.stopped() && !cancelled) {
    emit(stop.push(dec.finish()));
    if (stop.stopped()) r.finish_reason = "stop";
    emit(stop.flush());
  }
  r.decode_ms = r.output_ids.empty() ? 0 : now_ms() - t_first;
  return r;
}

}  // namespace kvboost
