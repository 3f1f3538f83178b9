// Tool calls through the real chat templates of the model families (tests/chat/data/real/, from
// llama.cpp's models/templates in the llama-cpp-python sdist): the syntax each template implies,
// the assistant turn it renders for OpenAI tool_calls read back into the same calls (whole and
// streamed at every split point, with the special-token marker as the detokenizer keeps or drops
// it), the follow-up turn with the tool's answer, and a tool_choice "required" grammar whose
// language the parser reads.
#include <gtest/gtest.h>

#include "api.h"
#include "kvboost/chat.h"
#include "kvboost/grammar.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"
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
  {"type": "function", "function": {"name": "get_time", "description": "Local time in a UTC offset zone", "parameters": {"type": "object",
   "properties": {"zone": {"type": "integer"}}}}}])");

// (Hermes 3's template concatenates each tool's description: it needs one.)
// As an OpenAI client sends them back (arguments a JSON string; ids Mistral accepts).
const ojson kCalls = ojson::parse(R"([
  {"id": "aB3dE5gH9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"c\"}"}},
  {"id": "Zz0Yy1Xx2", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": -3}"}}])");

struct Real {
  const char* file;
  const char* specials;  // the tokenizer_config.json fields the template reads
  ToolSyntax syntax;
  size_t max_calls;     // Llama 3.x templates refuse more than one call per message
  const char* stop;     // the end-of-turn token that ends generation (not part of the message)
  const char* marker;   // a special token the detokenizer drops, or ""
  const char* content;  // the message's text besides the calls
};

const Real kReal[] = {
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})",
     ToolSyntax::llama3, 1, "<|eot_id|>", "<|python_tag|>", ""},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})",
     ToolSyntax::llama3, 1, "<|eot_id|>", "<|python_tag|>", ""},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})", ToolSyntax::mistral, 2,
     "</s>", "[TOOL_CALLS]", ""},
    // Tokenizer v11+: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}; the server keeps the markers (special
    // tokens) in the text of such a request.
    {"Mistral-Small-3.2-24B-Instruct-2506.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})", ToolSyntax::mistral_v11,
     2, "</s>", "", ""},
    {"unsloth-mistral-Devstral-Small-2507.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})", ToolSyntax::mistral_v11,
     2, "</s>", "", ""},
    {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})",
     ToolSyntax::mistral_v11, 2, "</s>", "", ""},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"})",
     ToolSyntax::hermes, 2, "<|im_end|>", "", ""},
    {"Qwen-Qwen2.5-7B-Instruct.jinja", R"({"eos_token": "<|im_end|>"})", ToolSyntax::hermes, 2, "<|im_end|>", "", ""},
    // Qwen3 renders the last assistant turn with an empty reasoning block: it stays content.
    {"Qwen-Qwen3-0.6B.jinja", R"({"eos_token": "<|im_end|>"})", ToolSyntax::hermes, 2, "<|im_end|>", "", "<think>\n\n</think>"},
};

std::string config_of(const Real& r) {
  return with_chat_template(r.specials, read_file(kvboost::test::source_dir() + "/tests/chat/data/real/" + r.file));
}

ojson user(const std::string& text) { return ojson{{"role", "user"}, {"content", text}}; }

// The text the template renders for the assistant's tool-call turn, minus the end-of-turn token
// (content "", as the server hands a null content to the template).
std::string assistant_turn(const std::string& cfg, const Real& r, size_t n_calls) {
  ojson msgs = ojson::array({user("Weather and time in Zürich?")});
  const std::string before = apply_chat_template(cfg, msgs, true, ojson{{"tools", kTools}});
  ojson calls = ojson::array();
  for (size_t i = 0; i < n_calls; ++i) calls.push_back(kCalls[i]);
  msgs.push_back(ojson{{"role", "assistant"}, {"content", ""}, {"tool_calls", template_tool_calls(calls, "messages")}});
  const std::string all = apply_chat_template(cfg, msgs, false, ojson{{"tools", kTools}});
  EXPECT_EQ(all.compare(0, before.size(), before), 0) << all;
  std::string turn = all.substr(before.size());
  const std::string stop = r.stop;
  // Some templates end the turn with the stop token and a newline.
  while (!turn.empty() && (turn.back() == '\n')) turn.pop_back();
  EXPECT_GE(turn.size(), stop.size()) << turn;
  if (turn.size() >= stop.size() && turn.compare(turn.size() - stop.size(), stop.size(), stop) == 0)
    turn.resize(turn.size() - stop.size());
  else
    ADD_FAILURE() << "the turn does not end with " << stop << ": " << turn;
  return turn;
}

void expect_calls(const ojson& got, size_t n, ToolSyntax sx, bool with_ids) {
  ASSERT_EQ(got.size(), n) << got.dump();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i]["function"]["name"], kCalls[i]["function"]["name"]);
    EXPECT_EQ(ojson::parse(got[i]["function"]["arguments"].get<std::string>()),
              ojson::parse(kCalls[i]["function"]["arguments"].get<std::string>()));
    if (sx == ToolSyntax::mistral || (sx == ToolSyntax::mistral_v11 && with_ids)) {
      EXPECT_EQ(got[i]["id"], kCalls[i]["id"]);  // the ids the model wrote
    }
  }
}

}  // namespace

