// GBNF parser, matcher acceptance/rejection, regex conversion against std::regex, masks against
// brute force, rollback.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "kvboost/grammar.h"

using namespace kvboost::grammar;

namespace {

std::shared_ptr<const TokenVocab> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> b;
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, char(i)));
    return std::make_shared<const TokenVocab>(b);
  }();
  return v;
}

bool matches(const std::string& gbnf, const std::string& s) {
  Matcher m(std::make_shared<const CompiledGrammar>(parse_gbnf(gbnf), byte_vocab()));
  return m.accept_bytes(s) && m.is_complete();
}
bool prefix_ok(const std::string& gbnf, const std::string& s) {
  Matcher m(std::make_shared<const CompiledGrammar>(parse_gbnf(gbnf), byte_vocab()));
  return m.accept_bytes(s);
}

std::string error_of(const std::string& gbnf) {
  try {
    parse_gbnf(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gbnf, ParsesLlamaCppForms) {
  const std::string g = R"(# a comment
root   ::= greeting (" " name)+ "!"?
greeting ::= "hi" | "hello"   # trailing comment
name ::= [A-Z] [a-z]{1,5}
)";
  EXPECT_TRUE(matches(g, "hi Bob"));
  EXPECT_TRUE(matches(g, "hello Al Bo!"));
  EXPECT_FALSE(matches(g, "hi bob"));
  EXPECT_FALSE(matches(g, "hi B"));
  EXPECT_FALSE(matches(g, "hi Abcdefg"));
  EXPECT_FALSE(matches(g, "hey Bob"));
  EXPECT_TRUE(prefix_ok(g, "hel"));
  EXPECT_FALSE(prefix_ok(g, "hex"));
}

TEST(Gbnf, MultilineAlternativesGroupsAndEscapes) {
  const std::string g = "root ::= (\n  \"a\"\n  | \"\\x62\"\n) tail\n  | \"\\u00e9\\n\"\ntail ::= [^\\]x-z]* \"\\\"\"\n";
  EXPECT_TRUE(matches(g, "a\""));
  EXPECT_TRUE(matches(g, "bqq\""));
  EXPECT_TRUE(matches(g, "\xC3\xA9\n"));
  EXPECT_FALSE(matches(g, "ay\""));
  EXPECT_FALSE(matches(g, "a]\""));
}

TEST(Gbnf, Repetitions) {
  const std::string g = "root ::= \"ab\"{2,3} [0-9]{2} \"x\"{0,} \"y\"{1,}\n";
  EXPECT_TRUE(matches(g, "abab12y"));
  EXPECT_TRUE(matches(g, "ababab12xxxyy"));
  EXPECT_FALSE(matches(g, "ab12y"));
  EXPECT_FALSE(matches(g, "abababab12y"));
  EXPECT_FALSE(matches(g, "abab1y"));
  EXPECT_FALSE(matches(g, "abab12x"));
  EXPECT_TRUE(matches("root ::= \"a\"{3}\n", "aaa"));
  EXPECT_FALSE(matches("root ::= \"a\"{3}\n", "aa"));
  EXPECT_TRUE(matches("root ::= .* \"!\"\n", "\xE2\x82\xAC!"));
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  EXPECT_NE(error_of("root ::= \"a\"\nfoo ::= bar\n").find("grammar:2:9: undefined rule 'bar'"), std::string::npos)
      << error_of("root ::= \"a\"\nfoo ::= bar\n");
  EXPECT_NE(error_of("root ::= \"abc\n").find("grammar:1:10: unterminated string literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= [a-\n").find("grammar:1:10"), std::string::npos);
  EXPECT_NE(error_of("root ::= ( \"a\" \n").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"\n").find("grammar:1:6: expected '::='"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,1}\n").find("n < m"), std::string::npos);
  EXPECT_NE(error_of("root ::= * \"a\"\n").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"\n").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"\n").find("defined twice"), std::string::npos);
  EXPECT_NE(error_of("start ::= \"a\"\n").find("no rule named 'root'"), std::string::npos);
}

TEST(Gbnf, RejectsLeftRecursionByName) {
  const std::string e = error_of("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n");
  EXPECT_NE(e.find("rule 'expr' is left-recursive"), std::string::npos) << e;
  // Through a nullable prefix.
  const std::string e2 = error_of("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\"?\n");
  EXPECT_NE(e2.find("left-recursive"), std::string::npos) << e2;
  // Right recursion is fine.
  EXPECT_TRUE(matches("root ::= \"(\" root \")\" | \"x\"\n", "((x))"));
  EXPECT_FALSE(matches("root ::= \"(\" root \")\" | \"x\"\n", "((x)"));
}

