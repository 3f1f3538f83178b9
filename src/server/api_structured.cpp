// Structured output and tools on the OpenAI schema: response_format, vLLM's guided_* fields,
// llama.cpp's grammar / json_schema, and tools + tool_choice (Hermes / Qwen2.5 <tool_call>
// syntax). Every field either constrains the output through kvboost/grammar.h or is a 400 that
// names it; none is ignored.
#include <random>

#include "api.h"
#include "kvboost/chat.h"
#include "kvboost/grammar.h"

namespace kvboost::server {
namespace {

[[noreturn]] void bad(const std::string& msg, const std::string& param, const std::string& code) {
  throw ApiError(400, msg, param, code);
}

const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// Compiles GBNF for the served vocabulary; grammar errors and unsupported features are 400s
// naming `param`.
std::shared_ptr<const grammar::CompiledGrammar> compile(const ApiContext& ctx, const std::string& gbnf, const std::string& param) {
  try {
    return grammar::CompiledGrammar::get(gbnf, grammar::TokenVocab::of(*ctx.tok));
  } catch (const grammar::GrammarError& e) {
    bad("'" + param + "': " + e.what(), param, "invalid_grammar");
  }
}

std::string schema_gbnf(const ojson& schema, bool strict, const std::string& param) {
  try {
    return grammar::json_schema_to_gbnf(schema, strict);
  } catch (const grammar::UnsupportedFeature& e) {
    bad("'" + param + "': " + e.what(), param, "unsupported_schema_feature");
  }
}

const ojson& schema_object(const ojson& v, const std::string& param, ojson& holder) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {  // vLLM accepts the schema as JSON text too
    try {
      holder = ojson::parse(v.get<std::string>());
    } catch (const std::exception& e) {
      bad("'" + param + "' is a string but not JSON: " + e.what(), param, "invalid_value");
    }
    if (holder.is_object() || holder.is_boolean()) return holder;
  }
  bad("'" + param + "' must be a JSON Schema object", param, "invalid_type");
}

}  // namespace

void parse_structured(const ojson& body, const ApiContext& ctx, ParsedRequest& p) {
  std::string gbnf, param;
  auto set = [&](std::string g, const char* name) {
    if (!param.empty())
      bad("'" + std::string(name) + "' and '" + param + "' both constrain the output; give only one", name, "invalid_value");
    gbnf = std::move(g);
    param = name;
  };
  if (const ojson* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("'response_format' must be an object with a string 'type'", "response_format", "invalid_type");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      set(grammar::json_gbnf(true), "response_format");
    } else if (type == "json_schema") {
      const ojson* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        bad("response_format json_schema needs 'json_schema': {\"name\", \"schema\", \"strict\"}", "response_format.json_schema",
            "missing_required_parameter");
      const ojson* sch = field(*js, "schema");
      if (!sch) bad("'response_format.json_schema.schema' is required", "response_format.json_schema.schema", "missing_required_parameter");
      const ojson* st = field(*js, "strict");
      if (st && !st->is_boolean()) bad("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict", "invalid_type");
      ojson holder;
      const ojson& schema = schema_object(*sch, "response_format.json_schema.schema", holder);
      set(schema_gbnf(schema, st ? st->get<bool>() : false, "response_format.json_schema.schema"), "response_format");
    } else if (type != "text") {
      bad("response_format type '" + type + "' is not supported (text, json_object, json_schema)", "response_format",
          "unsupported_parameter");
    }
  }
  // vLLM's and llama.cpp's fields. guided_json / json_schema: strict (no additional properties
  // unless the schema allows them), as xgrammar does by default.
  for (const char* name : {"guided_json", "json_schema"}) {
    if (const ojson* v = field(body, name)) {
      ojson holder;
      set(schema_gbnf(schema_object(*v, name, holder), true, name), name);
    }
  }
  if (const ojson* v = field(body, "guided_regex")) {
    if (!v->is_string()) bad("'guided_regex' must be a string", "guided_regex", "invalid_type");
    try {
      set(grammar::regex_to_gbnf(v->get<std::string>()), "guided_regex");
    } catch (const grammar::UnsupportedFeature& e) {
      bad(std::string("'guided_regex': ") + e.what(), "guided_regex", "unsupported_regex_feature");
    }
  }
  if (const ojson* v = field(body, "guided_choice")) {
    if (!v->is_array() || v->empty()) bad("'guided_choice' must be a non-empty list of strings", "guided_choice", "invalid_type");
    std::vector<std::string> cs;
    for (const auto& x : *v) {
      if (!x.is_string()) bad("'guided_choice' must be a list of strings", "guided_choice", "invalid_type");
      cs.push_back(x.get<std::string>());
    }
    set(grammar::choice_to_gbnf(cs), "guided_choice");
  }
  for (const char* name : {"guided_grammar", "grammar"}) {
    if (const ojson* v = field(body, name)) {
      if (!v->is_string()) bad(std::string("'") + name + "' must be a string (GBNF)", name, "invalid_type");
      if (!v->get<std::string>().empty()) set(v->get<std::string>(), name);
    }
  }
  if (const ojson* v = field(body, "guided_whitespace_pattern"))
    bad("'guided_whitespace_pattern' is not supported (whitespace between JSON tokens is at most one space)",
        "guided_whitespace_pattern", "unsupported_parameter");
  if (const ojson* v = field(body, "guided_decoding_backend")) {
    // One backend (kvboost/grammar.h) serves every name; the output is constrained all the same.
    if (!v->is_string()) bad("'guided_decoding_backend' must be a string", "guided_decoding_backend", "invalid_type");
  }
  if (!param.empty()) p.opt.grammar = compile(ctx, gbnf, param);
}

