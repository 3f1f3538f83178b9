// Built-in chat templates (--chat-template NAME) for models whose files carry none: GGUFs
// without tokenizer.chat_template, base models, fine-tunes that lost tokenizer_config.json.
// Each is the format its family's instruct models were trained on, written in the Jinja subset
// this module renders, so that they go through exactly the path a model's own template does.
#include <nlohmann/json.hpp>

#include "kvboost/chat.h"

namespace kvboost {

namespace {
struct Named {
  const char* name;
  const char* source;
  const char* end_of_turn;  // text that closes an assistant turn (a stop string for the REPL)
};

// ChatML (Qwen, Yi, many fine-tunes): <|im_start|>role\ncontent<|im_end|>\n.
constexpr const char* kChatml =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// Llama 3 / 3.x Instruct: header ids around the role, <|eot_id|> after each message.
constexpr const char* kLlama3 =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

// Gemma (2, 3): roles user/model, a system message folded into the first user turn.
constexpr const char* kGemma =
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set first_user_prefix = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'assistant' %}{%- set role = 'model' %}{%- else %}{%- set role = message['role'] %}{%- endif %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + "
    "'<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}";

// Mistral Instruct (v0.1-v0.3 style): [INST] user [/INST] answer</s>, a system message
// prepended to the first user turn.
constexpr const char* kMistral =
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_prefix = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + (system_prefix if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}";

constexpr Named kNamed[] = {
    {"chatml", kChatml, "<|im_end|>"},
    {"llama3", kLlama3, "<|eot_id|>"},
    {"gemma", kGemma, "<end_of_turn>"},
    {"mistral", kMistral, "</s>"},
};
}  // namespace

std::vector<std::string> builtin_chat_template_names() {
  std::vector<std::string> out;
  for (const Named& n : kNamed) out.push_back(n.name);
  return out;
}

std::optional<std::string> builtin_chat_template(const std::string& name) {
  for (const Named& n : kNamed)
    if (name == n.name) return std::string(n.source);
  return std::nullopt;
}

std::string builtin_chat_template_end(const std::string& name) {
  for (const Named& n : kNamed)
    if (name == n.name) return n.end_of_turn;
  return "";
}

std::string with_chat_template(const std::string& config_text, const std::string& source) {
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (!config_text.empty()) {
    try {
      cfg = nlohmann::ordered_json::parse(config_text);
    } catch (const nlohmann::json::exception& e) {
      fail("tokenizer_config.json: not valid JSON (", e.what(), ")");
    }
    if (!cfg.is_object()) fail("tokenizer_config.json: not a JSON object");
  }
  cfg["chat_template"] = source;
  return cfg.dump();
}

}  // namespace kvboost
