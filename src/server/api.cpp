// The OpenAI request schema: every field is type- and range-checked here, so that a bad request
// is a 4xx naming the parameter (OpenAI's `param`) and never reaches the engine.
#include "api.h"

#include <chrono>
#include <cmath>
#include <random>
#include <sstream>

#include "kvboost/chat.h"

namespace kvboost::server {

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)),
      code(std::move(code_)) {
  if (type.empty()) {
    switch (status) {
      case 401: type = "authentication_error"; break;
      case 404: type = "not_found_error"; break;
      case 413: type = "invalid_request_error"; break;
      case 503: type = "server_overloaded"; break;
      case 504: type = "timeout_error"; break;
      default: type = status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
}

std::string error_body(const ApiError& e) {
  ojson err;
  err["message"] = e.what();
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  err["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  ojson o;
  o["error"] = err;
  // Messages may quote client bytes: never fail on them.
  return o.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& msg, const std::string& param = "", const std::string& code = "") {
  throw ApiError(400, msg, param, code);
}

const char* type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

// A present, non-null field.
const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const ojson& body, const char* name, double lo, double hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(std::string("'") + name + "' must be a number, got " + type_name(*v), name, "invalid_type");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    std::ostringstream m;
    m << "'" << name << "' = " << v->dump() << " is out of range [" << lo << ", " << hi << "]";
    bad(m.str(), name, "invalid_value");
  }
  return d;
}

std::optional<int64_t> get_int(const ojson& body, const char* name, int64_t lo, int64_t hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  int64_t x;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    x = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
             std::fabs(v->get<double>()) < 9e18) {
    x = int64_t(v->get<double>());
  } else {
    bad(std::string("'") + name + "' must be an integer, got " + type_name(*v) + " " + v->dump(), name, "invalid_type");
  }
  if (x < lo || x > hi)
    bad(std::string("'") + name + "' = " + v->dump() + " is out of range [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]",
        name, "invalid_value");
  return x;
}

std::optional<bool> get_bool(const ojson& body, const char* name) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(std::string("'") + name + "' must be a boolean, got " + type_name(*v), name, "invalid_type");
  return v->get<bool>();
}

std::optional<std::string> get_string(const ojson& body, const char* name) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(std::string("'") + name + "' must be a string, got " + type_name(*v), name, "invalid_type");
  return v->get<std::string>();
}

std::vector<int32_t> encode(const ApiContext& ctx, const std::string& text, bool add_special, const char* param) {
  try {
    return ctx.tok->encode(text, add_special);
  } catch (const Error& e) {
    bad(std::string("'") + param + "': " + e.what(), param, "invalid_text");
  }
}

void check_model(const ojson& body, const ApiContext& ctx) {
  const auto m = get_string(body, "model");
  if (m && *m != ctx.model_name && !m->empty())
    throw ApiError(404, "The model '" + *m + "' does not exist; this server serves '" + ctx.model_name + "'", "model",
                   "model_not_found");
}

