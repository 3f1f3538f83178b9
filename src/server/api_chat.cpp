// The OpenAI request schema for /v1/chat/completions: messages through the chat template, tools
// (api_tools.cpp), logprobs, message boundaries as segments.
#include "api.h"

#include "api_fields.h"
#include "kvboost/chat.h"

namespace kvboost::server {

using namespace fields;

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

}  // namespace kvboost::server
