// The built-in --chat-template formats render each family's documented prompt layout.
#include <gtest/gtest.h>

#include "kvboost/chat.h"

namespace {
using kvboost::apply_chat_template;
using ojson = nlohmann::ordered_json;

std::string render(const std::string& name, const ojson& msgs, bool gen = true) {
  const std::string cfg =
      kvboost::with_chat_template(R"({"bos_token": "<s>", "eos_token": "</s>"})", *kvboost::builtin_chat_template(name));
  return apply_chat_template(cfg, msgs, gen);
}

const ojson kConv = ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                                  {{"role", "user"}, {"content", "Hi"}},
                                  {{"role", "assistant"}, {"content", "Hello!"}},
                                  {{"role", "user"}, {"content", "Bye"}}});
}  // namespace

TEST(ChatNamed, ListsTheFourFormats) {
  EXPECT_EQ(kvboost::builtin_chat_template_names(), (std::vector<std::string>{"chatml", "llama3", "gemma", "mistral"}));
  EXPECT_FALSE(kvboost::builtin_chat_template("vicuna").has_value());
  EXPECT_EQ(kvboost::builtin_chat_template_end("gemma"), "<end_of_turn>");
  EXPECT_EQ(kvboost::builtin_chat_template_end("nope"), "");
}

TEST(ChatNamed, Chatml) {
  EXPECT_EQ(render("chatml", kConv),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
            "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render("chatml", ojson::array({{{"role", "user"}, {"content", "Hi"}}}), false), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatNamed, Llama3) {
  EXPECT_EQ(render("llama3", kConv),
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatNamed, GemmaFoldsTheSystemPromptIntoTheFirstTurn) {
  EXPECT_EQ(render("gemma", kConv),
            "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render("gemma", ojson::array({{{"role", "user"}, {"content", " Hi "}}})),
            "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatNamed, Mistral) {
  EXPECT_EQ(render("mistral", kConv), "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
}

TEST(ChatNamed, WithChatTemplateKeepsTheSpecialTokensAndRejectsBadJson) {
  const std::string cfg = kvboost::with_chat_template(R"({"bos_token": "<B>", "chat_template": "old"})", "{{ bos_token }}x");
  EXPECT_EQ(apply_chat_template(cfg, ojson::array(), false), "<B>x");
  EXPECT_EQ(apply_chat_template(kvboost::with_chat_template("", "y"), ojson::array(), false), "y");
  EXPECT_THROW(kvboost::with_chat_template("{not json", "x"), kvboost::Error);
}
