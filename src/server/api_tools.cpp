// Tools on the OpenAI schema: tools + tool_choice checked and handed to the chat template, and the
// model's tool-call syntax parsed back into OpenAI tool_calls, whole or streamed. The syntax is
// the model family's, read from its chat template (tool_syntax_of):
//   hermes   Hermes / Qwen2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any number,
//            with text around them;
//   llama3   Llama 3.1-3.3 JSON tool calling: the message is the call, optionally after
//            <|python_tag|>: {"name": ..., "parameters": {...}}, several joined by ';';
//   mistral  Mistral v0.3 / Nemo: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]; call ids
//            are 9 letters and digits, as Mistral's template requires of the follow-up turn;
//   mistral-v11  Mistral Small 3.x, Devstral, Ministral 3 (tokenizer v11+): one
//            [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} per call ([CALL_ID] optional). These markers
//            are special tokens too, but the name is not JSON: the server keeps special tokens in
//            the text of such a request (GenerateOptions::keep_special_tokens) so that the
//            markers delimit it.
// <|python_tag|> and [TOOL_CALLS] are special tokens in those vocabularies, which the detokenizer
// drops, so a message that is nothing but the JSON is read as calls too.
#include <cctype>
#include <cstring>
#include <random>

#include "api.h"
#include "api_fields.h"
#include "kvboost/chat.h"
#include "kvboost/grammar.h"

namespace kvboost::server {

using namespace fields;

ToolSyntax tool_syntax_of(const std::string& src) {
  if (src.find("<tool_call>") != std::string::npos) return ToolSyntax::hermes;
  if (src.find("[TOOL_CALLS]") != std::string::npos && src.find("[ARGS]") != std::string::npos)
    return ToolSyntax::mistral_v11;
  if (src.find("[TOOL_CALLS]") != std::string::npos) return ToolSyntax::mistral;
  if (src.find("<|python_tag|>") != std::string::npos ||
      (src.find("<|start_header_id|>") != std::string::npos && src.find("\"parameters\"") != std::string::npos))
    return ToolSyntax::llama3;
  return ToolSyntax::none;
}

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::hermes: return "hermes";
    case ToolSyntax::llama3: return "llama3";
    case ToolSyntax::mistral: return "mistral";
    case ToolSyntax::mistral_v11: return "mistral-v11";
    default: return "none";
  }
}

ojson template_tool_calls(const ojson& tool_calls, const std::string& at) {
  if (!tool_calls.is_array()) bad(at + " must be a list", at, "invalid_type");
  ojson out = ojson::array();
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const ojson& tc = tool_calls[i];
    const std::string ti = at + "[" + std::to_string(i) + "]";
    if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
      bad(ti + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", ti, "invalid_type");
    const ojson& f = tc["function"];
    if (!f.contains("name") || !f["name"].is_string()) bad(ti + ".function.name must be a string", ti + ".function.name", "invalid_type");
    ojson args = ojson::object();
    if (f.contains("arguments")) {
      if (f["arguments"].is_string()) {
        try {
          args = ojson::parse(f["arguments"].get<std::string>());
        } catch (const std::exception&) {
          bad(ti + ".function.arguments is not valid JSON", ti + ".function.arguments", "invalid_value");
        }
      } else if (f["arguments"].is_object()) {
        args = f["arguments"];
      } else {
        bad(ti + ".function.arguments must be a JSON string", ti + ".function.arguments", "invalid_type");
      }
    }
    ojson o;
    if (tc.contains("id") && tc["id"].is_string()) o["id"] = tc["id"];
    o["type"] = "function";
    o["function"] = ojson{{"name", f["name"]}, {"arguments", args}};
    out.push_back(o);
  }
  return out;
}

