// Engine: prefill the whole prompt in one batched forward pass, then decode one token at a
// time over the KV cache, streaming text that is final (whole UTF-8 characters, never the
// start of a stop string).
#include <algorithm>

#include "kvboost/runtime.h"

namespace kvboost {

Engine::Engine(std::unique_ptr<Model> m, Tokenizer t) : model_(std::move(m)), tok_(std::move(t)) {}

std::unique_ptr<Engine> Engine::load(const std::string& dir, const LoadOptions& opt) {
  Tokenizer tok = Tokenizer::from_dir(dir);
  auto model = Model::load(dir, opt);
  if (tok.vocab_size() > model->config().vocab_size)
    fail(dir, ": tokenizer.json has ", tok.vocab_size(), " tokens but config.json vocab_size is ",
         model->config().vocab_size);
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tok)));
}

int64_t Engine::context_length() const { return model_->config().max_position_embeddings; }

GenerateResult Engine::generate(std::string_view prompt, const GenerateOptions& opt) const {
  return generate_ids(tok_.encode(prompt, opt.add_special), opt);
}

GenerateResult Engine::generate_ids(const std::vector<int32_t>& ids, const GenerateOptions& opt) const {
  const ModelConfig& cfg = model_->config();
  if (ids.empty()) fail("the prompt is empty (no tokens)");
  if (opt.max_new_tokens < 0) fail("max_new_tokens = ", opt.max_new_tokens, " must be >= 0");
  const int64_t ctx = context_length();
  if (int64_t(ids.size()) >= ctx)
    fail("the prompt has ", ids.size(), " tokens but the model's context is ", ctx,
         " (max_position_embeddings): no room to generate");
  Sampler sampler(resolve_sampling(opt.sampling, cfg.generation));
  std::vector<int32_t> eos = cfg.eos_token_ids;
  if (eos.empty() && tok_.eos_id()) eos.push_back(*tok_.eos_id());

  GenerateResult r;
  r.prompt_ids = ids;
  r.finish_reason = "length";
  if (opt.max_new_tokens == 0) return r;
  KvCache kv(cfg, std::min<int64_t>(ctx, int64_t(ids.size()) + opt.max_new_tokens));
  std::vector<float> logits(size_t(cfg.vocab_size));
  StreamDecoder dec(tok_, /*skip_special=*/true);
  StopMatcher stop(opt.stop);
  std::vector<int32_t> history = ids;

  const double t0 = now_ms();
  model_->forward(ids.data(), int64_t(ids.size()), kv, logits.data());
  r.prefill_ms = now_ms() - t0;
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
    model_->forward(&tok, 1, kv, logits.data());
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
