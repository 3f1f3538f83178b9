// Tool-call syntaxes of the model families (api_tools.cpp): which one a chat template implies,
// and the calls read back — whole and streamed at every split point — from the text the
// templates render for an assistant turn with tool_calls (Llama 3.x through the real Llama 3
// tokenizer and its detokenizer, as the server streams it; Mistral v0.3).
#include <gtest/gtest.h>

#include <filesystem>

#include "api.h"
#include "kvboost/chat.h"
#include "kvboost/grammar.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"
#include "tool_call_checks.h"

using namespace kvboost;
using namespace kvboost::server;
using kvboost::server::test_tools::expect_stream_equals_whole;

namespace {

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
   "properties": {"zone": {"type": "integer"}}}}}])");

// The OpenAI-form calls a client sends back in the follow-up turn (arguments a JSON string).
const ojson kCalls = ojson::parse(R"([
  {"id": "aB3dE5gH9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}},
  {"id": "Zz0Yy1Xx2", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": -3}"}}])");

std::string config_with(const std::string& name, const std::string& base = "") {
  return with_chat_template(base.empty() ? R"({"bos_token": "<s>", "eos_token": "</s>"})" : base, *builtin_chat_template(name));
}

// The text a template renders for the assistant's tool-call turn: the conversation with it,
// minus the conversation before it (rendered with the generation prompt).
std::string assistant_turn(const std::string& cfg, size_t n_calls) {
  ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "Weather and time in Paris?"}}});
  const std::string before = apply_chat_template(cfg, msgs, true, ojson{{"tools", kTools}});
  ojson calls = ojson::array();
  for (size_t i = 0; i < n_calls; ++i) calls.push_back(kCalls[i]);
  msgs.push_back(ojson{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", template_tool_calls(calls, "messages")}});
  const std::string all = apply_chat_template(cfg, msgs, false, ojson{{"tools", kTools}});
  EXPECT_EQ(all.compare(0, before.size(), before), 0) << all;
  return all.substr(before.size());
}

void expect_calls(const ojson& got, size_t n, ToolSyntax sx) {
  ASSERT_EQ(got.size(), n) << got.dump();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i]["type"], "function");
    EXPECT_EQ(got[i]["function"]["name"], kCalls[i]["function"]["name"]);
    EXPECT_EQ(ojson::parse(got[i]["function"]["arguments"].get<std::string>()),
              ojson::parse(kCalls[i]["function"]["arguments"].get<std::string>()));
    const std::string id = got[i]["id"];
    if (sx == ToolSyntax::mistral) {
      EXPECT_EQ(id.size(), 9u) << id;
      for (char c : id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    } else {
      EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
    }
  }
}

}  // namespace

TEST(ToolSyntax, FromTheChatTemplate) {
  EXPECT_EQ(tool_syntax_of(*builtin_chat_template("llama3")), ToolSyntax::llama3);
  EXPECT_EQ(tool_syntax_of(*builtin_chat_template("mistral")), ToolSyntax::mistral);
  EXPECT_EQ(tool_syntax_of(*builtin_chat_template("chatml")), ToolSyntax::none);
  EXPECT_EQ(tool_syntax_of(*builtin_chat_template("gemma")), ToolSyntax::none);
  // The real Llama 3 (first release) template renders no tools; Qwen2.5's is Hermes-style.
  const std::string l3 = test::shared_path("tokenizers/llama3/tokenizer_config.json");
  const std::string qw = test::shared_path("tokenizers/qwen2.5/tokenizer_config.json");
  KVBOOST_REQUIRE_PATH(l3);
  KVBOOST_REQUIRE_PATH(qw);
  EXPECT_EQ(tool_syntax_of(chat_template_source(read_file(l3))), ToolSyntax::none);
  EXPECT_EQ(tool_syntax_of(chat_template_source(read_file(qw))), ToolSyntax::hermes);
}