// Fields shared by both endpoints: sampling, stop, n, stream, extensions.
void parse_common(const ojson& body, const ApiContext& ctx, ParsedRequest& p) {
  parse_n_and_bias(body, ctx, p);  // n, best_of, logit_bias (api_extra.cpp)
  SamplingParams& s = p.opt.sampling;
  if (auto t = get_number(body, "temperature", 0.0, 2.0)) s.temperature = float(*t);
  if (auto t = get_number(body, "top_p", 0.0, 1.0)) {
    if (*t <= 0) bad("'top_p' must be in (0, 1], got " + std::to_string(*t), "top_p", "invalid_value");
    s.top_p = float(*t);
  }
  if (auto k = get_int(body, "top_k", -1, 1 << 30)) s.top_k = int(*k < 0 ? 0 : *k);
  if (auto m = get_number(body, "min_p", 0.0, 1.0)) s.min_p = float(*m);
  if (auto r = get_number(body, "repetition_penalty", 0.0, 100.0)) {
    if (*r <= 0) bad("'repetition_penalty' must be > 0", "repetition_penalty", "invalid_value");
    s.repetition_penalty = float(*r);
  }
  if (auto v = get_number(body, "presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (const ojson* v = field(body, "seed")) {
    if (v->is_number_unsigned()) s.seed = v->get<uint64_t>();
    else if (v->is_number_integer()) s.seed = uint64_t(v->get<int64_t>());
    else bad(std::string("'seed' must be an integer, got ") + type_name(*v), "seed", "invalid_type");
  }
  if (const ojson* v = field(body, "stop")) {
    std::vector<std::string> stops;
    if (v->is_string()) {
      stops.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 16) bad("'stop' has " + std::to_string(v->size()) + " strings; at most 16", "stop", "invalid_value");
      for (const auto& x : *v) {
        if (!x.is_string()) bad(std::string("'stop' must be a string or a list of strings, found ") + type_name(x), "stop", "invalid_type");
        stops.push_back(x.get<std::string>());
      }
    } else {
      bad(std::string("'stop' must be a string or a list of strings, got ") + type_name(*v), "stop", "invalid_type");
    }
    for (const auto& st : stops)
      if (st.empty()) bad("'stop' strings must not be empty", "stop", "invalid_value");
    p.opt.stop = std::move(stops);
  }
  p.stream = get_bool(body, "stream").value_or(false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("'stream_options' must be an object", "stream_options", "invalid_type");
    p.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  if (auto ig = get_bool(body, "ignore_eos")) p.opt.ignore_eos = *ig;
  // Extensions.
  if (auto salt = get_string(body, "cache_salt")) p.cache_salt = *salt;
  if (const ojson* r = field(body, "reuse")) {
    std::string mode;
    if (r->is_string()) {
      mode = r->get<std::string>();
    } else if (r->is_object()) {
      mode = get_string(*r, "mode").value_or("auto");
      if (auto n = get_int(*r, "repair_tokens", 0, 1 << 20)) p.opt.reuse.repair_tokens = *n;
      if (auto n = get_int(*r, "overlap_tokens", 0, 1 << 20)) p.opt.reuse.overlap_tokens = *n;
      if (auto n = get_int(*r, "sink_tokens", 0, 1 << 20)) p.opt.reuse.sink_tokens = *n;
      if (auto f = get_number(*r, "blend_ratio", 0.0, 1.0)) p.opt.reuse.blend_ratio = float(*f);
      // A layer index: checked against the model (a bad one would index past the layers).
      if (auto n = get_int(*r, "blend_check_layer", 0, ctx.n_layers > 0 ? ctx.n_layers - 1 : (1 << 10)))
        p.opt.reuse.blend_check_layer = *n;
      if (auto n = get_int(*r, "blend_run_starts", 0, 1 << 20)) p.opt.reuse.blend_run_starts = *n;
      if (auto f = get_number(*r, "blend_first_ratio", 0.0, 1.0)) p.opt.reuse.blend_first_ratio = float(*f);
      if (auto n = get_int(*r, "blend_taper_layers", 1, 1 << 10)) p.opt.reuse.blend_taper_layers = *n;
      if (auto f = get_number(*r, "guard_lead", 0.0, 1e9)) p.opt.reuse.guard_lead = float(*f);
      if (auto f = get_number(*r, "guard_risk", 0.0, 1.0)) p.opt.reuse.guard_risk = float(*f);
      if (auto b = get_bool(*r, "store")) p.opt.reuse.store = *b;
    } else {
      bad(std::string("'reuse' must be a string (auto | prefix | none | selective | cacheblend) or an object, got ") +
              type_name(*r),
          "reuse", "invalid_type");
    }
    try {
      p.opt.reuse.mode = parse_reuse_mode(mode);
    } catch (const Error& e) {
      bad(std::string("'reuse': ") + e.what(), "reuse", "invalid_value");
    }
  }
  if (const ojson* sp = field(body, "speculative")) {  // {"mode": off|lookup|draft, "draft_tokens", "ngram"}
    if (!sp->is_object()) bad("'speculative' must be an object", "speculative", "invalid_type");
    if (auto m = get_string(*sp, "mode")) {
      try {
        p.opt.speculative.mode = parse_spec_mode(*m);
      } catch (const Error& e) {
        bad(std::string("'speculative.mode': ") + e.what(), "speculative", "invalid_value");
      }
    }
    if (auto n = get_int(*sp, "draft_tokens", 0, 32)) p.opt.speculative.draft_tokens = int(*n);
    if (auto n = get_int(*sp, "ngram", 1, 16)) p.opt.speculative.ngram = int(*n);
  }
  // Features this server does not implement: a clear 400 rather than a silently different answer.
  if (const ojson* v = field(body, "suffix"); v && p.chat && !(v->is_string() && v->get<std::string>().empty()))
    bad("'suffix' (fill-in-the-middle) is supported on /v1/completions only", "suffix", "unsupported_parameter");
  if (const ojson* v = field(body, "tools"); v && !p.chat && !(v->is_array() && v->empty()))
    bad("'tools' (function calling) is supported on /v1/chat/completions only", "tools", "unsupported_parameter");
  parse_structured(body, ctx, p);  // response_format, guided_*, grammar, json_schema (api_structured.cpp)
  (void)ctx;
}

// max_tokens against the context: negative, zero or huge values are 400s, as is a prompt that
// leaves no room for them.
void set_max_tokens(const ojson& body, const ApiContext& ctx, ParsedRequest& p, std::optional<int64_t> dflt,
                    const char* prompt_param) {
  const int64_t n_prompt = int64_t(p.prompt_ids.size());
  if (n_prompt == 0) bad("the prompt is empty (no tokens)", prompt_param, "empty_prompt");
  if (n_prompt > ctx.max_prompt_tokens || n_prompt >= ctx.context_length)
    bad("the prompt has " + std::to_string(n_prompt) + " tokens; this server accepts at most " +
            std::to_string(std::min(ctx.max_prompt_tokens, ctx.context_length - 1)) + " (context length " +
            std::to_string(ctx.context_length) + ")",
        prompt_param, "context_length_exceeded");
  std::optional<int64_t> mt = get_int(body, "max_completion_tokens", INT64_MIN, INT64_MAX);
  const char* mt_name = "max_completion_tokens";
  if (!mt) {
    mt = get_int(body, "max_tokens", INT64_MIN, INT64_MAX);
    mt_name = "max_tokens";
  }
  const int64_t room = ctx.context_length - n_prompt;
  if (!mt) {
    p.opt.max_new_tokens = int(std::min(dflt.value_or(room), room));
    return;
  }
  if (*mt < 1) bad(std::string("'") + mt_name + "' must be at least 1, got " + std::to_string(*mt), mt_name, "invalid_value");
  if (*mt > room)
    bad(std::string("'") + mt_name + "' = " + std::to_string(*mt) + ": this model's maximum context length is " +
            std::to_string(ctx.context_length) + " tokens; you requested " +
            // saturating: max_tokens may be as large as INT64_MAX (no signed overflow)
            std::to_string(*mt > INT64_MAX - n_prompt ? INT64_MAX : n_prompt + *mt) + " tokens (" + std::to_string(n_prompt) + " in the prompt, " +
            std::to_string(*mt) + " for the completion)",
        mt_name, "context_length_exceeded");
  p.opt.max_new_tokens = int(*mt);
}

void check_token_ids(const ojson& arr, const ApiContext& ctx, std::vector<int32_t>& out) {
  for (const auto& x : arr) {
    if (!x.is_number_integer() && !x.is_number_unsigned())
      bad(std::string("'prompt' token ids must be integers, found ") + type_name(x), "prompt", "invalid_type");
    const int64_t id = x.is_number_unsigned() ? int64_t(std::min<uint64_t>(x.get<uint64_t>(), INT64_MAX)) : x.get<int64_t>();
    if (id < 0 || id >= ctx.vocab_size)
      bad("'prompt' token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(ctx.vocab_size) + ")",
          "prompt", "invalid_value");
    out.push_back(int32_t(id));
  }
}

}  // namespace

