// Tool-call parsing (whole and streamed) and the structured-output fields' parsing, without
// sockets (api_structured.cpp).
#include <gtest/gtest.h>

#include "api.h"

using namespace kvboost::server;

TEST(ToolCalls, SplitIntoContentAndCalls) {
  const ToolCallSplit s = split_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"t\", \"arguments\": \"{}\"}</tool_call>");
  ASSERT_EQ(s.tool_calls.size(), 2u);
  EXPECT_EQ(s.content, "Let me check.");
  EXPECT_EQ(s.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(s.tool_calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(s.tool_calls[0]["type"], "function");
  EXPECT_EQ(s.tool_calls[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_NE(s.tool_calls[0]["id"], s.tool_calls[1]["id"]);
  EXPECT_EQ(s.tool_calls[1]["function"]["arguments"], "{}");
  // Not a call: stays content.
  const ToolCallSplit n = split_tool_calls("a <tool_call>not json</tool_call> b");
  EXPECT_TRUE(n.tool_calls.empty());
  EXPECT_EQ(n.content, "a <tool_call>not json</tool_call> b");
  EXPECT_TRUE(split_tool_calls("plain").tool_calls.empty());
}

TEST(ToolCalls, StreamHoldsBackAPossibleTagAndEmitsWholeCalls) {
  const std::string text = "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  // Every split point of the text gives the same deltas.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallStream ts;
    std::vector<nlohmann::ordered_json> ds = ts.push(text.substr(0, cut), false);
    for (auto& d : ts.push(text.substr(cut), true)) ds.push_back(d);
    std::string content;
    int calls = 0;
    for (const auto& d : ds) {
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        ++calls;
        EXPECT_EQ(d["tool_calls"][0]["index"], 0);
        EXPECT_EQ(d["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
      }
    }
    EXPECT_EQ(content, "Hi") << cut;  // as split_tool_calls: the space before the call is not content
    EXPECT_EQ(calls, 1) << cut;
    EXPECT_EQ(ts.n_calls(), 1);
  }
  ToolCallStream ts;
  auto a = ts.push("x <tool", false);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0]["content"], "x");  // " <tool" held back (a call may follow)
  auto b = ts.push("box>", true);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0]["content"], " <toolbox>");
}
