// The OpenAI request schema for /v1/completions and /v1/warm (chat: api_chat.cpp; the field
// readers: api_fields.cpp).
#include "api.h"

#include "api_fields.h"

namespace kvboost::server {

using namespace fields;

ParsedRequest parse_completion(const ojson& body, const ApiContext& ctx) {
  ParsedRequest p;
  check_model(body, ctx);
  parse_common(body, ctx, p);
  // logprobs: the sampled token's log-probability plus this many alternatives (OpenAI allows 5;
  // like vLLM we allow up to 20).
  if (auto k = get_int(body, "logprobs", 0, 20)) p.opt.logprobs = int(*k);
  p.echo = get_bool(body, "echo").value_or(false);
  if (p.echo && p.opt.logprobs >= 0)
    bad("'logprobs' with 'echo' (log-probabilities of the prompt) is not supported", "logprobs", "unsupported_parameter");
  // segments (extension): RAG documents tokenized one by one and concatenated before the prompt;
  // their starts become segment boundaries, so each document's K/V is a reusable chunk.
  std::vector<std::string> segments;
  if (const ojson* s = field(body, "segments")) {
    if (!s->is_array()) bad(std::string("'segments' must be a list of strings, got ") + type_name(*s), "segments", "invalid_type");
    for (const auto& x : *s) {
      if (!x.is_string()) bad(std::string("'segments' must be a list of strings, found ") + type_name(x), "segments", "invalid_type");
      if (!x.get<std::string>().empty()) segments.push_back(x.get<std::string>());
    }
  }
  const ojson* prompt = field(body, "prompt");
  std::vector<int32_t> prompt_ids;
  bool prompt_given_as_ids = false;
  if (prompt) {
    if (prompt->is_string()) {
      p.prompt_text = prompt->get<std::string>();
    } else if (prompt->is_array()) {
      if (prompt->empty()) bad("'prompt' is an empty list", "prompt", "empty_prompt");
      const ojson& first = (*prompt)[0];
      if (first.is_string() || first.is_array()) {
        // A prompt list: prompts 2.. go to more_prompt_ids (one choice each, index in order).
        if (prompt->size() > 1) {
          if (!segments.empty()) bad("'segments' cannot be combined with a list of prompts", "segments", "invalid_value");
          if (field(body, "suffix")) bad("'suffix' cannot be combined with a list of prompts", "suffix", "invalid_value");
          if (int64_t(prompt->size()) * p.n > 64)
            bad("'prompt' holds " + std::to_string(prompt->size()) + " prompts and n = " + std::to_string(p.n) +
                    ": at most 64 choices per request",
                "prompt", "invalid_value");
          for (size_t i = 1; i < prompt->size(); ++i) {
            const ojson& x = (*prompt)[i];
            std::vector<int32_t> ids;
            if (x.is_string()) {
              ids = encode(ctx, x.get<std::string>(), true, "prompt");
              p.more_prompt_texts.push_back(x.get<std::string>());
            } else if (x.is_array()) {
              check_token_ids(x, ctx, ids);
              p.more_prompt_texts.push_back(ctx.tok->decode(ids, false));
            } else {
              bad("'prompt' lists must hold strings or token-id lists, found " + std::string(type_name(x)) + " at index " +
                      std::to_string(i),
                  "prompt", "invalid_type");
            }
            p.more_prompt_ids.push_back(std::move(ids));
          }
        }
        if (first.is_string()) {
          p.prompt_text = first.get<std::string>();
        } else {
          check_token_ids(first, ctx, prompt_ids);
          prompt_given_as_ids = true;
        }
      } else {
        check_token_ids(*prompt, ctx, prompt_ids);
        prompt_given_as_ids = true;
      }
    } else {
      bad(std::string("'prompt' must be a string, a list of token ids, or a list of one of those; got ") + type_name(*prompt),
          "prompt", "invalid_type");
    }
  } else if (segments.empty()) {
    bad("'prompt' is required", "prompt", "missing_required_parameter");
  }
  if (prompt_given_as_ids && !segments.empty()) bad("'segments' cannot be combined with a token-id prompt", "segments", "invalid_value");
  const ojson* suffix = field(body, "suffix");
  if (suffix && !suffix->is_string()) bad("'suffix' must be a string", "suffix", "invalid_type");
  if (suffix && !suffix->get<std::string>().empty()) {
    // FIM: prefix-suffix-middle with the model's sentinels (400 naming suffix without them).
    if (!segments.empty()) bad("'suffix' cannot be combined with 'segments'", "suffix", "invalid_value");
    if (prompt_given_as_ids) p.prompt_text = ctx.tok->decode(prompt_ids, false);
    p.prompt_ids = fim_prompt(ctx, p.prompt_text, suffix->get<std::string>());
  } else if (segments.empty()) {
    p.prompt_ids = prompt_given_as_ids ? prompt_ids : encode(ctx, p.prompt_text, true, "prompt");
    if (prompt_given_as_ids) p.prompt_text = ctx.tok->decode(prompt_ids, false);
  } else {
    // The first piece carries BOS (add_special); later pieces are plain text.
    std::string all;
    for (size_t i = 0; i <= segments.size(); ++i) {
      const std::string& text = i < segments.size() ? segments[i] : p.prompt_text;
      if (text.empty()) continue;
      std::vector<int32_t> ids = encode(ctx, text, p.prompt_ids.empty(), i < segments.size() ? "segments" : "prompt");
      if (!p.prompt_ids.empty() && !ids.empty()) p.opt.segment_starts.push_back(int64_t(p.prompt_ids.size()));
      p.prompt_ids.insert(p.prompt_ids.end(), ids.begin(), ids.end());
      all += text;
    }
    p.prompt_text = all;
  }
  set_max_tokens(body, ctx, p, 16, "prompt");  // OpenAI's default for completions
  if (!p.more_prompt_ids.empty()) {  // every prompt of a list is checked; the tightest room wins
    int max_new = p.opt.max_new_tokens;
    for (std::vector<int32_t>& ids : p.more_prompt_ids) {
      std::swap(p.prompt_ids, ids);
      set_max_tokens(body, ctx, p, 16, "prompt");
      std::swap(p.prompt_ids, ids);
      max_new = std::min(max_new, p.opt.max_new_tokens);
    }
    p.opt.max_new_tokens = max_new;
  }
  return p;
}

ParsedRequest parse_warm(const ojson& body, const ApiContext& ctx) {
  // Same prompt forms as completions (prompt and/or segments, or messages); one token is
  // generated, which prefills and caches the prompt's K/V.
  ojson b = body;
  b.erase("max_tokens");
  b.erase("max_completion_tokens");
  b.erase("stream");
  b["max_tokens"] = 1;
  ParsedRequest p = field(body, "messages") ? parse_chat(b, ctx) : parse_completion(b, ctx);
  if (p.n != 1 || p.best_of != 1 || !p.more_prompt_ids.empty())
    bad("/v1/warm takes one prompt and n = best_of = 1", "n", "unsupported_value");
  // As Engine::warm: greedy, one token, the computed chunks pinned in the chunk store's RAM tier.
  p.opt.sampling.temperature = 0.0f;
  p.opt.stop.clear();
  p.opt.ignore_eos = true;
  p.opt.reuse.pin = true;
  return p;
}

}  // namespace kvboost::server
