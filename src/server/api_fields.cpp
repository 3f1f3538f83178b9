// Shared field readers of the OpenAI request schema: every field is type- and range-checked here,
// so that a bad request is a 4xx naming the parameter (OpenAI's `param`) and never reaches the
// engine. Used by the endpoint parsers (api.cpp, api_chat.cpp).
#include "api_fields.h"

#include <cmath>
#include <sstream>

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

namespace fields {

void bad(const std::string& msg, const std::string& param, const std::string& code) {
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
      if (auto n = get_int(*r, "guard_tokens", 1, 64)) p.opt.reuse.guard_tokens = int(*n);
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


}  // namespace fields

using namespace fields;

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

}  // namespace kvboost::server
