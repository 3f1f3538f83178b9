// kvboost/grammar.h — constrained decoding: a grammar engine that masks the logits at each step
// so that the generated text is guaranteed to parse. Uses kvboost/tokenizer.h and nlohmann::json.
//
// Inputs: GBNF (llama.cpp's grammar format), JSON (any value), JSON Schema, regular expressions
// (vLLM's guided_regex) and choice lists (guided_choice); all of them are compiled to GBNF text,
// parsed into a Grammar (flat rule table), and matched with a pushdown matcher over code points
// (llama.cpp's llama_grammar stacks: each stack lists the grammar positions still to match, the
// top being a terminal). Left recursion is rejected at parse time with the rule's name.
//
// The mask walks a byte trie of the vocabulary's token strings (built once per tokenizer and
// cached): a subtree whose prefix the grammar rejects is skipped whole. Masks are cached per
// matcher state (the set of stacks + a pending partial UTF-8 character) in the CompiledGrammar,
// which requests with the same grammar share.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"

namespace kvboost::grammar {

// A grammar that does not parse (message names line:column), refers to an undefined rule, or is
// left-recursive (names the rule).
class GrammarError : public Error {
 public:
  using Error::Error;
};
// A JSON Schema / regex feature the converter does not implement; `feature` names it (a keyword,
// "format: email", "regex lookahead") and the message says where.
class UnsupportedFeature : public Error {
 public:
  UnsupportedFeature(std::string feature, const std::string& what) : Error(what), feature_(std::move(feature)) {}
  const std::string& feature() const { return feature_; }

 private:
  std::string feature_;
};

// ---- grammar text from the other input forms ---------------------------------------------------

// Any JSON value (RFC 8259), as GBNF; whitespace between tokens is bounded (a newline and a few
// spaces at most), so a model cannot stall in whitespace forever.
const std::string& json_gbnf(bool object_only = false);  // object_only: the top level is an object
// A JSON Schema (draft 2020-12 subset) as GBNF. strict: additionalProperties defaults to false
// (OpenAI's strict mode); otherwise to true. Annotations (title, description, default, examples,
// ...) are ignored; any other keyword this converter does not implement throws UnsupportedFeature.
// Properties are emitted in the schema's order; oneOf is generated as anyOf (sound when the
// branches are disjoint, as discriminated unions are).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, bool strict = true);
// A regular expression (ECMAScript/Python subset: literals, escapes \d\w\s\D\W\S, classes,
// '.', groups, (?:...), |, * + ? {m} {m,} {m,n}; ^ $ only at the ends) whose full match is the
// output. Backreferences, lookaround and other constructs throw UnsupportedFeature.
std::string regex_to_gbnf(std::string_view regex);
// Exactly one of the strings.
std::string choice_to_gbnf(const std::vector<std::string>& choices);
// A GBNF string literal (quoted, escaped) for `s`.
std::string gbnf_literal(std::string_view s);
// GBNF text with every rule name prefixed (so that grammars can be combined into one).
std::string prefix_rules(std::string_view gbnf, const std::string& prefix);

// ---- compiled grammars --------------------------------------------------------------------------

// One grammar element (llama.cpp's llama_gretype): a rule is a sequence of elements with kAlt
// between alternatives and kEnd at the end. A character class is kChar/kCharNot followed by
// kCharAlt / kCharRngUpper elements.
enum class Op : uint8_t { kEnd, kAlt, kRuleRef, kChar, kCharNot, kCharRngUpper, kCharAlt, kCharAny };
struct Elem {
  Op op;
  uint32_t value;  // code point, or rule id
};

struct Grammar {
  std::vector<Elem> elems;           // all rules, each ending with kEnd
  std::vector<uint32_t> rule_start;  // rule id -> offset into elems
  std::vector<std::string> rule_names;
  uint32_t root = 0;
  std::string source;                // the GBNF text it was parsed from
};
// Parses GBNF text (root rule `root`). Throws GrammarError.
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, const std::string& root = "root");
// Rules back as GBNF text (debugging, tests).
std::string to_gbnf(const Grammar& g);