TEST(Gbnf, RoundTripsThroughToGbnf) {
  const auto g = parse_gbnf("root ::= \"a\" [^b-d\\n] (x | \"q\")*\nx ::= .\n");
  const std::string text = to_gbnf(*parse_gbnf(to_gbnf(*g)));  // rule order settles after one trip
  EXPECT_EQ(to_gbnf(*parse_gbnf(text)), text);
  EXPECT_TRUE(matches(text, "axqq"));
  EXPECT_FALSE(matches(text, "ac"));
}

TEST(JsonGrammar, AcceptsAndRejects) {
  const std::string& g = json_gbnf();
  for (const char* ok : {"{}", "[]", "0", "-12.5e+3", "\"a\\n\\u00e9\"", "true", "null",
                         "{\"a\": [1, 2, {\"b\": null}], \"c\": \"x\"}", "[\n  1,\n  2\n]", "\"\xE2\x82\xAC\""})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"{", "[1,]", "01", "{\"a\" 1}", "'a'", "tru", "\"\x01\"", "{a: 1}", "1.", "--1", "[1 2]"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  EXPECT_TRUE(matches(json_gbnf(true), "{\"k\": 1}"));
  EXPECT_FALSE(matches(json_gbnf(true), "[1]"));
}

TEST(Choice, ExactlyOneOfTheStrings) {
  const std::string g = choice_to_gbnf({"yes", "no", "a \"quoted\" one", "\xC3\xA9t\xC3\xA9"});
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "a \"quoted\" one"));
  EXPECT_TRUE(matches(g, "\xC3\xA9t\xC3\xA9"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_FALSE(matches(g, "yesno"));
}

TEST(Regex, AgreesWithStdRegexOnManyStrings) {
  const std::vector<std::string> res = {
      "[a-c]+x?", "(ab|cd)*e", "\\d{2,3}-\\w+", "a.c", "[^abc]{1,2}", "(?:x|y){2}z*", "colou?r", "[0-9a-f]{4}",
      "\\s?[A-Z][a-z]*", "(a|b|)c", "a{2,}", "[-+]?\\d+(\\.\\d+)?", "\\.\\*\\\\"};
  std::mt19937 rng(7);
  const std::string alphabet = "abcdexyzACZ019-+. \\*rouf";
  for (const std::string& re : res) {
    const std::string g = regex_to_gbnf(re);
    const std::regex sre(re, std::regex::ECMAScript);
    int n_match = 0;
    for (int k = 0; k < 3000; ++k) {
      std::string s;
      const int len = int(rng() % 7);
      for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
      const bool want = std::regex_match(s, sre);
      n_match += want;
      ASSERT_EQ(matches(g, s), want) << "regex " << re << " on '" << s << "'\n" << g;
    }
    (void)n_match;
  }
  EXPECT_TRUE(matches(regex_to_gbnf("^\\d+$"), "123"));
}

TEST(Regex, UnsupportedConstructsNameTheFeature) {
  for (const auto& [re, feat] : std::vector<std::pair<std::string, std::string>>{
           {"(a)\\1", "regex backreference"}, {"(?=a)a", "regex lookaround"}, {"a\\bc", "regex \\b"},
           {"a++", "regex possessive quantifier"}, {"a^b", "regex anchor"}}) {
    try {
      regex_to_gbnf(re);
      ADD_FAILURE() << re << " was accepted";
    } catch (const UnsupportedFeature& e) {
      EXPECT_EQ(e.feature(), feat) << re << ": " << e.what();
    }
  }
}

// Random vocabulary of 1-4 byte strings over a small alphabet with multi-byte characters, so
// that tokens end inside UTF-8 characters.
std::shared_ptr<const TokenVocab> random_vocab(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "1", "0", "-", ".",
                                          "e", "t", "r", "u", "n", "l", "\\", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  std::vector<std::string> v;
  for (int i = 0; i < 256; ++i) v.push_back(std::string(1, char(i)));  // every byte: always completable
  while (int(v.size()) < n) {
    std::string s;
    const int parts = 1 + int(rng() % 3);
    for (int p = 0; p < parts; ++p) s += atoms[rng() % atoms.size()];
    if (rng() % 4 == 0 && s.size() > 1) s = s.substr(rng() % 2, s.size() - 1);  // split a character
    v.push_back(s);
  }
  v.push_back("");  // a token with no bytes (special): never allowed
  return std::make_shared<const TokenVocab>(v);
}

TEST(Mask, EqualsBruteForceOverRandomWalks) {
  const auto vocab = random_vocab(700, 3);
  const std::vector<std::string> grammars = {
      json_gbnf(), json_schema_to_gbnf(nlohmann::ordered_json::parse(
                       R"({"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":120},
                           "b":{"type":"string","maxLength":3},"c":{"enum":["x","\u00e9\u20ac"]}},"required":["a"]})")),
      regex_to_gbnf("[a\xC3\xA9]+\xE2\x82\xAC?b")};
  std::mt19937_64 rng(11);
  for (const std::string& gtext : grammars) {
    auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(gtext), vocab);
    for (int walk = 0; walk < 6; ++walk) {
      Matcher m(cg);
      for (int step = 0; step < 25; ++step) {
        const auto bits = m.allowed();
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < vocab->size(); ++t) {
          Matcher probe = m;
          const bool brute = !vocab->bytes(t).empty() && probe.accept_bytes(vocab->bytes(t));
          const bool got = ((*bits)[size_t(t) >> 5] >> (t & 31)) & 1u;
          ASSERT_EQ(got, brute) << "token " << t << " '" << vocab->bytes(t) << "' at step " << step;
          if (brute) ok.push_back(t);
        }
        if (ok.empty()) {
          EXPECT_TRUE(m.must_end());
          break;
        }
        // Prefer ending sometimes, so walks reach completion.
        const int32_t t = ok[rng() % ok.size()];
        ASSERT_TRUE(m.accept(t));
      }
    }
    EXPECT_GT(cg->cache_stats().entries, 0);
  }
}