ojson parse_body(const std::string& body) {
  if (body.empty()) bad("the request body is empty; expected a JSON object", "", "invalid_json");
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const ojson::parse_error& e) {
    // nlohmann rejects invalid UTF-8 and unpaired surrogates in strings, so those land here too.
    bad(std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  } catch (const ojson::exception& e) {
    // e.g. out_of_range 406 for a number beyond double's range (1e400): a 400, not a 500.
    bad(std::string("the request body has a number out of range: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) bad(std::string("the request body must be a JSON object, got ") + type_name(j), "", "invalid_json");
  return j;
}

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

// Message boundaries as segment starts (token offsets), so that chunks never straddle two
// messages and each message's K/V is a chunk found again by content when a client drops or
// edits earlier messages (history truncation). The conversation's first i messages rendered
// without a generation prompt must be a prefix of the whole prompt text, and tokenizing the
// text piece by piece must give exactly the whole prompt's ids (true at the special-token
// boundaries templates put between messages); otherwise, or when a template cannot render a
// prefix, there are no segments. Linear in the prompt: each piece is tokenized once.
static std::vector<int64_t> message_starts(const ApiContext& ctx, const ojson& conv, const ojson& extra,
                                    const std::string& text, const std::vector<int32_t>& ids) {
  std::vector<int64_t> starts;
  if (conv.size() < 2) return starts;
  try {
    size_t text_at = 0;
    std::vector<int32_t> acc;
    for (size_t i = 1; i < conv.size(); ++i) {
      const ojson prefix(conv.begin(), conv.begin() + long(i));
      const std::string t = apply_chat_template(ctx.chat_config, prefix, false, extra);
      if (t.size() <= text_at || t.size() >= text.size() || text.compare(0, t.size(), t) != 0) return {};
      const std::vector<int32_t> piece = ctx.tok->encode(std::string_view(t).substr(text_at), false);
      acc.insert(acc.end(), piece.begin(), piece.end());
      text_at = t.size();
      if (acc.size() >= ids.size() || !std::equal(acc.begin(), acc.end(), ids.begin())) return {};
      if (starts.empty() || int64_t(acc.size()) > starts.back()) starts.push_back(int64_t(acc.size()));
    }
    const std::vector<int32_t> rest = ctx.tok->encode(std::string_view(text).substr(text_at), false);
    acc.insert(acc.end(), rest.begin(), rest.end());
    if (acc != ids) return {};
  } catch (const std::exception&) {
    return {};
  }
  return starts;
}

ParsedRequest parse_chat(const ojson& body, const ApiContext& ctx) {
  ParsedRequest p;
  p.chat = true;
  check_model(body, ctx);
  parse_common(body, ctx, p);
  const bool lp = get_bool(body, "logprobs").value_or(false);
  const auto top = get_int(body, "top_logprobs", 0, 20);
  if (top && !lp) bad("'top_logprobs' requires 'logprobs': true", "top_logprobs", "invalid_value");
  if (lp) p.opt.logprobs = int(top.value_or(0));
  if (field(body, "segments")) bad("'segments' is supported on /v1/completions only", "segments", "unsupported_parameter");
  const ojson* msgs = field(body, "messages");
  if (!msgs) bad("'messages' is required", "messages", "missing_required_parameter");
  if (!msgs->is_array()) bad(std::string("'messages' must be a list, got ") + type_name(*msgs), "messages", "invalid_type");
  if (msgs->empty()) bad("'messages' must not be empty", "messages", "empty_messages");
  ojson conv = ojson::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(at + " must be an object, got " + type_name(m), at, "invalid_type");
    const ojson* role = field(m, "role");
    if (!role || !role->is_string()) bad(at + ".role must be a string", at + ".role", "invalid_type");
    std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      bad(at + ".role '" + r + "' is not one of system, developer, user, assistant, tool", at + ".role", "invalid_value");
    if (r == "developer") r = "system";  // OpenAI's newer name; chat templates know "system"
    std::string content;
    const ojson* c = field(m, "content");
    if (!c) {
      if (r != "assistant") bad(at + ".content is required", at + ".content", "missing_required_parameter");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const ojson& part = (*c)[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad(pat + " must be {\"type\": \"text\", \"text\": string} (only text content is supported)", pat,
              "invalid_type");
        content += part["text"].get<std::string>();
      }
    } else {
      bad(at + ".content must be a string or a list of text parts, got " + type_name(*c), at + ".content", "invalid_type");
    }
    ojson out;
    out["role"] = r;
    out["content"] = content;
    if (auto name = get_string(m, "name")) out["name"] = *name;
    if (auto id = get_string(m, "tool_call_id")) out["tool_call_id"] = *id;
    if (const ojson* tc = field(m, "tool_calls"); tc && r == "assistant") out["tool_calls"] = template_tool_calls(*tc, at + ".tool_calls");
    conv.push_back(std::move(out));
  }
  if (!ctx.has_chat_template)
    bad("the model '" + ctx.model_name +
            "' has no chat template (no chat_template in its tokenizer_config.json); use /v1/completions with a "
            "formatted prompt",
        "messages", "no_chat_template");
  ojson extra = ojson::object();
  if (const ojson* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type");
    extra = *kw;
  }
  parse_tools(body, ctx, p, extra);  // tools into the template's context (api_structured.cpp)
  const bool add_gen = get_bool(body, "add_generation_prompt").value_or(true);
  try {
    p.prompt_text = apply_chat_template(ctx.chat_config, conv, add_gen, extra);
  } catch (const ChatTemplateError& e) {
    if (e.kind() == ChatTemplateError::Kind::Raised)
      bad(std::string("the chat template rejected the conversation: ") + e.what(), "messages", "invalid_messages");
    throw ApiError(500, std::string("the model's chat template cannot be rendered: ") + e.what(), "", "chat_template_error");
  } catch (const Error& e) {
    throw ApiError(500, std::string("the model's chat template cannot be rendered: ") + e.what(), "", "chat_template_error");
  }
  // As transformers' apply_chat_template(tokenize=True): the template supplies special tokens.
  p.prompt_ids = encode(ctx, p.prompt_text, false, "messages");
  p.opt.segment_starts = message_starts(ctx, conv, extra, p.prompt_text, p.prompt_ids);
  set_max_tokens(body, ctx, p, std::nullopt, "messages");
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
  if (p.n != 1 || !p.more_prompt_ids.empty()) bad("/v1/warm takes one prompt and n = 1", "n", "unsupported_value");
  // As Engine::warm: greedy, one token, the computed chunks pinned in the chunk store's RAM tier.
  p.opt.sampling.temperature = 0.0f;
  p.opt.stop.clear();
  p.opt.ignore_eos = true;
  p.opt.reuse.pin = true;
  return p;
}

std::string make_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffffu));
  return std::string(prefix) + buf;
}

