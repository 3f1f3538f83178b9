// Public API of the chat module: ChatTemplate and apply_chat_template (kvboost/chat.h).
#include "jinja.h"

namespace kvboost {

struct ChatTemplate::Impl {
  std::string name;
  std::unique_ptr<jinja::Template> tmpl;
};

ChatTemplate::ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& name) {
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  impl->tmpl = jinja::parse(source, name);
  return ChatTemplate(std::move(impl));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const ChatRenderOptions& opts) const {
  return jinja::render(*impl_->tmpl, context, opts);
}

std::string ChatTemplate::render(const nlohmann::json& context, const ChatRenderOptions& opts) const {
  return render(nlohmann::ordered_json::parse(context.dump()), opts);
}

const std::string& ChatTemplate::name() const { return impl_->name; }

std::string chat_template_source(const std::string& config_text, const std::string& template_name) {
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer_config.json: invalid JSON: ", e.what());
  }
  if (!cfg.is_object() || !cfg.contains("chat_template") || cfg["chat_template"].is_null())
    fail("tokenizer_config.json: no 'chat_template' field");
  const auto& ct = cfg["chat_template"];
  if (ct.is_string()) return ct.get<std::string>();
  if (!ct.is_array()) fail("tokenizer_config.json: 'chat_template' must be a string or a list of {name, template}");
  std::string want = template_name.empty() ? "default" : template_name;
  std::string names;
  for (const auto& e : ct) {
    if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
        !e["template"].is_string())
      fail("tokenizer_config.json: 'chat_template' list entries must be {\"name\": ..., \"template\": ...}");
    if (e["name"] == want) return e["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + e["name"].get<std::string>();
  }
  fail("tokenizer_config.json: no chat template named '", want, "' (have: ", names, ")");
}

std::string apply_chat_template(const std::string& config_text, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                const ChatRenderOptions& opts) {
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(config_text, nullptr, false);
  std::string name = "tokenizer_config.json chat_template";
  ChatTemplate t = ChatTemplate::parse(chat_template_source(config_text), name);
  // transformers: render(messages=, tools=, documents=, add_generation_prompt=, **special_tokens_map, **kwargs)
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg.is_object() || !cfg.contains(key)) continue;
    const auto& v = cfg[key];
    if (v.is_string()) ctx[key] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) ctx[key] = v["content"];  // AddedToken form
  }
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return t.render(ctx, opts);
}

}  // namespace kvboost
