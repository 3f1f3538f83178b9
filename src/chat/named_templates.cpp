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

// Llama 3 / 3.x Instruct: header ids around the role, <|eot_id|> after each message. With
// `tools`, Llama 3.1's JSON tool calling: the function list in the first user message, an
// assistant call as {"name": ..., "parameters": {...}} (several joined by "; "), a tool's answer
// in an `ipython` turn. Without tools the text is that of the plain Llama 3 template.
constexpr const char* kLlama3 =
    "{{- bos_token }}"
    "{%- set ns = namespace(tools_pending=false) %}"
    "{%- if tools is defined and tools %}{%- set ns.tools_pending = true %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": ' + tc['function']['name'] | tojson + ', \"parameters\": ' + tc['function']['arguments'] | tojson + '}' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- elif message['role'] == 'tool' or message['role'] == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- elif message['role'] == 'user' and ns.tools_pending %}"
    "{%- set ns.tools_pending = false %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments '"
    " + 'that best answers the given prompt.\\n\\n' }}"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. '"
    " + 'Do not use variables.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endif %}"
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
// prepended to the first user turn. With `tools`, v0.3's function calling: [AVAILABLE_TOOLS]
// before the last user turn, an assistant's calls as [TOOL_CALLS] [{"name", "arguments", "id"}]
// (ids of 9 letters and digits), a tool's answer as [TOOL_RESULTS] {"content", "call_id"}.
constexpr const char* kMistral =
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_prefix = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in loop_messages %}{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is defined and tools and loop.index0 == ns.last_user %}"
    "{{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}"
    "{%- endif %}"
    "{{- '[INST] ' + (system_prefix if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '[TOOL_CALLS] [' }}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- if not loop.first %}{{- ', ' }}{%- endif %}"
    "{{- '{\"name\": ' + tc['function']['name'] | tojson + ', \"arguments\": ' + tc['function']['arguments'] | tojson"
    " + ', \"id\": ' + tc['id'] | default('') | tojson + '}' }}"
    "{%- endfor %}"
    "{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + message['content'] | tojson + ', \"call_id\": ' + message['tool_call_id'] | default('') | tojson"
    " + '}[/TOOL_RESULTS]' }}"
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
