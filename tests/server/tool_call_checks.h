// Shared by the tool-call tests (test_api_tools.cpp, test_api_tools_real.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api.h"

namespace kvboost::server::test_tools {

// Streaming at every split point gives the whole-text result: content, then the calls in order.
inline void expect_stream_equals_whole(const std::string& text, ToolSyntax sx) {
  const ToolCallSplit whole = split_tool_calls(text, sx);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallStream ts(sx);
    std::vector<ojson> ds = ts.push(text.substr(0, cut), false);
    for (auto& d : ts.push(text.substr(cut), true)) ds.push_back(d);
    std::string content;
    ojson calls = ojson::array();
    for (const auto& d : ds) {
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        EXPECT_EQ(d["tool_calls"][0]["index"], calls.size());
        calls.push_back(d["tool_calls"][0]);
      }
    }
    EXPECT_EQ(content, whole.content) << "cut " << cut;
    ASSERT_EQ(calls.size(), whole.tool_calls.size()) << "cut " << cut;
    for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i]["function"], whole.tool_calls[i]["function"]);
    EXPECT_EQ(ts.n_calls(), int(calls.size()));
  }
}

}  // namespace kvboost::server::test_tools
