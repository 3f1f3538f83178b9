// An OpenAI request body -> ParsedRequest (src/server/api.cpp), for both endpoints, with a
// byte-level fixture tokenizer and a ChatML template: only ApiError (4xx) may come out, and a
// request that parses must be within the context.
#include <cstdint>
#include <string>

#include "api.h"
#include "kvboost/tokenizer.h"

namespace {
const kvboost::server::ApiContext& context() {
  static kvboost::Tokenizer tok = kvboost::Tokenizer::from_json(
      kvboost::make_fixture_tokenizer_json("bytelevel", 512), kvboost::make_fixture_tokenizer_config_json("bytelevel"));
  static kvboost::server::ApiContext ctx = [] {
    kvboost::server::ApiContext c;
    c.tok = &tok;
    c.context_length = 256;
    c.max_prompt_tokens = 200;
    c.vocab_size = 512;
    c.n_layers = 4;
    c.model_name = "tiny";
    c.chat_config = kvboost::make_fixture_tokenizer_config_json("bytelevel");
    c.has_chat_template = true;
    return c;
  }();
  return ctx;
}
}  // namespace

// The fixture tokenizer is trained before the first input (not inside libFuzzer's per-input
// timeout; see fuzz_tokenizer_encode.cpp).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)context();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvboost::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int which = 0; which < 3; ++which) {
    try {
      const ojson body = parse_body(text);
      ParsedRequest p = which == 0 ? parse_completion(body, context())
                        : which == 1 ? parse_chat(body, context())
                                     : parse_warm(body, context());
      if (which < 2 && (p.opt.max_new_tokens < 1 ||
                        int64_t(p.prompt_ids.size()) + p.opt.max_new_tokens > context().context_length))
        __builtin_trap();
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status > 499 || std::string(e.what()).empty()) __builtin_trap();
    } catch (const kvboost::Error&) {
      // e.g. a chat template error: a clear message, converted to 400 by the server
    }
  }
  return 0;
}