ojson usage_json(const GenerateResult& r) {
  ojson u;
  u["prompt_tokens"] = r.n_prompt();
  u["completion_tokens"] = int64_t(r.output_ids.size());
  u["total_tokens"] = r.n_prompt() + int64_t(r.output_ids.size());
  ojson d;
  d["cached_tokens"] = std::max<int64_t>(0, std::max(r.n_cached, r.n_reused - r.n_recomputed));
  u["prompt_tokens_details"] = d;
  return u;
}

ojson kvboost_json(const GenerateResult& r) {
  ojson k;
  k["cached_prefix_tokens"] = r.n_cached;
  k["reused_tokens"] = r.n_reused;
  k["recomputed_tokens"] = r.n_recomputed;
  k["new_tokens"] = r.n_new;
  k["guarded"] = r.guarded;  // a close call recomputed exactly (reuse.guard_lead)
  if (r.approximate) {  // its first token's lead and the threshold the guard held it to
    k["first_lead"] = r.first_lead;
    k["guard_lead"] = r.guard_lead;
  }
  k["preempted"] = r.n_preempted;
  ojson sp;  // speculative decoding
  sp["drafted"] = r.spec_drafted;
  sp["accepted"] = r.spec_accepted;
  sp["acceptance_rate"] = r.acceptance_rate();
  sp["tokens_per_pass"] = r.tokens_per_pass();
  k["speculative"] = sp;
  k["queue_ms"] = r.queue_ms;
  k["ttft_ms"] = r.ttft_ms;
  k["prefill_ms"] = r.prefill_ms;
  k["decode_ms"] = r.decode_ms;
  k["total_ms"] = r.total_ms;
  if (r.remote_ms > 0 || r.n_remote_chunks > 0) {  // only with --chunk-remote
    k["remote_chunks"] = r.n_remote_chunks;
    k["remote_ms"] = r.remote_ms;
  }
  return k;
}