TEST(RealToolTemplates, SyntaxFromTheTemplate) {
  for (const Real& r : kReal) {
    SCOPED_TRACE(r.file);
    EXPECT_EQ(tool_syntax_of(chat_template_source(config_of(r))), r.syntax);
  }
}

TEST(RealToolTemplates, RenderedCallsParseBack) {
  for (const Real& r : kReal) {
    const std::string cfg = config_of(r);
    for (size_t n = 1; n <= r.max_calls; ++n) {
      const std::string turn = assistant_turn(cfg, r, n);
      SCOPED_TRACE(std::string(r.file) + ": " + turn);
      std::vector<std::string> texts = {turn};
      const std::string marker = r.marker;
      if (!marker.empty() && turn.find(marker) != std::string::npos) {  // as the detokenizer gives it
        std::string dropped = turn;
        dropped.erase(dropped.find(marker), marker.size());
        texts.push_back(dropped);
      }
      for (const std::string& text : texts) {
        const ToolCallSplit s = split_tool_calls(text, r.syntax);
        EXPECT_EQ(s.content, r.content);
        // (Devstral's and Ministral 3's templates write no [CALL_ID]: their calls get new ids.)
        expect_calls(s.tool_calls, n, r.syntax, text.find("[CALL_ID]") != std::string::npos || r.syntax == ToolSyntax::mistral);
        expect_stream_equals_whole(text, r.syntax);
      }
    }
  }
}

TEST(RealToolTemplates, FollowUpTurnRendersTheToolAnswer) {
  for (const Real& r : kReal) {
    SCOPED_TRACE(r.file);
    const std::string cfg = config_of(r);
    const ojson msgs = ojson::array(
        {user("Weather in Zürich?"),
         ojson{{"role", "assistant"}, {"content", ""}, {"tool_calls", template_tool_calls(ojson::array({kCalls[0]}), "m")}},
         ojson{{"role", "tool"}, {"tool_call_id", "aB3dE5gH9"}, {"name", "get_weather"}, {"content", "{\"temp\": 21}"}}});
    const std::string out = apply_chat_template(cfg, msgs, true, ojson{{"tools", kTools}});
    EXPECT_NE(out.find("get_weather"), std::string::npos) << out;  // the tool list and the call
    EXPECT_NE(out.find("21"), std::string::npos) << out;           // the tool's answer
    if (r.syntax == ToolSyntax::mistral || std::string(r.file).rfind("Mistral-Small", 0) == 0) {
      EXPECT_NE(out.find("aB3dE5gH9"), std::string::npos) << out;
    }
  }
}

TEST(RealToolTemplates, RequiredChoiceGrammarAcceptsWhatTheParserReads) {
  // tool_choice required through each real template: the grammar's language is one call in the
  // family's syntax, and what the model is forced to write parses back into that call.
  const std::string dir = test::shared_path("tokenizers/llama3");
  KVBOOST_REQUIRE_PATH(dir + "/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_dir(dir);
  for (const Real& r : kReal) {
    SCOPED_TRACE(r.file);
    ApiContext ctx;
    ctx.tok = &tok;
    ctx.context_length = 4096;
    ctx.max_prompt_tokens = 4000;
    ctx.vocab_size = tok.vocab_size();
    ctx.model_name = "m";
    ctx.chat_config = config_of(r);
    ctx.has_chat_template = true;
    const ojson body = {{"messages", ojson::array({user("Paris?")})}, {"tools", kTools}, {"tool_choice", "required"}};
    const ParsedRequest p = parse_chat(body, ctx);
    ASSERT_TRUE(p.opt.grammar);
    EXPECT_EQ(p.tool_syntax, r.syntax);
    EXPECT_EQ(p.opt.keep_special_tokens, r.syntax == ToolSyntax::mistral_v11);
    // The marker, where the family has one, is a special token: not text the grammar constrains.
    const std::string text = r.syntax == ToolSyntax::hermes
                                 ? "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
                             : r.syntax == ToolSyntax::llama3 ? "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"
                             : r.syntax == ToolSyntax::mistral_v11 ? "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
                                                              : "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]";
    grammar::Matcher m(p.opt.grammar);
    EXPECT_TRUE(m.accept_bytes(text) && m.is_complete()) << text;
    grammar::Matcher bad(p.opt.grammar);
    EXPECT_FALSE(bad.accept_bytes("{\"name\": \"get_wind\"")) << "a function not in tools";
    const ToolCallSplit s = split_tool_calls(text, r.syntax);
    ASSERT_EQ(s.tool_calls.size(), 1u);
    EXPECT_EQ(s.tool_calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(ojson::parse(s.tool_calls[0]["function"]["arguments"].get<std::string>()), ojson::parse(R"({"city": "Paris"})"));
  }
}