// ---- tools ---------------------------------------------------------------------------------------

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
  // The template must render the tools (Hermes/Qwen-style templates read `tools`).
  std::string src;
  try {
    src = chat_template_source(ctx.chat_config);
  } catch (const std::exception&) {
  }
  if (src.find("tools") == std::string::npos)
    bad("the model's chat template does not render tools; 'tools' cannot be used with this model", "tools",
        "unsupported_parameter");
  if (src.find("<tool_call>") == std::string::npos)
    bad("the model's chat template has no tool-call syntax this server parses (Hermes/Qwen <tool_call>)", "tools",
        "unsupported_parameter");
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
  if (mode == "required" || mode == "named") {
    if (p.opt.grammar)
      bad("'tool_choice' " + mode + " and a response format both constrain the output; give only one", "tool_choice",
          "invalid_value");
    // <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, ARGS the function's schema.
    std::string gbnf = "root ::= \"<tool_call>\\n\" (";
    std::string rules;
    int n = 0;
    for (size_t i = 0; i < fns.size(); ++i) {
      if (mode == "named" && fns[i].first != named) continue;
      const std::string pre = "f" + std::to_string(i) + "-";
      rules += grammar::prefix_rules(schema_gbnf(fns[i].second, true, "tools[" + std::to_string(i) + "].function.parameters"), pre);
      gbnf += std::string(n++ ? " | " : " ") + grammar::gbnf_literal("{\"name\": " + ojson(fns[i].first).dump() + ", \"arguments\": ") +
              " " + pre + "root \"}\"";
    }
    if (n == 0) bad("'tool_choice' names the function '" + named + "', which is not in 'tools'", "tool_choice", "invalid_value");
    gbnf += " ) \"\\n</tool_call>\"\n" + rules;
    p.opt.grammar = compile(ctx, gbnf, "tools");
  }
}

namespace {

std::string call_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx", (unsigned long long)rng());
  return buf;
}

// A <tool_call> body as an OpenAI tool call, or null when it is not {"name", "arguments"}.
ojson tool_call_of(const std::string& inner) {
  ojson j;
  try {
    j = ojson::parse(inner);
  } catch (const std::exception&) {
    return nullptr;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return nullptr;
  ojson args = j.contains("arguments") ? j["arguments"] : ojson::object();
  ojson f;
  f["name"] = j["name"];
  f["arguments"] = args.is_string() ? args.get<std::string>() : args.dump();
  ojson tc;
  tc["id"] = call_id();
  tc["type"] = "function";
  tc["function"] = f;
  return tc;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") + 1 - b);
}

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";

}  // namespace

ToolCallSplit split_tool_calls(const std::string& text) {
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

std::vector<ojson> ToolCallStream::push(const std::string& text, bool done) {
  std::vector<ojson> out;
  buf_ += text;
  const std::string open = kOpen, close = kClose;
  for (;;) {
    if (!in_call_) {
      const size_t o = buf_.find(open);
      if (o != std::string::npos) {
        const std::string before = n_calls_ ? trim(buf_.substr(0, o)) : buf_.substr(0, o);
        if (!before.empty()) out.push_back(ojson{{"content", before}});
        buf_.erase(0, o + open.size());
        in_call_ = true;
        continue;
      }
      // Hold back a tail that may be the start of "<tool_call>".
      size_t keep = 0;
      if (!done)
        for (size_t k = std::min(buf_.size(), open.size() - 1); k > 0; --k)
          if (buf_.compare(buf_.size() - k, k, open, 0, k) == 0) {
            keep = k;
            break;
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