void parse_tools(const ojson& body, const ApiContext& ctx, ParsedRequest& p, ojson& extra) {
  const ojson* tools = field(body, "tools");
  const ojson* choice = field(body, "tool_choice");
  if (const ojson* v = field(body, "parallel_tool_calls"); v && !v->is_boolean())
    bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls", "invalid_type");
  if (!tools || tools->empty()) {
    if (choice && !(choice->is_string() && (choice->get<std::string>() == "none" || choice->get<std::string>() == "auto")))
      bad("'tool_choice' needs 'tools'", "tool_choice", "invalid_value");
    if (tools && !tools->is_array()) bad("'tools' must be a list", "tools", "invalid_type");
    return;
  }
  if (!tools->is_array()) bad("'tools' must be a list", "tools", "invalid_type");
  // The template must render the tools, in a syntax this file parses back.
  std::string src;
  try {
    src = chat_template_source(ctx.chat_config);
  } catch (const std::exception&) {
  }
  if (src.find("tools") == std::string::npos)
    bad("the model's chat template does not render tools; 'tools' cannot be used with this model", "tools",
        "unsupported_parameter");
  p.tool_syntax = tool_syntax_of(src);
  if (p.tool_syntax == ToolSyntax::none)
    bad("the model's chat template has no tool-call syntax this server parses (Hermes/Qwen <tool_call>, Llama 3.x "
        "JSON {\"name\", \"parameters\"}, Mistral [TOOL_CALLS] and [TOOL_CALLS]name[ARGS]); serve it with --chat-template llama3 or mistral, or a "
        "template of one of those families",
        "tools", "unsupported_parameter");
  ojson list = ojson::array();
  std::vector<std::pair<std::string, ojson>> fns;  // (name, parameters schema)
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      bad(at + " must be {\"type\": \"function\", \"function\": {...}} (only function tools are supported)", at, "invalid_type");
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad(at + ".function.name must be a non-empty string", at + ".function.name", "invalid_type");
    ojson params = f.contains("parameters") ? f["parameters"] : ojson{{"type", "object"}, {"properties", ojson::object()}};
    if (!params.is_object()) bad(at + ".function.parameters must be a JSON Schema object", at + ".function.parameters", "invalid_type");
    fns.emplace_back(f["name"].get<std::string>(), params);
    list.push_back(t);
  }
  std::string mode = "auto", named;
  if (choice) {
    if (choice->is_string()) {
      mode = choice->get<std::string>();
      if (mode != "auto" && mode != "none" && mode != "required")
        bad("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\"}}", "tool_choice",
            "invalid_value");
    } else if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
      mode = "named";
      named = (*choice)["function"]["name"].get<std::string>();
    } else {
      bad("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\"}}", "tool_choice",
          "invalid_type");
    }
  }
  extra["tools"] = list;
  p.parse_tools = mode != "none";
  // v11's markers delimit a call's name: keep them (special tokens) in the generated text.
  if (p.parse_tools && p.tool_syntax == ToolSyntax::mistral_v11) p.opt.keep_special_tokens = true;
  if (mode == "required" || mode == "named") {
    if (p.opt.grammar)
      bad("'tool_choice' " + mode + " and a response format both constrain the output; give only one", "tool_choice",
          "invalid_value");
    // One call in the family's syntax, its arguments the function's schema:
    //   hermes  <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
    //   llama3  {"name": "NAME", "parameters": ARGS}
    //   mistral [{"name": "NAME", "arguments": ARGS}]   ([TOOL_CALLS] is a special token: not text)
    //   mistral-v11 [TOOL_CALLS]NAME[ARGS]ARGS   (the markers as text: the grammar's vocabulary
    //           has no special tokens, and the parser reads them either way)
    const ToolSyntax sx = p.tool_syntax;
    const char* args_key = sx == ToolSyntax::llama3 ? "parameters" : "arguments";
    std::string gbnf = sx == ToolSyntax::hermes ? "root ::= \"<tool_call>\\n\" (" : sx == ToolSyntax::mistral ? "root ::= \"[\" (" : "root ::= (";
    std::string rules;
    int n = 0;
    for (size_t i = 0; i < fns.size(); ++i) {
      if (mode == "named" && fns[i].first != named) continue;
      const std::string pre = "f" + std::to_string(i) + "-";
      rules += grammar::prefix_rules(schema_to_gbnf(fns[i].second, true, "tools[" + std::to_string(i) + "].function.parameters"), pre);
      if (sx == ToolSyntax::mistral_v11)
        gbnf += std::string(n++ ? " | " : " ") + grammar::gbnf_literal("[TOOL_CALLS]" + fns[i].first + "[ARGS]") + " " + pre + "root";
      else
        gbnf += std::string(n++ ? " | " : " ") +
                grammar::gbnf_literal("{\"name\": " + ojson(fns[i].first).dump() + ", \"" + args_key + "\": ") + " " + pre + "root \"}\"";
    }
    if (n == 0) bad("'tool_choice' names the function '" + named + "', which is not in 'tools'", "tool_choice", "invalid_value");
    gbnf += sx == ToolSyntax::hermes ? " ) \"\\n</tool_call>\"\n" : sx == ToolSyntax::mistral ? " ) \"]\"\n" : " )\n";
    gbnf += rules;
    p.opt.grammar = compile_grammar(ctx, gbnf, "tools");
  }
}

