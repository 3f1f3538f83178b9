// Internal to kvboost_server: the field readers every endpoint parser shares. Each throws
// ApiError 400 naming the field (OpenAI's `param`) when the value has the wrong type or range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api.h"

namespace kvboost::server::fields {

[[noreturn]] void bad(const std::string& msg, const std::string& param = "", const std::string& code = "");
// "null", "boolean", "integer", "number", "string", "array" or "object".
const char* type_name(const ojson& v);
// A present, non-null field, or nullptr.
const ojson* field(const ojson& body, const char* name);
// The field's value, nullopt when absent; 400 when present with another type or out of [lo, hi].
std::optional<double> get_number(const ojson& body, const char* name, double lo, double hi);
std::optional<int64_t> get_int(const ojson& body, const char* name, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const ojson& body, const char* name);
std::optional<std::string> get_string(const ojson& body, const char* name);
// The tokenizer's ids for `text`; 400 naming `param` when it cannot be encoded.
std::vector<int32_t> encode(const ApiContext& ctx, const std::string& text, bool add_special, const char* param);
// `model`, when given, must be the served model's name (404 otherwise).
void check_model(const ojson& body, const ApiContext& ctx);
// Fields shared by completions and chat: sampling, stop, n, stream, extensions.
void parse_common(const ojson& body, const ApiContext& ctx, ParsedRequest& p);
// max_tokens / max_completion_tokens against the context (after the prompt is known).
void set_max_tokens(const ojson& body, const ApiContext& ctx, ParsedRequest& p, std::optional<int64_t> dflt,
                    const char* prompt_param);
// A `prompt` array of token ids, each in the vocabulary, appended to `out`.
void check_token_ids(const ojson& arr, const ApiContext& ctx, std::vector<int32_t>& out);

}  // namespace kvboost::server::fields