ojson remote_stats_json(const kv::RemoteStats& s) {
  ojson j;
  j["up"] = s.up;
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  j["bytes"] = s.bytes;
  j["skipped_not_worth_it"] = s.skipped;
  j["unavailable"] = s.unavailable;
  j["corrupt"] = s.corrupt;
  j["errors"] = s.errors;
  j["fetches"] = s.fetches;
  j["fetch_ms_mean"] = s.fetches ? s.fetch_ms_sum / double(s.fetches) : 0.0;
  j["writes"] = s.writes;
  j["write_bytes"] = s.write_bytes;
  j["write_drops"] = s.write_drops;
  j["write_errors"] = s.write_errors;
  j["too_big"] = s.too_big;
  j["rtt_ms"] = s.rtt_ms;
  j["mb_per_s"] = s.mb_per_s;
  j["prefill_tok_per_s"] = s.prefill_tok_per_s;
  return j;
}

std::string remote_metrics_text(const kv::RemoteStats& s) {
  std::ostringstream o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  head("kvboost_chunk_remote_up", "gauge", "1 when the remote chunk tier answered its last command.");
  o << "kvboost_chunk_remote_up " << (s.up ? 1 : 0) << '\n';
  head("kvboost_chunk_remote_lookups_total", "counter",
       "Remote chunk lookups by result (skipped: recomputing is cheaper; unavailable: remote down).");
  o << "kvboost_chunk_remote_lookups_total{result=\"hit\"} " << s.hits << "\nkvboost_chunk_remote_lookups_total{result=\"miss\"} "
    << s.misses << "\nkvboost_chunk_remote_lookups_total{result=\"skipped\"} " << s.skipped
    << "\nkvboost_chunk_remote_lookups_total{result=\"unavailable\"} " << s.unavailable
    << "\nkvboost_chunk_remote_lookups_total{result=\"corrupt\"} " << s.corrupt << '\n';
  head("kvboost_chunk_remote_fetched_bytes_total", "counter", "Bytes fetched from the remote chunk tier.");
  o << "kvboost_chunk_remote_fetched_bytes_total " << s.bytes << '\n';
  head("kvboost_chunk_remote_errors_total", "counter", "Failed remote commands (connection, timeout, error reply).");
  o << "kvboost_chunk_remote_errors_total " << s.errors << '\n';
  head("kvboost_chunk_remote_writes_total", "counter", "Remote chunk writes by result.");
  o << "kvboost_chunk_remote_writes_total{result=\"ok\"} " << s.writes << "\nkvboost_chunk_remote_writes_total{result=\"dropped\"} "
    << s.write_drops << "\nkvboost_chunk_remote_writes_total{result=\"refused\"} " << s.write_errors
    << "\nkvboost_chunk_remote_writes_total{result=\"too_big\"} " << s.too_big << '\n';
  head("kvboost_chunk_remote_fetch_ms", "histogram", "Latency of one prompt's remote lookup (one round trip), ms.");
  int64_t cum = 0;
  for (size_t b = 0; b < kv::kRemoteFetchBuckets; ++b) {
    cum += s.fetch_ms_buckets[b];
    o << "kvboost_chunk_remote_fetch_ms_bucket{le=\"";
    if (b + 1 < kv::kRemoteFetchBuckets) o << kv::kRemoteFetchBucketsMs[b];
    else o << "+Inf";
    o << "\"} " << cum << '\n';
  }
  o << "kvboost_chunk_remote_fetch_ms_sum " << s.fetch_ms_sum << "\nkvboost_chunk_remote_fetch_ms_count " << s.fetches << '\n';
  head("kvboost_chunk_remote_rtt_ms", "gauge", "The cost model's round-trip time estimate, ms.");
  o << "kvboost_chunk_remote_rtt_ms " << s.rtt_ms << '\n';
  head("kvboost_chunk_remote_bandwidth_mb_per_s", "gauge", "The cost model's remote bandwidth estimate, MB/s.");
  o << "kvboost_chunk_remote_bandwidth_mb_per_s " << s.mb_per_s << '\n';
  head("kvboost_chunk_remote_prefill_tok_per_s", "gauge", "The cost model's prefill rate estimate, tokens/s.");
  o << "kvboost_chunk_remote_prefill_tok_per_s " << s.prefill_tok_per_s << '\n';
  return o.str();
}