// Four random walks of up to `steps` tokens through the grammar: at each state the mask must
// equal token-by-token matching of every token's bytes (brute force).
static void masks_equal_brute_force(const std::shared_ptr<const CompiledGrammar>& cg, const TokenVocab& vocab,
                                    std::mt19937_64& rng, int steps, const std::string& what) {
  for (int walk = 0; walk < 4; ++walk) {
    Matcher m(cg);
    for (int step = 0; step < steps; ++step) {
      const auto bits = m.allowed();
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < vocab.size(); ++t) {
        Matcher probe = m;
        const bool brute = probe.accept_bytes(vocab.bytes(t));
        const bool got = ((*bits)[size_t(t) >> 5] >> (t & 31)) & 1u;
        std::string hex;
        for (const char c : vocab.bytes(t)) hex += " " + std::to_string(int(uint8_t(c)));
        ASSERT_EQ(got, brute) << "token " << t << " (bytes" << hex << ") at step " << step << " (" << what << ")";
        if (brute) ok.push_back(t);
      }
      if (ok.empty()) break;
      ASSERT_TRUE(m.accept(ok[rng() % ok.size()]));
    }
  }
}

// Word-like tokens (a real vocabulary's shape: many share long prefixes) inside JSON strings and
// a repeated class: the walk accepts whole trie subtrees (TokenVocab::Below) and must still agree
// with brute force, including on tokens that leave the string ('ab"', 'a"b', 'x\\').
TEST(Mask, SubtreeShortcutEqualsBruteForce) {
  std::mt19937_64 rng(5);
  const std::string letters = "abcdefghij \"\\:,{}0123456789";
  std::vector<std::string> v;
  for (int i = 0; i < 128; ++i) v.push_back(std::string(1, char(i)));
  for (int i = 0; i < 1500; ++i) {
    std::string s;
    const int len = 2 + int(rng() % 6);
    for (int k = 0; k < len; ++k) s += rng() % 8 ? letters[rng() % 10] : letters[rng() % letters.size()];
    v.push_back(s);
  }
  v.push_back("\xC3\xA9t\xC3\xA9");  // non-ASCII below: the plain walk
  const auto vocab = std::make_shared<const TokenVocab>(v);
  for (const std::string& gtext :
       {json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type":"object","properties":{"s":{"type":"string"},
            "t":{"type":"array","items":{"type":"string"}}},"required":["s","t"]})")),
        std::string("root ::= [a-f ]+ \"!\""),
        // bounded repetitions: the chain shortcut (each level's bytes lead to one next state)
        json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type":"object","properties":{"s":{"type":"string","maxLength":7},
            "t":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":3}},"required":["s","t"]})")),
        regex_to_gbnf("[a-f ]{2,9}![0-9]{1,5}")}) {
    auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(gtext), vocab);
    masks_equal_brute_force(cg, *vocab, rng, 30, gtext);
    if (HasFatalFailure()) return;
    EXPECT_GT(cg->cache_stats().subtrees, 0) << "no subtree was accepted whole: the shortcut never ran";
  }
}

