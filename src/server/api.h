// Internal to kvboost_server: the OpenAI request schema (parsing and validation into engine
// requests) and response bodies. No sockets here, so all of it is testable directly.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/runtime.h"

namespace kvboost::server {

using ojson = nlohmann::ordered_json;

// A client-visible error: HTTP status + OpenAI's error object
// {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status_, std::string message, std::string param_ = "", std::string code_ = "",
           std::string type_ = "");
};
std::string error_body(const ApiError& e);

// What parsing needs to know about the served model.
struct ApiContext {
  const Tokenizer* tok = nullptr;
  int64_t context_length = 0;
  int64_t max_prompt_tokens = 0;   // prompts longer: 400 (context_length_exceeded)
  int32_t vocab_size = 0;
  int64_t n_layers = 0;            // layer indices in requests (blend_check_layer) are checked
  std::string model_name;
  std::string chat_config;         // tokenizer_config.json text ("" = none)
  bool has_chat_template = false;
};

// The tool-call syntax of a model family, from its chat template (api_tools.cpp).
enum class ToolSyntax { none, hermes, llama3, mistral, mistral_v11 };
// hermes: the template shows <tool_call>; mistral_v11: [ARGS] (Mistral Small 3.x, Devstral,
// Ministral 3: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}); mistral: [TOOL_CALLS] (v0.3, Nemo:
// [TOOL_CALLS][{...}]); llama3: <|python_tag|>, or Llama 3 headers with the {"name", "parameters"}
// call format; else none.
ToolSyntax tool_syntax_of(const std::string& template_source);
const char* tool_syntax_name(ToolSyntax s);

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool echo = false;            // completions: prepend the prompt to the text
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;      // for echo (the prompt as the client gave it, or decoded ids)
  std::string cache_salt;       // extension: part of the cache namespace (with the tenant)
  GenerateOptions opt;          // everything but on_text and cache_namespace
  // Tools (chat): parse the output's tool calls (<tool_call>{json}</tool_call>, Hermes/Qwen) into
  // OpenAI tool_calls; tool_choice "none" renders the tools but leaves the text alone.
  bool parse_tools = false;
  ToolSyntax tool_syntax = ToolSyntax::hermes;  // the syntax parse_tools reads (from the template)
  // n choices per prompt, best_of candidates per prompt (>= n; the n with the highest cumulative
  // log-probability are returned, server_multi.cpp), and a prompt list in /v1/completions (the
  // first prompt in prompt_ids/prompt_text, the rest here): every candidate is its own engine
  // request, submitted together so that the engine's prefix cache gives candidates 2.. the first
  // one's prompt blocks; seed = seed + candidate index (api_extra.cpp).
  int n = 1;
  int best_of = 1;
  std::vector<std::vector<int32_t>> more_prompt_ids;
  std::vector<std::string> more_prompt_texts;
};

// api_extra.cpp: n / best_of / logit_bias (400 naming the field when out of range; best_of < n,
// or best_of > n with stream).
void parse_n_and_bias(const ojson& body, const ApiContext& ctx, ParsedRequest& p);
// FIM (`suffix` on /v1/completions): the model's fill-in-the-middle sentinels, found in the
// vocabulary (Qwen2.5-Coder <|fim_prefix|> <|fim_suffix|> <|fim_middle|>, CodeLlama <PRE> <SUF>
// <MID>); the prompt in prefix-suffix-middle order. 400 naming `suffix` for a model without them.
struct FimTokens {
  int32_t prefix = -1, suffix = -1, middle = -1;
  bool codellama = false;
};
std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok);
std::vector<int32_t> fim_prompt(const ApiContext& ctx, const std::string& prefix, const std::string& suffix);
// POST /tokenize (llama.cpp: content, add_special, with_pieces; vLLM: prompt, add_special_tokens,
// return_token_strs) and POST /detokenize (tokens): the response bodies.
ojson tokenize_json(const ojson& body, const ApiContext& ctx);
ojson detokenize_json(const ojson& body, const ApiContext& ctx);
// POST /v1/embeddings: the 501 every request gets, saying why.
ApiError embeddings_error();