TEST(ToolSyntax, TemplatesWithoutToolsRenderAsBefore) {
  // No `tools`: byte for byte the plain templates (tests/chat covers them; here the tool
  // branches must stay out of the way even with a 'tool' message absent).
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])");
  EXPECT_EQ(apply_chat_template(config_with("llama3"), msgs, false),
            "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            "Hello!<|eot_id|>");
  EXPECT_EQ(apply_chat_template(config_with("mistral"), msgs, false), "<s>[INST] Hi [/INST]Hello!</s>");
}

TEST(ToolCalls, Llama3FromTheRealTokenizer) {
  // The Llama 3 template's assistant turn, through the real Llama 3 tokenizer and the stream
  // decoder the server uses (special tokens dropped), parses back into the calls.
  const std::string dir = test::shared_path("tokenizers/llama3");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_dir(dir);
  const std::string cfg = config_with("llama3", read_file(dir + "/tokenizer_config.json"));
  for (size_t n : {1u, 2u}) {
    const std::string turn = assistant_turn(cfg, n);
    SCOPED_TRACE(turn);
    // The generation prompt ends with the assistant header: the model writes the call(s), then
    // <|eot_id|> (a stop token, dropped by the stream decoder like every special token).
    EXPECT_EQ(turn.rfind("{\"name\": \"get_weather\", \"parameters\": {", 0), 0u);
    EXPECT_EQ(turn.substr(turn.size() - 10), "<|eot_id|>");
    const std::vector<int32_t> ids = tok.encode(turn, false);
    StreamDecoder dec(tok);
    std::string text;
    for (int32_t id : ids) text += dec.push(id);
    text += dec.finish();
    EXPECT_EQ(text.find("<|eot_id|>"), std::string::npos);
    const ToolCallSplit s = split_tool_calls(text, ToolSyntax::llama3);
    EXPECT_TRUE(s.content.empty()) << s.content;
    expect_calls(s.tool_calls, n, ToolSyntax::llama3);
    expect_stream_equals_whole(text, ToolSyntax::llama3);
  }
}

TEST(ToolCalls, Llama3Variants) {
  // <|python_tag|> (kept as text by a detokenizer that does not skip it), text before it, ';'.
  const std::string call = R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}})";
  for (const std::string& t : {"<|python_tag|>" + call, " \n" + call, "Sure.<|python_tag|>" + call,
                               call + "; " + R"({"name": "get_time", "parameters": {"zone": -3}})"}) {
    SCOPED_TRACE(t);
    const ToolCallSplit s = split_tool_calls(t, ToolSyntax::llama3);
    expect_calls(s.tool_calls, t.find("get_time") != std::string::npos ? 2 : 1, ToolSyntax::llama3);
    EXPECT_EQ(s.content, t.rfind("Sure.", 0) == 0 ? "Sure." : "");
    expect_stream_equals_whole(t, ToolSyntax::llama3);
  }
  // Not calls: the text stays content, whole and streamed.
  for (const std::string& t : {std::string("Paris is sunny."), std::string("{not json"), std::string(R"({"city": "Paris"})"),
                               std::string("a;b {\"name\": 1}")}) {
    const ToolCallSplit s = split_tool_calls(t, ToolSyntax::llama3);
    EXPECT_TRUE(s.tool_calls.empty()) << t;
    EXPECT_EQ(s.content, t);
    expect_stream_equals_whole(t, ToolSyntax::llama3);
  }
  // Plain text streams as it comes (nothing held back but a possible "<|python_tag|>" start).
  ToolCallStream ts(ToolSyntax::llama3);
  auto a = ts.push("Paris is <|py", false);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0]["content"], "Paris is ");
}

