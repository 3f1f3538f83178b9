// Structured output on the OpenAI schema: response_format, vLLM's guided_* fields, llama.cpp's
// grammar / json_schema (tools + tool_choice: api_tools.cpp). Every field either constrains the
// output through kvboost/grammar.h or is a 400 that names it; none is ignored.
#include "api.h"
#include "api_fields.h"
#include "kvboost/grammar.h"

namespace kvboost::server {

using namespace fields;

// Compiles GBNF for the served vocabulary; grammar errors and unsupported features are 400s
// naming `param`.
std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const ApiContext& ctx, const std::string& gbnf,
                                                                const std::string& param) {
  try {
    return grammar::CompiledGrammar::get(gbnf, grammar::TokenVocab::of(*ctx.tok));
  } catch (const grammar::GrammarError& e) {
    bad("'" + param + "': " + e.what(), param, "invalid_grammar");
  }
}

std::string schema_to_gbnf(const ojson& schema, bool strict, const std::string& param) {
  try {
    return grammar::json_schema_to_gbnf(schema, strict);
  } catch (const grammar::UnsupportedFeature& e) {
    bad("'" + param + "': " + e.what(), param, "unsupported_schema_feature");
  }
}

namespace {

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
      set(schema_to_gbnf(schema, st ? st->get<bool>() : false, "response_format.json_schema.schema"), "response_format");
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
      set(schema_to_gbnf(schema_object(*v, name, holder), true, name), name);
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
  if (field(body, "guided_whitespace_pattern"))
    bad("'guided_whitespace_pattern' is not supported (whitespace between JSON tokens is at most one space)",
        "guided_whitespace_pattern", "unsupported_parameter");
  if (const ojson* v = field(body, "guided_decoding_backend")) {
    // One backend (kvboost/grammar.h) serves every name; the output is constrained all the same.
    if (!v->is_string()) bad("'guided_decoding_backend' must be a string", "guided_decoding_backend", "invalid_type");
  }
  if (!param.empty()) p.opt.grammar = compile_grammar(ctx, gbnf, param);
}

}  // namespace kvboost::server