namespace {

std::mt19937_64& rng() {
  static thread_local std::mt19937_64 r(std::random_device{}());
  return r;
}

// "call_" + 16 hex digits; Mistral: 9 letters and digits (its template refuses other ids).
std::string call_id(ToolSyntax sx) {
  if (sx == ToolSyntax::mistral || sx == ToolSyntax::mistral_v11) {
    static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id(9, 'a');
    for (char& c : id) c = kAlnum[rng()() % 62];
    return id;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx", (unsigned long long)rng()());
  return buf;
}

bool mistral_id(const ojson& v) {
  if (!v.is_string() || v.get<std::string>().size() != 9) return false;
  for (char c : v.get<std::string>())
    if (!std::isalnum(static_cast<unsigned char>(c))) return false;
  return true;
}

// One call object ({"name", "arguments"} or Llama's {"name", "parameters"}) as an OpenAI tool
// call, or null when it is not one.
ojson tool_call_json(const ojson& j, ToolSyntax sx) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return nullptr;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  const ojson args = key ? j[key] : ojson::object();
  if (!args.is_object() && !args.is_string()) return nullptr;
  ojson f;
  f["name"] = j["name"];
  f["arguments"] = args.is_string() ? args.get<std::string>() : args.dump();
  ojson tc;
  const bool mistral = sx == ToolSyntax::mistral || sx == ToolSyntax::mistral_v11;
  tc["id"] = mistral && j.contains("id") && mistral_id(j["id"]) ? j["id"].get<std::string>() : call_id(sx);
  tc["type"] = "function";
  tc["function"] = f;
  return tc;
}

// A <tool_call> body as an OpenAI tool call, or null when it is not {"name", "arguments"}.
ojson tool_call_of(const std::string& inner) {
  ojson j;
  try {
    j = ojson::parse(inner);
  } catch (const std::exception&) {
    return nullptr;
  }
  return tool_call_json(j, ToolSyntax::hermes);
}

std::string rtrim(const std::string& s) { return s.substr(0, s.find_last_not_of(" \t\r\n") + 1); }

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") + 1 - b);
}

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";
constexpr const char* kPythonTag = "<|python_tag|>";
constexpr const char* kToolCalls = "[TOOL_CALLS]";

// A left-to-right scan of JSON text: feed(c) is true for a character outside strings, after
// updating the bracket depth ({ [ up, } ] down).
struct BracketScan {
  int depth = 0;
  bool in_str = false, esc = false;
  bool feed(char c) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      return false;
    }
    if (c == '"') {
      in_str = true;
      return false;
    }
    if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    return true;
  }
};

// Splits s at top-level `sep` (outside JSON strings, objects and arrays).
std::vector<std::string> split_top_level(const std::string& s, char sep) {
  std::vector<std::string> out;
  BracketScan sc;
  size_t from = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (sc.feed(s[i]) && s[i] == sep && sc.depth == 0) {
      out.push_back(s.substr(from, i - from));
      from = i + 1;
    }
  out.push_back(s.substr(from));
  return out;
}

// The end of the JSON object or array that starts at s[i] (one past its closing bracket), or npos
// when it does not close.
size_t json_end(const std::string& s, size_t i) {
  BracketScan sc;
  for (; i < s.size(); ++i)
    if (sc.feed(s[i]) && (s[i] == '}' || s[i] == ']') && sc.depth == 0) return i + 1;
  return std::string::npos;
}

constexpr const char* kCallId = "[CALL_ID]";
constexpr const char* kArgs = "[ARGS]";