TEST(ToolCalls, MistralFromItsTemplate) {
  const std::string cfg = config_with("mistral");
  for (size_t n : {1u, 2u}) {
    const std::string turn = assistant_turn(cfg, n);
    SCOPED_TRACE(turn);
    ASSERT_EQ(turn.rfind("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {", 0), 0u);
    ASSERT_GE(turn.size(), 4u);
    ASSERT_EQ(turn.substr(turn.size() - 4), "</s>");
    const std::string gen = turn.substr(0, turn.size() - 4);  // </s> is the stop token
    for (const std::string& text : {gen, gen.substr(std::string("[TOOL_CALLS]").size())}) {  // marker kept / dropped
      const ToolCallSplit s = split_tool_calls(text, ToolSyntax::mistral);
      EXPECT_TRUE(s.content.empty()) << s.content;
      expect_calls(s.tool_calls, n, ToolSyntax::mistral);
      // The ids the model wrote (the follow-up turn's) are kept.
      EXPECT_EQ(s.tool_calls[0]["id"], "aB3dE5gH9");
      expect_stream_equals_whole(text, ToolSyntax::mistral);
    }
  }
  // A call without an id gets 9 letters and digits; text stays content.
  const ToolCallSplit s = split_tool_calls(R"(Checking. [TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": 1}}])", ToolSyntax::mistral);
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.content, "Checking.");
  EXPECT_EQ(s.tool_calls[0]["id"].get<std::string>().size(), 9u);
  EXPECT_TRUE(split_tool_calls("[1, 2]", ToolSyntax::mistral).tool_calls.empty());
  EXPECT_EQ(split_tool_calls("[1, 2]", ToolSyntax::mistral).content, "[1, 2]");
  // The follow-up turn renders the ids and the tool's answer.
  ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "Weather?"}},
                             ojson{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", template_tool_calls(ojson::array({kCalls[0]}), "m")}},
                             ojson{{"role", "tool"}, {"tool_call_id", "aB3dE5gH9"}, {"content", "{\"temp\": 21}"}}});
  const std::string r = apply_chat_template(cfg, msgs, false, ojson{{"tools", kTools}});
  EXPECT_NE(r.find("[AVAILABLE_TOOLS] [{\"type\": \"function\""), std::string::npos) << r;
  EXPECT_NE(r.find(R"([TOOL_RESULTS] {"content": "{\"temp\": 21}", "call_id": "aB3dE5gH9"}[/TOOL_RESULTS])"), std::string::npos) << r;
}

TEST(ToolCalls, RequiredChoiceGrammarAcceptsWhatTheParserReads) {
  // tool_choice required: the grammar's language is calls in the family's syntax, so what the
  // model is forced to write always parses.
  const std::string dir = test::shared_path("tokenizers/llama3");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_dir(dir);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"llama3", R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}})"},
           {"mistral", R"([{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}])"}}) {
    ApiContext ctx;
    ctx.tok = &tok;
    ctx.context_length = 4096;
    ctx.max_prompt_tokens = 4000;
    ctx.vocab_size = tok.vocab_size();
    ctx.model_name = "m";
    ctx.chat_config = config_with(name, read_file(dir + "/tokenizer_config.json"));
    ctx.has_chat_template = true;
    const ojson body = {{"messages", ojson::array({ojson{{"role", "user"}, {"content", "Paris?"}}})},
                        {"tools", kTools},
                        {"tool_choice", "required"}};
    const ParsedRequest p = parse_chat(body, ctx);
    ASSERT_TRUE(p.opt.grammar) << name;
    EXPECT_TRUE(p.parse_tools);
    EXPECT_EQ(p.tool_syntax, name == "llama3" ? ToolSyntax::llama3 : ToolSyntax::mistral);
    grammar::Matcher m(p.opt.grammar);
    EXPECT_TRUE(m.accept_bytes(text) && m.is_complete()) << name << ": " << text;
    grammar::Matcher hermes(p.opt.grammar);
    EXPECT_FALSE(hermes.accept_bytes("<tool_call>")) << name;
    EXPECT_EQ(split_tool_calls(text, p.tool_syntax).tool_calls.size(), 1u);
  }
}
