// kvboost/chat.h — chat templates: the Jinja2 subset that Hugging Face chat templates use.
// Uses only kvboost/common.h (and nlohmann::json for the render context).
//
// Rendering follows transformers' apply_chat_template(..., tokenize=False): a Jinja environment
// with trim_blocks=True, lstrip_blocks=True, loop controls (break/continue), the `generation`
// tag, and the globals raise_exception(msg) and strftime_now(fmt); `tojson` is json.dumps with
// ensure_ascii=False (Python's separators, key order kept).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/common.h"

namespace kvboost {

// Every error of this module. `kind` tells a caller (the server) whose fault it is: a template
// that raise_exception()s rejects the conversation (a client error); the others are the
// template's or this interpreter's.
class ChatTemplateError : public Error {
 public:
  enum class Kind {
    Syntax,       // the template does not parse: names template, line and column
    Unsupported,  // a construct this interpreter lacks (filter, test, statement, method)
    Runtime,      // evaluation failed (type error, undefined attribute, a limit was hit)
    Raised,       // the template called raise_exception(message)
  };
  ChatTemplateError(Kind kind, const std::string& what) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct ChatRenderOptions {
  // The time strftime_now() formats (local time when unset, like datetime.now()).
  std::optional<std::tm> now;
  // Hostile-template guards: loop iterations + statements executed, output bytes, macro depth.
  int64_t max_steps = 5'000'000;
  size_t max_output_bytes = 64u << 20;
  int max_call_depth = 64;
};

class ChatTemplate {
 public:
  // Parses `source`; `name` appears in every error message. Throws ChatTemplateError (Syntax or
  // Unsupported) naming line and column.
  static ChatTemplate parse(const std::string& source, const std::string& name = "chat_template");

  // Renders with `context` as the template's variables (messages, add_generation_prompt,
  // bos_token, ... and any extra kwargs). Key order of objects is kept (ordered_json), which
  // matters for `tojson`. Throws ChatTemplateError.
  std::string render(const nlohmann::ordered_json& context, const ChatRenderOptions& opts = {}) const;
  // Same with a (key-sorted) nlohmann::json context.
  std::string render(const nlohmann::json& context, const ChatRenderOptions& opts = {}) const;

  const std::string& name() const;

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl>);
  std::shared_ptr<const Impl> impl_;
};

// The chat template source of a tokenizer_config.json text: `chat_template` as a string, or the
// list-of-{name, template} form (picking `template_name`, "default" when empty). Throws Error
// when there is none.
std::string chat_template_source(const std::string& tokenizer_config_json_text,
                                 const std::string& template_name = "");

// What transformers' tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=..., **extra) returns: the template of tokenizer_config.json rendered
// with messages, add_generation_prompt, tools/documents (none unless in `extra`), the special
// token strings of the config (bos_token, eos_token, unk_token, pad_token, ...) and `extra`.
std::string apply_chat_template(const std::string& tokenizer_config_json_text,
                                const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                const ChatRenderOptions& opts = {});

// Built-in templates for models whose files carry none (`--chat-template NAME`): "chatml",
// "llama3", "gemma", "mistral" (src/chat/named_templates.cpp). builtin_chat_template returns
// the Jinja source, nullopt for another name; builtin_chat_template_end the text that closes an
// assistant turn in that format ("" for another name).
std::vector<std::string> builtin_chat_template_names();
std::optional<std::string> builtin_chat_template(const std::string& name);
std::string builtin_chat_template_end(const std::string& name);
// A tokenizer_config.json text ("" = none) with its chat_template replaced by `source`; the
// special token strings it names (bos_token, eos_token, ...) are kept for the template.
std::string with_chat_template(const std::string& tokenizer_config_json_text, const std::string& source);

}  // namespace kvboost