// Mistral v11: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}, repeated ([CALL_ID] optional; [TOOL_CALLS]
// optional after the first call). Empty when `t` is not entirely calls.
ojson calls_v11(const std::string& t) {
  ojson calls = ojson::array();
  const std::string marker = "[TOOL_CALLS]";
  size_t i = 0;
  const auto skip_ws = [&] {
    while (i < t.size() && std::strchr(" \t\r\n", t[i])) ++i;
  };
  for (skip_ws(); i < t.size(); skip_ws()) {
    if (t.compare(i, marker.size(), marker) == 0) i += marker.size();
    const size_t b = i;
    while (i < t.size() && (std::isalnum(static_cast<unsigned char>(t[i])) || t[i] == '_' || t[i] == '-' || t[i] == '.')) ++i;
    if (i == b) return ojson::array();
    ojson j{{"name", t.substr(b, i - b)}};
    if (t.compare(i, std::strlen(kCallId), kCallId) == 0) {
      i += std::strlen(kCallId);
      const size_t e = t.find(kArgs, i);
      if (e == std::string::npos) return ojson::array();
      j["id"] = trim(t.substr(i, e - i));
      i = e;
    }
    if (t.compare(i, std::strlen(kArgs), kArgs) != 0) return ojson::array();
    i += std::strlen(kArgs);
    skip_ws();
    const size_t e = i < t.size() && t[i] == '{' ? json_end(t, i) : std::string::npos;
    if (e == std::string::npos) return ojson::array();
    j["arguments"] = ojson::parse(t.substr(i, e - i));
    const ojson tc = tool_call_json(j, ToolSyntax::mistral_v11);
    if (tc.is_null()) return ojson::array();
    calls.push_back(tc);
    i = e;
  }
  return calls;
}

// The calls in `body` (the text after the marker, or the whole message; mistral-v11: from the
// first marker on), or an empty array when it is not entirely calls.
ojson calls_of(const std::string& body, ToolSyntax sx) {
  ojson calls = ojson::array();
  const std::string t = trim(body);
  if (t.empty()) return calls;
  try {
    if (sx == ToolSyntax::mistral_v11) return calls_v11(t);
    if (sx == ToolSyntax::llama3) {
      for (const std::string& part : split_top_level(t, ';')) {
        const ojson tc = tool_call_json(ojson::parse(trim(part)), sx);
        if (tc.is_null()) return ojson::array();
        calls.push_back(tc);
      }
    } else {  // mistral: a list of calls (one object accepted too)
      const ojson j = ojson::parse(t);
      for (const ojson& c : j.is_array() ? j : ojson::array({j})) {
        const ojson tc = tool_call_json(c, sx);
        if (tc.is_null()) return ojson::array();
        calls.push_back(tc);
      }
    }
  } catch (const std::exception&) {
    return ojson::array();
  }
  return calls;
}

// Llama 3 / Mistral: [content] [marker] calls. Without the marker the message must start with
// the calls' first character ('{' / '[').
ToolCallSplit split_marked(const std::string& text, ToolSyntax sx) {
  const std::string marker = sx == ToolSyntax::llama3 ? kPythonTag : kToolCalls;
  ToolCallSplit out;
  const size_t m = text.find(marker);
  std::string before, body;
  if (m != std::string::npos) {
    before = text.substr(0, m);
    body = text.substr(sx == ToolSyntax::mistral_v11 ? m : m + marker.size());  // v11: each call has one
  } else {
    // Without the marker: the message must be the calls (Llama 3 / v0.3: their JSON). A v11 call
    // is a bare name without it: not told apart from text, so only marked v11 calls count.
    const std::string t = trim(text);
    if (t.empty() || sx == ToolSyntax::mistral_v11 || t[0] != (sx == ToolSyntax::llama3 ? '{' : '[')) {
      out.content = text;
      return out;
    }
    body = t;
  }
  out.tool_calls = calls_of(body, sx);
  out.content = out.tool_calls.empty() ? text : trim(before);
  return out;
}

}  // namespace

ToolCallSplit split_tool_calls(const std::string& text, ToolSyntax sx) {
  if (sx == ToolSyntax::llama3 || sx == ToolSyntax::mistral || sx == ToolSyntax::mistral_v11) return split_marked(text, sx);
  ToolCallSplit out;
  size_t at = 0;
  std::string content;
  while (at < text.size()) {
    const size_t o = text.find(kOpen, at);
    if (o == std::string::npos) {
      content += text.substr(at);
      break;
    }
    const size_t b = o + std::string(kOpen).size();
    const size_t c = text.find(kClose, b);
    const std::string inner = text.substr(b, c == std::string::npos ? std::string::npos : c - b);
    ojson tc = tool_call_of(trim(inner));
    if (tc.is_null()) {  // not a call: the text stays content
      content += text.substr(at, (c == std::string::npos ? text.size() : c + std::string(kClose).size()) - at);
    } else {
      content += text.substr(at, o - at);
      out.tool_calls.push_back(tc);
    }
    if (c == std::string::npos) break;
    at = c + std::string(kClose).size();
  }
  out.content = out.tool_calls.empty() ? content : trim(content);
  return out;
}