// The vocabulary as byte strings plus a byte trie over them. Special tokens and tokens with no
// bytes are never produced by the trie (EOS is handled by the matcher).
class TokenVocab {
 public:
  // token_bytes[i]: the bytes token i contributes to the text mid-sequence ("" = never allowed).
  explicit TokenVocab(std::vector<std::string> token_bytes);
  // From a tokenizer: byte-level BPE (GPT-2 byte map), SentencePiece (U+2581 -> ' ', <0xXX>
  // byte fallback) and plain vocabularies. Cached per tokenizer object.
  static std::shared_ptr<const TokenVocab> of(const Tokenizer& tok);
  static std::vector<std::string> token_bytes_of(const Tokenizer& tok);
  int32_t size() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t max_len() const { return max_len_; }  // longest token, in bytes

  // Trie: node 0 is the root; children sorted by byte.
  struct Node {
    uint32_t first_child = 0, n_children = 0;
    uint32_t first_token = 0, n_tokens = 0;  // into token_ids_
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<uint8_t>& edge_bytes() const { return edge_bytes_; }  // per node (its incoming byte)
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  // State-independent classes, per node: the bytes below it (of its subtree's tokens, after the
  // node's own prefix) as an ASCII bitmap plus whether any is non-ASCII, and its subtree's tokens
  // as the range [lo, hi) of sorted_ids() (tokens in byte order). A mask walk that reaches a node
  // in a state that every byte below maps back to itself, or through a chain of states as long
  // as the subtree is deep (a bounded repetition), accepts the whole range at once.
  struct Below {
    uint64_t ascii[2] = {0, 0};
    uint32_t lo = 0, hi = 0;
    bool non_ascii = false;
    uint16_t depth = 0;  // the longest token below, in bytes after the node's prefix
    // Every token below is well-formed UTF-8 (a character cut at its end may still become a
    // valid one): its non-ASCII bytes then only form characters, and a state that takes every
    // non-ASCII character to one set can accept the subtree whole (chains over code points).
    bool utf8_ok = false;
  };
  const std::vector<Below>& below() const { return below_; }
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }

 private:
  std::vector<std::string> bytes_;
  size_t max_len_ = 0;
  std::vector<Node> nodes_;
  std::vector<uint8_t> edge_bytes_;
  std::vector<int32_t> token_ids_;
  std::vector<Below> below_;
  std::vector<int32_t> sorted_ids_;
};

