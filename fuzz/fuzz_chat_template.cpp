// Chat-template rendering: the input is a Jinja template source (before the first NUL) and the
// content of one user message (after it), rendered as transformers' apply_chat_template would.
// Template errors are Errors; loops and recursion must stay bounded.
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "kvboost/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string src = all.substr(0, nul), msg = nul == std::string::npos ? "hi" : all.substr(nul + 1);
  nlohmann::ordered_json cfg;
  cfg["chat_template"] = src;
  cfg["bos_token"] = "<s>";
  cfg["eos_token"] = "</s>";
  std::string cfg_text;
  try {
    cfg_text = cfg.dump();  // invalid UTF-8 in the template: nothing to render
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  msgs.push_back({{"role", "system"}, {"content", "be brief"}});
  msgs.push_back({{"role", "user"}, {"content", msg}});
  kvboost::fuzz::expect_clean([&] {
    try {
      (void)kvboost::apply_chat_template(cfg_text, msgs, true);
    } catch (const nlohmann::json::exception&) {
      // invalid UTF-8 in the message content cannot be put in JSON: not a template finding
    }
  });
  return 0;
}