namespace {
// A token's text as the client sees it: as it reads after `prev` (decode(prev, id) minus
// decode(prev)), so that the tokens of a completion join to its text (decode({id}) alone strips
// a SentencePiece token's leading space); decode({id}) where the two decodes do not extend each
// other (a UTF-8 character split across the pair). A byte-level token may hold part of a UTF-8
// character: then the text has U+FFFD where the bytes are incomplete.
std::string token_text(const Tokenizer& tok, int32_t prev, int32_t id) {
  if (prev < 0) return tok.decode({id}, false);
  const std::string a = tok.decode({prev}, false), b = tok.decode({prev, id}, false);
  if (b.size() >= a.size() && b.compare(0, a.size(), a) == 0) return b.substr(a.size());
  return tok.decode({id}, false);
}

ojson bytes_json(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

std::string valid_utf8(const std::string& s) {
  // nlohmann would throw on invalid UTF-8 in a string value; replace each bad byte by U+FFFD.
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}
}  // namespace

ojson logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, const Tokenizer& tok, size_t text_offset) {
  if (chat) {
    ojson content = ojson::array();
    for (const TokenLogprob& t : lps) {
      const std::string s = token_text(tok, t.prev, t.id);
      ojson e;
      e["token"] = valid_utf8(s);
      e["logprob"] = t.logprob;
      e["bytes"] = bytes_json(s);
      ojson top = ojson::array();
      for (const auto& [id, lp] : t.top) {
        const std::string ts = token_text(tok, t.prev, id);
        top.push_back(ojson{{"token", valid_utf8(ts)}, {"logprob", lp}, {"bytes", bytes_json(ts)}});
      }
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    ojson o;
    o["content"] = content;
    o["refusal"] = nullptr;
    return o;
  }
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_text(tok, t.prev, t.id);
    tokens.push_back(valid_utf8(s));
    token_lps.push_back(t.logprob);
    offsets.push_back(text_offset);
    text_offset += s.size();
    // OpenAI: the top alternatives, plus the sampled token when it is not among them.
    ojson top = ojson::object();
    for (const auto& [id, lp] : t.top) top[valid_utf8(token_text(tok, t.prev, id))] = lp;
    if (!top.contains(valid_utf8(s))) top[valid_utf8(s)] = t.logprob;
    tops.push_back(top);
  }
  ojson o;
  o["tokens"] = tokens;
  o["token_logprobs"] = token_lps;
  o["top_logprobs"] = tops;
  o["text_offset"] = offsets;
  return o;
}