// api_structured.cpp: response_format, guided_json/regex/choice/grammar, grammar, json_schema
// (sets p.opt.grammar; 400 naming the field or the unsupported schema feature).
void parse_structured(const ojson& body, const ApiContext& ctx, ParsedRequest& p);
// tools / tool_choice (chat): checks them, adds `tools` to the template's context, constrains
// the output for tool_choice required/named. Call before rendering the template.
void parse_tools(const ojson& body, const ApiContext& ctx, ParsedRequest& p, ojson& template_extra);
// An assistant message's tool_calls (OpenAI form, arguments a JSON string) as chat templates
// expect them (arguments an object). 400 naming `at` when malformed.
ojson template_tool_calls(const ojson& tool_calls, const std::string& at);
// Splits generated text into content and OpenAI tool_calls (id, type, function.name,
// function.arguments as a JSON string) in the family's syntax. tool_calls is an empty array when
// there are none (then content is the whole text).
struct ToolCallSplit {
  std::string content;
  ojson tool_calls = ojson::array();
};
ToolCallSplit split_tool_calls(const std::string& text, ToolSyntax syntax = ToolSyntax::hermes);
// Streaming form: text in, chat deltas out ({"content": ...} or {"tool_calls": [...]}, one
// complete call each); text that may start a tool call is held back until it is known (Llama 3 /
// Mistral: a message that starts like calls is held to the end, as their calls end the message).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolSyntax syntax = ToolSyntax::hermes) : syntax_(syntax) {}
  std::vector<ojson> push(const std::string& text, bool done);
  int n_calls() const { return n_calls_; }

 private:
  std::vector<ojson> push_marked(const std::string& text, bool done);
  ToolSyntax syntax_;
  std::string buf_;
  bool in_call_ = false;
  bool started_ = false;  // llama3 / mistral: the first non-blank character has been seen
  int n_calls_ = 0;
};
// api_structured.cpp, for api_tools.cpp: GBNF compiled for the served vocabulary, and a JSON
// Schema as GBNF; 400 naming `param` on an error or an unsupported feature.
std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const ApiContext& ctx, const std::string& gbnf,
                                                                const std::string& param);
std::string schema_to_gbnf(const ojson& schema, bool strict, const std::string& param);

// The JSON body, or ApiError 400 (malformed JSON, invalid UTF-8, not an object).
ojson parse_body(const std::string& body);
// POST /v1/completions, POST /v1/chat/completions, POST /v1/warm. Throw ApiError.
ParsedRequest parse_completion(const ojson& body, const ApiContext& ctx);
ParsedRequest parse_chat(const ojson& body, const ApiContext& ctx);
ParsedRequest parse_warm(const ojson& body, const ApiContext& ctx);

// "cmpl-..." / "chatcmpl-..." with 24 random hex digits.
std::string make_id(const char* prefix);

ojson usage_json(const GenerateResult& r);
// KVBoost's per-request extension object: reuse and timing details.
ojson kvboost_json(const GenerateResult& r);
// The remote chunk tier's counters: /v1/stats JSON and Prometheus text for /metrics.
ojson remote_stats_json(const kv::RemoteStats& s);
std::string remote_metrics_text(const kv::RemoteStats& s);
// OpenAI's finish_reason for an engine result ("stop" | "length").
std::string finish_reason_of(const GenerateResult& r);

// OpenAI's logprobs object for generated tokens: chat {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}; completions {tokens, token_logprobs, top_logprobs (a dict per
// token: the alternatives plus the sampled token), text_offset (from text_offset on)}.
ojson logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, const Tokenizer& tok, size_t text_offset);

// tok: for the logprobs object (when the request asked for logprobs).
ojson completion_body(const std::string& id, int64_t created, const std::string& model, const ParsedRequest& p,
                      const GenerateResult& r, const Tokenizer* tok = nullptr);
// One streamed chunk: `text` (completions) or a delta (chat). finish_reason "" = null.
ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                       const std::string& finish_reason, const ojson& logprobs = nullptr);
ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, const ojson& delta,
                 const std::string& finish_reason, const ojson& logprobs = nullptr);
ojson usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat, const GenerateResult& r);

}  // namespace kvboost::server