// Llama 3 / Mistral streaming: the calls are the end of the message, so text that may be calls
// (a message starting with '{' / '[', or anything from the marker on) is held until the end and
// parsed whole; text before it streams as content. A tail that may start the marker is held back.
std::vector<ojson> ToolCallStream::push_marked(const std::string& text, bool done) {
  std::vector<ojson> out;
  buf_ += text;
  const std::string marker = syntax_ == ToolSyntax::llama3 ? kPythonTag : kToolCalls;
  const char first = syntax_ == ToolSyntax::llama3 ? '{' : syntax_ == ToolSyntax::mistral ? '[' : '\0';  // v11: marked only
  if (!in_call_) {
    if (!started_) {
      const size_t b = buf_.find_first_not_of(" \t\r\n");
      if (b == std::string::npos && !done) return out;
      started_ = true;
      if (b != std::string::npos && (buf_[b] == first || marker.compare(0, std::min(marker.size(), buf_.size() - b), buf_, b,
                                                                        std::min(marker.size(), buf_.size() - b)) == 0))
        in_call_ = true;  // maybe calls from the start: hold everything
    }
    if (!in_call_) {
      const size_t m = buf_.find(marker);
      size_t emit_to = buf_.size();
      if (m != std::string::npos) {
        emit_to = m;
        in_call_ = true;
      } else if (!done) {
        for (size_t k = std::min(buf_.size(), marker.size() - 1); k > 0; --k)
          if (buf_.compare(buf_.size() - k, k, marker, 0, k) == 0) {
            emit_to = buf_.size() - k;
            break;
          }
      }
      if (emit_to > 0) out.push_back(ojson{{"content", buf_.substr(0, emit_to)}});
      buf_.erase(0, emit_to);
    }
  }
  if (in_call_ && done) {
    ToolCallSplit s = split_marked(buf_, syntax_);
    if (!s.content.empty()) out.push_back(ojson{{"content", s.content}});
    for (ojson& tc : s.tool_calls) {
      tc["index"] = n_calls_++;
      out.push_back(ojson{{"tool_calls", ojson::array({tc})}});
    }
    buf_.clear();
  }
  return out;
}

std::vector<ojson> ToolCallStream::push(const std::string& text, bool done) {
  if (syntax_ == ToolSyntax::llama3 || syntax_ == ToolSyntax::mistral || syntax_ == ToolSyntax::mistral_v11)
    return push_marked(text, done);
  std::vector<ojson> out;
  buf_ += text;
  const std::string open = kOpen, close = kClose;
  for (;;) {
    if (!in_call_) {
      const size_t o = buf_.find(open);
      if (o != std::string::npos) {
        // As split_tool_calls: the whitespace between content and a call is not content.
        const std::string before = n_calls_ ? trim(buf_.substr(0, o)) : rtrim(buf_.substr(0, o));
        if (!before.empty()) out.push_back(ojson{{"content", before}});
        buf_.erase(0, o + open.size());
        in_call_ = true;
        continue;
      }
      // Hold back a tail that may be the start of "<tool_call>", and trailing whitespace (not
      // content if a call follows it).
      size_t keep = 0;
      if (!done) {
        for (size_t k = std::min(buf_.size(), open.size() - 1); k > 0; --k)
          if (buf_.compare(buf_.size() - k, k, open, 0, k) == 0) {
            keep = k;
            break;
          }
        size_t end = buf_.size() - keep;
        while (end > 0 && std::strchr(" \t\r\n", buf_[end - 1])) --end;
        keep = buf_.size() - end;
      }
      std::string emit = buf_.substr(0, buf_.size() - keep);
      if (n_calls_) emit = trim(emit);
      if (!emit.empty()) out.push_back(ojson{{"content", emit}});
      buf_.erase(0, buf_.size() - keep);
      return out;
    }
    const size_t c = buf_.find(close);
    if (c == std::string::npos && !done) return out;
    const std::string inner = buf_.substr(0, c == std::string::npos ? std::string::npos : c);
    ojson tc = tool_call_of(trim(inner));
    if (tc.is_null()) {
      out.push_back(ojson{{"content", open + buf_.substr(0, c == std::string::npos ? buf_.size() : c + close.size())}});
    } else {
      tc["index"] = n_calls_++;
      out.push_back(ojson{{"tool_calls", ojson::array({tc})}});
    }
    buf_.erase(0, c == std::string::npos ? buf_.size() : c + close.size());
    in_call_ = false;
    if (buf_.empty()) return out;
  }
}

}  // namespace kvboost::server