// Tokens made mostly of multi-byte characters (Gemma's vocabulary is): subtrees below a node
// are taken whole through states that send every non-ASCII character to one set (a JSON
// string's body, a negated ASCII class), in both mask modes, and must agree with brute force,
// including on characters cut at a token's end, overlong and surrogate forms, and a class
// that holds only some non-ASCII characters (no shortcut).
TEST(Mask, NonAsciiSubtreesEqualBruteForce) {
  std::mt19937_64 rng(9);
  const std::vector<std::string> pieces = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xE4\xB8\xAD", "\xD0\xB4", "a", "b",
                                           " ", "\"", "\\", "!", "\xC3", "\xE2\x82", "\xC0\xA2", "\xED\xA0\x80", "\x80"};
  std::vector<std::string> v;
  for (int i = 0; i < 256; ++i) v.push_back(std::string(1, char(i)));
  for (int i = 0; i < 1500; ++i) {
    std::string s = pieces[rng() % 5];  // a well-formed character first, so prefixes are shared
    const int n = int(rng() % 5);
    for (int k = 0; k < n; ++k) {
      const size_t among = rng() % 6 ? 7 : pieces.size();  // mostly well-formed pieces
      s += pieces[rng() % among];
    }
    v.push_back(s);
  }
  const auto vocab = std::make_shared<const TokenVocab>(v);
  for (const std::string& gtext :
       {json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type":"array","items":{"type":"string"},"maxItems":3})")),
        json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type":"array","items":{"type":"string","maxLength":4},"maxItems":3})")),
        std::string("root ::= [^\"\\\\!]* \"!\" [^a]{0,3}"), std::string("root ::= [^\\u00e9!]* \"!\"")}) {
    for (const MaskMode mode : {MaskMode::kWalk, MaskMode::kSplit}) {
      auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(gtext), vocab, mode);
      masks_equal_brute_force(cg, *vocab, rng, 20, "mode " + std::to_string(int(mode)) + " of " + gtext);
      if (HasFatalFailure()) return;
      if (mode == MaskMode::kWalk && gtext.find("u00e9") == std::string::npos) {
        EXPECT_GT(cg->cache_stats().subtrees, 0) << gtext;
      }
    }
  }
}

TEST(Mask, ApplySetsDisallowedToMinusInfinityAndGatesEos) {
  std::vector<std::string> v = {"a", "b", "ab", "", "c"};  // id 3: EOS (no bytes)
  auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf("root ::= \"a\" \"b\"?\n"), std::make_shared<const TokenVocab>(v));
  Matcher m(cg);
  std::vector<float> logits(7, 1.0f);  // 2 ids past the vocabulary
  EXPECT_EQ(m.apply(logits.data(), 7, {3}), 2);
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[2], 1.0f);
  for (int i : {1, 3, 4, 5, 6}) EXPECT_TRUE(std::isinf(logits[size_t(i)])) << i;
  EXPECT_FALSE(m.accept(3, {3}));  // EOS before the grammar is complete
  ASSERT_TRUE(m.accept(0, {3}));
  std::fill(logits.begin(), logits.end(), 1.0f);
  EXPECT_EQ(m.apply(logits.data(), 7, {3}), 2);  // "b" or EOS
  EXPECT_EQ(logits[1], 1.0f);
  EXPECT_EQ(logits[3], 1.0f);
  ASSERT_TRUE(m.accept(1, {3}));
  EXPECT_TRUE(m.must_end());
}

TEST(Matcher, RollbackRestoresTheState) {
  auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(json_gbnf()), random_vocab(400, 5));
  Matcher m(cg);
  ASSERT_TRUE(m.accept_bytes("{\"a\": [1"));
  const Matcher::State before = m.state();
  ASSERT_TRUE(m.accept_bytes(", 2"));
  ASSERT_TRUE(m.accept_bytes("]"));
  EXPECT_FALSE(m.accept_bytes("]"));  // rejected: no change
  EXPECT_EQ(m.n_accepted(), 3u);
  m.rollback(2);
  EXPECT_EQ(m.state().stacks, before.stacks);
  EXPECT_THROW(m.rollback(5), kvboost::Error);
  // A copy is independent.
  Matcher c = m;
  ASSERT_TRUE(c.accept_bytes("]}"));
  EXPECT_TRUE(c.is_complete());
  EXPECT_FALSE(m.is_complete());
}

TEST(Matcher, PartialUtf8AcrossTokens) {
  auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf("root ::= [\\u00e0-\\u00ff] \"!\"\n"), byte_vocab());
  Matcher m(cg);
  EXPECT_FALSE(m.accept_bytes("\xC2"));  // U+0080..U+00BF: outside the class
  ASSERT_TRUE(m.accept_bytes("\xC3"));   // U+00C0..U+00FF: some are inside
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.accept_bytes("\x80"));  // U+00C0: outside
  ASSERT_TRUE(m.accept_bytes("\xA9"));   // U+00E9
  ASSERT_TRUE(m.accept_bytes("!"));
  EXPECT_TRUE(m.is_complete());
}
