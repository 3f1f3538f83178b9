// The rest of the OpenAI / vLLM / llama.cpp request surface (issue 22): n and best_of,
// logit_bias, FIM prompts for `suffix`, /tokenize and /detokenize, and /v1/embeddings' refusal.
#include <cmath>
#include <string>

#include "api.h"

namespace kvboost::server {

namespace {

[[noreturn]] void bad(const std::string& msg, const std::string& param, const std::string& code) {
  throw ApiError(400, msg, param, code);
}

const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer field in [lo, hi] (integral floats accepted), or nullopt when absent.
std::optional<int64_t> int_field(const ojson& body, const char* name, int64_t lo, int64_t hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  double d;
  if (v->is_number_integer() || v->is_number_unsigned()) d = v->get<double>();
  else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>())) d = v->get<double>();
  else bad(std::string("'") + name + "' must be an integer, got " + v->dump(), name, "invalid_type");
  if (d < double(lo) || d > double(hi))
    bad(std::string("'") + name + "' = " + v->dump() + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
        name, "invalid_value");
  return int64_t(d);
}

bool bool_field(const ojson& body, const char* name, bool dflt) {
  const ojson* v = field(body, name);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(std::string("'") + name + "' must be a boolean, got " + v->dump(), name, "invalid_type");
  return v->get<bool>();
}

std::vector<int32_t> token_list(const ojson& body, const char* name, const ApiContext& ctx) {
  const ojson* v = field(body, name);
  if (!v) bad(std::string("'") + name + "' is required", name, "missing_required_parameter");
  if (!v->is_array()) bad(std::string("'") + name + "' must be a list of token ids", name, "invalid_type");
  std::vector<int32_t> ids;
  for (const auto& x : *v) {
    if (!x.is_number_integer() && !x.is_number_unsigned())
      bad(std::string("'") + name + "' token ids must be integers, found " + x.dump(), name, "invalid_type");
    const double id = x.get<double>();
    if (id < 0 || id >= ctx.vocab_size)
      bad(std::string("'") + name + "' token id " + x.dump() + " is outside the vocabulary [0, " + std::to_string(ctx.vocab_size) + ")",
          name, "invalid_value");
    ids.push_back(int32_t(id));
  }
  return ids;
}

}  // namespace

constexpr int64_t kMaxChoices = 64;  // n (times the prompts of a list) per request

void parse_n_and_bias(const ojson& body, const ApiContext& ctx, ParsedRequest& p) {
  const auto n = int_field(body, "n", 1, kMaxChoices);
  const auto best_of = int_field(body, "best_of", 1, kMaxChoices);
  p.n = int(n.value_or(1));
  p.best_of = int(best_of.value_or(p.n));
  if (p.best_of < p.n)
    bad("'best_of' = " + std::to_string(p.best_of) + " must be at least 'n' (" + std::to_string(p.n) +
            "): best_of candidates are generated and the n with the highest log-probability returned",
        "best_of", "invalid_value");
  // As OpenAI: the best candidates are known only when all have finished.
  if (p.best_of > p.n && bool_field(body, "stream", false))
    bad("'best_of' > 'n' cannot be streamed (the best candidates are known only at the end); use best_of = n or "
        "stream: false",
        "best_of", "invalid_value");
  if (const ojson* lb = field(body, "logit_bias")) {
    if (!lb->is_object())
      bad("'logit_bias' must be an object mapping token ids (strings) to a bias in [-100, 100]", "logit_bias", "invalid_type");
    if (lb->size() > 1024) bad("'logit_bias' has " + std::to_string(lb->size()) + " entries; at most 1024", "logit_bias", "invalid_value");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (k.empty() || used != k.size() || id < 0 || id >= ctx.vocab_size)
        bad("'logit_bias' key '" + k + "' is not a token id of this model's vocabulary [0, " + std::to_string(ctx.vocab_size) + ")",
            "logit_bias", "invalid_value");
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100 || it->get<double>() > 100)
        bad("'logit_bias' value for token " + k + " must be a number in [-100, 100], got " + it->dump(), "logit_bias",
            "invalid_value");
      p.opt.sampling.logit_bias.emplace_back(int32_t(id), float(it->get<double>()));
    }
  }
}

