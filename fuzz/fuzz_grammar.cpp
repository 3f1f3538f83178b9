// Grammar compilation (issue 23: "grammar/JSON-schema compilation once it exists"): the texts a
// request's response_format / guided_* / grammar fields carry. The first byte picks the form --
// 0: GBNF, 1: JSON Schema, 2: regex, 3: a choice list (lines) -- the rest up to the first NUL is
// the text, the bytes after it a document fed to a matcher over a 256-token byte vocabulary (the
// mask and the accept path). kvboost::Error (GrammarError, UnsupportedFeature) is the expected
// answer to bad input; anything else escaping is a finding.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "kvboost/grammar.h"

namespace g = kvboost::grammar;

namespace {

std::shared_ptr<const g::TokenVocab> bytes_vocab() {
  static auto v = [] {
    std::vector<std::string> b;
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, char(i)));
    return std::make_shared<const g::TokenVocab>(b);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int form = data[0] % 4;
  const std::string all(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = all.find('\0');
  const std::string text = all.substr(0, nul), doc = nul == std::string::npos ? "" : all.substr(nul + 1);
  kvboost::fuzz::expect_clean([&] {
    std::string gbnf;
    if (form == 0) {
      gbnf = text;
    } else if (form == 1) {
      // The server hands the converter a parsed JSON value; text that is not JSON never gets here.
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return;
      gbnf = g::json_schema_to_gbnf(schema, doc.size() % 2 == 0);
    } else if (form == 2) {
      gbnf = g::regex_to_gbnf(text);
    } else {
      std::vector<std::string> choices;
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) choices.push_back(line);
      if (choices.empty()) return;
      gbnf = g::choice_to_gbnf(choices);
    }
    auto compiled = std::make_shared<const g::CompiledGrammar>(g::parse_gbnf(gbnf), bytes_vocab());
    g::Matcher m(compiled);
    // A bounded walk: the mask, then the document byte by byte (a rejected byte is skipped).
    (void)m.allowed();
    for (size_t i = 0; i < doc.size() && i < 256; ++i) {
      m.accept(int32_t(uint8_t(doc[i])));
      if (i % 16 == 0) (void)m.allowed();
    }
    (void)m.is_complete();
    (void)m.must_end();
  });
  return 0;
}
