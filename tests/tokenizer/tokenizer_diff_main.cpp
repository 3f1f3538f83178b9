// Differential test against Hugging Face `tokenizers`: compares our encode/decode, string by
// string, with the JSON that tools/oracle/tokenizer_oracle.py wrote. The JSON path comes from
// $KVBOOST_TOKENIZER_ORACLE_JSON (ctest sets it; see tests/oracle/CMakeLists.txt).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"
#include "test_util.h"

using kvboost::Tokenizer;
using nlohmann::json;

namespace {

std::string oracle_path() {
  const char* env = std::getenv("KVBOOST_TOKENIZER_ORACLE_JSON");
  return env && *env ? env : kvboost::test::binary_dir() + "/tests/oracle/tokenizer_oracle/tokenizer_oracle.json";
}

std::string escaped(const std::string& s) {
  std::ostringstream o;
  for (unsigned char c : s) {
    if (c == '\n') o << "\\n";
    else if (c == '\t') o << "\\t";
    else if (c == '\r') o << "\\r";
    else if (c == '"') o << "\\\"";
    else if (c < 0x20 || c >= 0x80) {
      char b[8];
      snprintf(b, sizeof b, "\\x%02x", c);
      o << b;
    } else o << c;
  }
  return o.str();
}

std::string ids_str(const std::vector<int32_t>& v) {
  std::ostringstream o;
  for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  return o.str();
}

const json& oracle() {
  static json j = [] {
    std::string p = oracle_path();
    if (!kvboost::file_exists(p)) return json();
    return json::parse(kvboost::read_file(p));
  }();
  return j;
}

class TokenizerDiff : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerDiff, MatchesHuggingFace) {
  const std::string name = GetParam();
  KVBOOST_REQUIRE_PATH(oracle_path());
  const json& o = oracle();
  if (o.contains("skip")) {
    if (kvboost::test::oracles_required()) FAIL() << o["skip"].get<std::string>();
    GTEST_SKIP() << o["skip"].get<std::string>();
  }
  if (!o["tokenizers"].contains(name) || o["tokenizers"][name].contains("missing")) {
    if (kvboost::test::oracles_required()) FAIL() << "oracle has no data for " << name;
    GTEST_SKIP() << "oracle has no data for " << name << " (tokenizer directory absent)";
  }
  const json& t = o["tokenizers"][name];
  Tokenizer tok = Tokenizer::from_dir(t["dir"].get<std::string>());
  size_t n_bad = 0, n = 0;
  const auto report = [&](const std::string& what, const std::string& text, const std::string& detail) {
    if (++n_bad <= 8) ADD_FAILURE() << name << ": " << what << " differs for \"" << escaped(text) << "\"\n" << detail;
  };
  for (const json& c : t["cases"]) {
    ++n;
    const std::string text = c["text"].get<std::string>();
    auto ids = c["ids"].get<std::vector<int32_t>>();
    auto ids_special = c["ids_special"].get<std::vector<int32_t>>();
    auto ours = tok.encode(text, false);
    if (ours != ids) report("encode", text, "  hf:   " + ids_str(ids) + "\n  ours: " + ids_str(ours));
    auto ours_s = tok.encode(text, true);
    if (ours_s != ids_special)
      report("encode(add_special)", text, "  hf:   " + ids_str(ids_special) + "\n  ours: " + ids_str(ours_s));
    std::string d = tok.decode(ids, false);
    if (d != c["decoded"].get<std::string>())
      report("decode", text, "  hf:   \"" + escaped(c["decoded"]) + "\"\n  ours: \"" + escaped(d) + "\"");
    std::string ds = tok.decode(ids_special, true);
    if (ds != c["decoded_skip"].get<std::string>())
      report("decode(skip_special)", text, "  hf:   \"" + escaped(c["decoded_skip"]) + "\"\n  ours: \"" + escaped(ds) + "\"");
  }
  for (const json& c : t["decode_cases"]) {
    ++n;
    auto ids = c["ids"].get<std::vector<int32_t>>();
    std::string d = tok.decode(ids, false), ds = tok.decode(ids, true);
    if (d != c["text"].get<std::string>())
      report("decode of ids " + ids_str(ids), "", "  hf:   \"" + escaped(c["text"]) + "\"\n  ours: \"" + escaped(d) + "\"");
    if (ds != c["text_skip"].get<std::string>())
      report("decode(skip) of ids " + ids_str(ids), "", "  hf:   \"" + escaped(c["text_skip"]) + "\"\n  ours: \"" + escaped(ds) + "\"");
  }
  EXPECT_EQ(n_bad, 0u) << name << ": " << n_bad << " mismatches in " << n << " cases";
  EXPECT_GT(n, 100u);
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerDiff,
                         ::testing::Values("qwen25", "llama3", "stories260K", "fixture_bytelevel",
                                           "fixture_sentencepiece"));

}  // namespace