// A grammar bound to a vocabulary, with the per-state mask cache that every matcher of it
// shares (thread-safe).
//
// Masks of new states come from a per-position table built at compile time (XGrammar's split,
// Dong et al. 2024): for each stack top, and where needed a few positions below it, the tokens
// accepted whatever lies deeper in the stack are stored as a mask; only the rest (tokens that
// finish the known part of the stack mid-token) are checked against the real stack, resuming
// below it. kWalk walks the vocabulary trie from every new state instead (the reference, and
// the path for a state that ends inside a UTF-8 character).
enum class MaskMode : uint8_t {
  // kWalk, or kSplit when the environment has KVBOOST_GRAMMAR_SPLIT=1. The walk is the default
  // because the split's table costs seconds of CPU per new grammar on a 262k vocabulary (4.3 s
  // for the profile schema on Gemma 3), which a request with a new schema would wait for; the
  // walk spreads ~10 ms per new state over the decode and keeps its memo per grammar.
  kDefault,
  kSplit,
  kWalk,
};
class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v,
                  MaskMode mode = MaskMode::kDefault);
  ~CompiledGrammar();
  const Grammar& grammar() const { return *g_; }
  const TokenVocab& vocab() const { return *v_; }
  // Compiles GBNF for a vocabulary, reusing a recent compilation of the same text (so requests
  // with the same schema share their mask cache).
  static std::shared_ptr<const CompiledGrammar> get(const std::string& gbnf, std::shared_ptr<const TokenVocab> v);

  struct CacheStats {
    int64_t hits = 0, misses = 0, entries = 0;
    int64_t subtrees = 0;  // trie subtrees accepted whole by the walks (TokenVocab::Below)
    // The split table (MaskMode::kSplit): entries (stack suffixes) built at compile time and
    // later (suffixes the compile-time enumeration did not foresee), the compile time, and the
    // tokens checked against a real stack by new states' masks.
    int64_t split_entries = 0, split_late = 0, split_checked = 0;
    double split_compile_ms = 0;
  };
  CacheStats cache_stats() const;
  // The mask walks' memo of stack sets and their transitions, kept across walks so that a new
  // state's walk finds the transitions earlier walks computed (opaque; mask.cpp).
  struct WalkMemo;
  struct SplitTable;  // split.cpp

 private:
  friend class Matcher;
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenVocab> v_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<uint32_t>>> cache_;
  mutable int64_t hits_ = 0, misses_ = 0, subtrees_ = 0;
  mutable std::mutex walk_mu_;  // guards memo_
  mutable std::unique_ptr<WalkMemo> memo_;
  mutable std::unique_ptr<SplitTable> split_;  // null: MaskMode::kWalk; guarded by walk_mu_
  // The split mask of a state (no partial character), into `bits`; walk_mu_ held (split.cpp).
  void split_mask(const std::vector<std::vector<uint32_t>>& stacks, std::vector<uint32_t>& bits) const;
};

// Per-request matcher state. Copyable (a copy is an independent state); accept() keeps an undo
// log so rollback(n) undoes the last n accepted tokens (speculative decoding).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);

  // Token ids allowed next as a bitmask ([vocab/32] words; bit set = allowed). EOS ids are not
  // in it: they are allowed exactly when is_complete().
  std::shared_ptr<const std::vector<uint32_t>> allowed();
  // Sets disallowed logits to -inf over [0, n_logits) (ids past the vocabulary too); EOS ids
  // stay only when the grammar is complete. Returns the number of tokens left allowed.
  int64_t apply(float* logits, int64_t n_logits, const std::vector<int32_t>& eos_ids);
  // Advances over a token (its bytes); false (state unchanged) when the grammar rejects it.
  // EOS: accepted when complete (the state does not change).
  bool accept(int32_t token, const std::vector<int32_t>& eos_ids = {});
  // Advances over raw bytes (tests, forced text); false (state unchanged) when rejected.
  bool accept_bytes(std::string_view bytes);
  void rollback(size_t n_tokens);
  size_t n_accepted() const { return undo_.size(); }
  // The grammar may end here (some stack is empty and no UTF-8 character is half done).
  bool is_complete() const;
  // Nothing but the end is possible (complete and no stack can take another character).
  bool must_end() const;

  struct State {
    std::vector<std::vector<uint32_t>> stacks;  // positions into Grammar::elems, top at back
    uint32_t partial_cp = 0;                    // pending UTF-8 character: bits so far
    uint8_t partial_left = 0;                   // ... continuation bytes still expected
    uint8_t partial_len = 0;                    // ... its total length
  };
  const State& state() const { return st_; }

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  State st_;
  std::vector<State> undo_;
};

// Matcher core, exposed for tests and the mask walk: advance `stacks` over one code point.
void advance_stacks(const Grammar& g, const std::vector<std::vector<uint32_t>>& stacks, uint32_t cp,
                    std::vector<std::vector<uint32_t>>& out);
// Whether any stack could take a code point in [lo, hi] (a partial UTF-8 character).
bool stacks_accept_range(const Grammar& g, const std::vector<std::vector<uint32_t>>& stacks, uint32_t lo, uint32_t hi);
// The initial stacks of a grammar.
std::vector<std::vector<uint32_t>> initial_stacks(const Grammar& g);

}  // namespace kvboost::grammar
