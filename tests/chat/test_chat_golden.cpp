// Golden prompts: every template renders every conversation byte for byte as transformers does
// (tests/chat/data/golden.json, written by tools/oracle/chat_template_oracle.py).
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "kvboost/chat.h"
#include "test_util.h"

namespace {

using nlohmann::ordered_json;

const ordered_json& golden() {
  static const ordered_json doc =
      ordered_json::parse(kvboost::read_file(kvboost::test::source_dir() + "/tests/chat/data/golden.json"));
  return doc;
}

// The instant the oracle rendered strftime_now() with: 2025-03-07 14:05:09.
kvboost::ChatRenderOptions fixed_now() {
  kvboost::ChatRenderOptions o;
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 14;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_wday = 5;
  tm.tm_yday = 65;
  o.now = tm;
  return o;
}

const ordered_json& find_template(const std::string& name) {
  for (const auto& t : golden()["templates"])
    if (t["name"] == name) return t;
  throw std::runtime_error("no golden template " + name);
}

void check_cases(const ordered_json& t, const std::function<std::string(const ordered_json&)>& render) {
  ASSERT_FALSE(t["cases"].empty());
  for (const auto& c : t["cases"]) {
    SCOPED_TRACE(t["name"].get<std::string>() + " / " + c["name"].get<std::string>());
    if (c.contains("error")) {
      try {
        render(c);
        ADD_FAILURE() << "expected raise_exception: " << c["error"];
      } catch (const kvboost::ChatTemplateError& e) {
        EXPECT_EQ(e.kind(), kvboost::ChatTemplateError::Kind::Raised) << e.what();
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(render(c), c["expected"].get<std::string>());
    }
  }
}

// Renders like the oracle's compiled template: tools/documents none, special tokens, kwargs.
void check_template_source(const ordered_json& t, const std::string& source) {
  auto tmpl = kvboost::ChatTemplate::parse(source, t["name"].get<std::string>());
  check_cases(t, [&](const ordered_json& c) {
    ordered_json ctx = {{"messages", c["messages"]}, {"add_generation_prompt", c["add_generation_prompt"]},
                        {"tools", nullptr}, {"documents", nullptr}};
    for (auto it = t["special_tokens"].begin(); it != t["special_tokens"].end(); ++it) ctx[it.key()] = it.value();
    for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) ctx[it.key()] = it.value();
    return tmpl.render(ctx, fixed_now());
  });
}

void check_own(const std::string& name) {
  const auto& t = find_template(name);
  check_template_source(t, kvboost::read_file(kvboost::test::source_dir() + "/tests/chat/data/" + t["file"].get<std::string>()));
}

// A tokenizer_config.json from ../shared, through apply_chat_template (its special tokens).
void check_shared_config(const std::string& name) {
  const auto& t = find_template(name);
  std::string path = kvboost::test::shared_path(t["shared"].get<std::string>());
  KVBOOST_REQUIRE_PATH(path);
  std::string cfg = kvboost::read_file(path);
  check_cases(t, [&](const ordered_json& c) {
    return kvboost::apply_chat_template(cfg, c["messages"], c["add_generation_prompt"].get<bool>(), c["kwargs"], fixed_now());
  });
}

}  // namespace

TEST(ChatGolden, Qwen25TokenizerConfig) { check_shared_config("qwen2.5"); }
TEST(ChatGolden, Llama3TokenizerConfig) { check_shared_config("llama3"); }
TEST(ChatGolden, Qwen25ChatTemplateJinjaFile) {
  const auto& t = find_template("qwen2.5-jinja-file");
  std::string path = kvboost::test::shared_path(t["shared"].get<std::string>());
  KVBOOST_REQUIRE_PATH(path);
  check_template_source(t, kvboost::read_file(path));
}
TEST(ChatGolden, ChatML) { check_own("chatml"); }
TEST(ChatGolden, MistralStyle) { check_own("mistral_style"); }
TEST(ChatGolden, Qwen3Style) { check_own("qwen3_style"); }
TEST(ChatGolden, Llama31Style) { check_own("llama31_style"); }

// Real model templates (tests/chat/data/real/, from llama.cpp's models/templates in the
// llama-cpp-python sdist), with the whole tool round trip: tool list, call, result, follow-up.
TEST(ChatGoldenReal, Llama31) { check_own("llama3.1-real"); }
TEST(ChatGoldenReal, Llama32) { check_own("llama3.2-real"); }
TEST(ChatGoldenReal, MistralNemo) { check_own("mistral-nemo-real"); }
TEST(ChatGoldenReal, MistralSmall32) { check_own("mistral-small-3.2-real"); }
TEST(ChatGoldenReal, DevstralSmall2507) { check_own("devstral-small-2507-real"); }
TEST(ChatGoldenReal, Ministral3) { check_own("ministral-3-2512-real"); }
TEST(ChatGoldenReal, Hermes3ToolUse) { check_own("hermes3-real"); }
TEST(ChatGoldenReal, Qwen25) { check_own("qwen2.5-real"); }
TEST(ChatGoldenReal, Qwen3) { check_own("qwen3-real"); }