std::string finish_reason_of(const GenerateResult& r) { return r.finish_reason == "stop" ? "stop" : "length"; }

ojson completion_body(const std::string& id, int64_t created, const std::string& model, const ParsedRequest& p,
                      const GenerateResult& r, const Tokenizer* tok) {
  ojson choice;
  choice["index"] = 0;
  if (p.chat) {
    ojson msg;
    msg["role"] = "assistant";
    msg["content"] = r.text;
    if (p.parse_tools) {
      ToolCallSplit tc = split_tool_calls(r.text);
      if (!tc.tool_calls.empty()) {
        msg["content"] = tc.content.empty() ? ojson(nullptr) : ojson(tc.content);
        msg["tool_calls"] = tc.tool_calls;
      }
    }
    choice["message"] = msg;
  } else {
    choice["text"] = p.echo ? p.prompt_text + r.text : r.text;
  }
  choice["logprobs"] = tok && p.opt.logprobs >= 0 ? logprobs_json(r.logprobs, p.chat, *tok, 0) : ojson(nullptr);
  choice["finish_reason"] = p.chat && choice["message"].contains("tool_calls") ? "tool_calls" : finish_reason_of(r);
  ojson o;
  o["id"] = id;
  o["object"] = p.chat ? "chat.completion" : "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  o["usage"] = usage_json(r);
  o["kvboost"] = kvboost_json(r);
  return o;
}

ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                       const std::string& finish_reason, const ojson& logprobs) {
  ojson choice;
  choice["index"] = 0;
  choice["text"] = text;
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson o;
  o["id"] = id;
  o["object"] = "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  return o;
}

ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, const ojson& delta,
                 const std::string& finish_reason, const ojson& logprobs) {
  ojson choice;
  choice["index"] = 0;
  choice["delta"] = delta;
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson o;
  o["id"] = id;
  o["object"] = "chat.completion.chunk";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  return o;
}

ojson usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat, const GenerateResult& r) {
  ojson o;
  o["id"] = id;
  o["object"] = chat ? "chat.completion.chunk" : "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array();
  o["usage"] = usage_json(r);
  o["kvboost"] = kvboost_json(r);
  return o;
}

}  // namespace kvboost::server