std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok) {
  FimTokens f;
  auto get = [&](const char* a, const char* b, const char* c) {
    const auto x = tok.token_to_id(a), y = tok.token_to_id(b), z = tok.token_to_id(c);
    if (!x || !y || !z) return false;
    f.prefix = *x, f.suffix = *y, f.middle = *z;
    return true;
  };
  if (get("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")) return f;   // Qwen2.5-Coder, StarCoder2-style
  if (get("<fim_prefix>", "<fim_suffix>", "<fim_middle>")) return f;         // StarCoder / SantaCoder
  if (get("▁<PRE>", "▁<SUF>", "▁<MID>") || get("<PRE>", "<SUF>", "<MID>")) {  // CodeLlama
    f.codellama = true;
    return f;
  }
  return std::nullopt;
}

std::vector<int32_t> fim_prompt(const ApiContext& ctx, const std::string& prefix, const std::string& suffix) {
  const std::optional<FimTokens> f = find_fim_tokens(*ctx.tok);
  if (!f)
    bad("'suffix' (fill-in-the-middle) needs a model with FIM tokens (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or "
        "CodeLlama's <PRE> <SUF> <MID>); model '" + ctx.model_name + "' has none in its vocabulary",
        "suffix", "unsupported_parameter");
  auto enc = [&](const std::string& s) {
    try {
      return ctx.tok->encode(s, false);
    } catch (const Error& e) {
      bad(std::string("'suffix' / 'prompt': ") + e.what(), "suffix", "invalid_text");
    }
  };
  // Prefix-suffix-middle: [BOS] PRE prefix SUF suffix MID; the model writes the middle. CodeLlama
  // puts BOS first (encode("") with specials gives it, or nothing) and a space before each part.
  std::vector<int32_t> ids;
  if (f->codellama) ids = ctx.tok->encode("", true);
  ids.push_back(f->prefix);
  for (int32_t t : enc(f->codellama ? " " + prefix : prefix)) ids.push_back(t);
  ids.push_back(f->suffix);
  for (int32_t t : enc(f->codellama ? " " + suffix : suffix)) ids.push_back(t);
  ids.push_back(f->middle);
  return ids;
}

ojson tokenize_json(const ojson& body, const ApiContext& ctx) {
  // llama.cpp sends `content` (add_special default false); vLLM `prompt` (add_special_tokens
  // default true). vLLM's chat form (`messages`) is not supported.
  if (field(body, "messages"))
    bad("'messages' (tokenizing a chat) is not supported by /tokenize; render the prompt and send 'prompt'", "messages",
        "unsupported_parameter");
  const ojson* content = field(body, "content");
  const char* name = content ? "content" : "prompt";
  const ojson* text = content ? content : field(body, "prompt");
  if (!text) bad("'content' (llama.cpp) or 'prompt' (vLLM) is required", "prompt", "missing_required_parameter");
  if (!text->is_string()) bad(std::string("'") + name + "' must be a string", name, "invalid_type");
  const bool add_special = content ? bool_field(body, "add_special", false) : bool_field(body, "add_special_tokens", true);
  const bool pieces = bool_field(body, "with_pieces", false), strs = bool_field(body, "return_token_strs", false);
  std::vector<int32_t> ids;
  try {
    ids = ctx.tok->encode(text->get<std::string>(), add_special);
  } catch (const Error& e) {
    bad(std::string("'") + name + "': " + e.what(), name, "invalid_text");
  }
  ojson o;
  ojson toks = ojson::array();
  for (int32_t id : ids) {
    if (pieces) toks.push_back(ojson{{"id", id}, {"piece", ctx.tok->id_to_token(id)}});
    else toks.push_back(id);
  }
  o["tokens"] = toks;
  o["count"] = ids.size();
  o["max_model_len"] = ctx.context_length;
  if (strs) {
    ojson s = ojson::array();
    for (int32_t id : ids) s.push_back(ctx.tok->id_to_token(id));
    o["token_strs"] = s;
  }
  return ojson::parse(o.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

ojson detokenize_json(const ojson& body, const ApiContext& ctx) {
  const std::vector<int32_t> ids = token_list(body, "tokens", ctx);
  const std::string text = ctx.tok->decode(ids, false);
  ojson o;
  o["content"] = text;  // llama.cpp
  o["prompt"] = text;   // vLLM
  return ojson::parse(o.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

ApiError embeddings_error() {
  return ApiError(501,
                  "/v1/embeddings is not implemented: KVBoost serves causal language models for generation, and a "
                  "causal LM's pooled hidden state is not a trained embedding; serve an embedding model elsewhere",
                  "", "not_implemented", "invalid_request_error");
}

}  // namespace kvboost::server
