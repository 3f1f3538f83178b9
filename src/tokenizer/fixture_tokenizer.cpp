// Fixture tokenizers for generated random-weight models: a tiny BPE trainer over a built-in
// text, written out as Hugging Face tokenizer.json (loadable by `tokenizers` and by us).
#include <algorithm>
#include <map>
#include <set>

#include "internal.h"

namespace kvboost {
namespace {

using tok::json;
using ojson = nlohmann::ordered_json;

// English prose, code and a little of several scripts; the merges are learned from it.
constexpr const char* kCorpus[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.",
    "The quick brown fox jumps over the lazy dog. The dog was not happy about it at all!",
    "Tom and his friend Sam went to the store to buy some milk and bread for their mother.",
    "\"Can I have some cake?\" asked Ben. \"Yes, you can,\" said Mom with a smile.",
    "It is 3:45 pm on 2024-05-17; the temperature is 21.5 degrees and the price is $19.99.",
    "In the morning the sun was warm, and the birds were singing in the tall green trees.",
    "The model reads the prompt, computes the keys and values, and caches them for reuse.",
    "A token is a piece of text; the tokenizer splits the text into tokens and maps them to ids.",
    "def greet(name):\n    return f\"Hello, {name}!\"\n\nprint(greet(\"world\"))\n",
    "for (int i = 0; i < n; ++i) {\n    sum += values[i] * weights[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v = {1, 2, 3}; return v.size(); }\n",
    "if x is not None and len(items) > 0:\n    items.append(x)\nelse:\n    raise ValueError(\"empty\")\n",
    "const result = await fetch(url).then((r) => r.json());\n",
    "SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    "Le café est très bon, et la crème brûlée aussi. Ça va très bien, merci!",
    "Die Straße ist schön und grün. Über den Bergen scheint die Sonne.",
    "Привет, как дела? Всё хорошо, спасибо.",
    "你好，世界！今天天气很好，我们去公园散步吧。中文分词测试。",
    "こんにちは、世界。今日はいい天気ですね。",
    "안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया।",
    "Emoji: 😀 😂 👍 🎉 🚀 ❤️ and arrows → ← ↑ ↓ and math ∑ ∫ π ≈ 3.14159.",
    "She said: \"I'm sure they'll come; we've waited, and it's time.\" He didn't answer.",
    "The little cat sat on the mat. The little dog sat on the log. They were all happy.",
    "Lily and her mom went to the beach. They built a big sand castle and swam in the sea.",
};

std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  for (const char* c : kCorpus) lines.emplace_back(c);
  return lines;
}

uint64_t mix(uint64_t h) {  // splitmix64 finalizer
  h += 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

uint64_t str_hash(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ mix(seed);
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return mix(h);
}

struct Trainer {
  std::vector<std::pair<std::vector<std::string>, int>> words;  // symbols, count
  std::vector<std::pair<std::string, std::string>> merges;

  // Learns merges until `want_new` new vocabulary entries exist (or no pair is left).
  // `known`: strings already in the vocabulary; new ones are appended to `added`.
  void train(size_t want_new, std::set<std::string>& known, std::vector<std::string>& added, uint64_t seed) {
    while (added.size() < want_new) {
      std::map<std::pair<std::string, std::string>, int> counts;
      for (auto& [syms, n] : words)
        for (size_t i = 0; i + 1 < syms.size(); ++i) counts[{syms[i], syms[i + 1]}] += n;
      if (counts.empty()) return;
      const std::pair<std::string, std::string>* best = nullptr;
      int best_n = 0;
      uint64_t best_h = 0;
      for (auto& [p, n] : counts) {
        uint64_t h = str_hash(p.first + '\x01' + p.second, seed);  // seeded tie-break
        if (!best || n > best_n || (n == best_n && h < best_h)) {
          best = &p;
          best_n = n;
          best_h = h;
        }
      }
      const auto [a, b] = *best;
      const std::string m = a + b;
      merges.emplace_back(a, b);
      if (known.insert(m).second) added.push_back(m);
      for (auto& [syms, n] : words) {
        std::vector<std::string> out;
        for (size_t i = 0; i < syms.size(); ++i) {
          if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
            out.push_back(m);
            ++i;
          } else {
            out.push_back(syms[i]);
          }
        }
        syms.swap(out);
      }
    }
  }
};

std::vector<std::string> split_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    tok::next_cp(s, i);
    out.push_back(s.substr(b, i - b));
  }
  return out;
}

ojson added_token(int id, const std::string& content) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

ojson bpe_model(const std::vector<std::string>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                bool sentencepiece) {
  ojson v = ojson::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  ojson m = ojson::array();
  for (auto& [a, b] : merges) m.push_back({a, b});
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", sentencepiece ? ojson("<unk>") : ojson(nullptr)},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", sentencepiece},
          {"byte_fallback", sentencepiece},
          {"ignore_merges", false},
          {"vocab", v},
          {"merges", m}};
}

// The Qwen2 pre-tokenizer split pattern.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string make_bytelevel(int vocab_size, uint64_t seed) {
  const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const size_t n_model = static_cast<size_t>(vocab_size) - specials.size();
  std::vector<std::string> vocab;
  std::set<std::string> known;
  for (int b = 0; b < 256; ++b) {
    vocab.push_back(tok::byte_to_unicode(static_cast<uint8_t>(b)));
    known.insert(vocab.back());
  }
  // Pre-tokenize as the tokenizer will, then count byte-level words.
  tok::Regex re(kQwen2Pattern, "fixture");
  std::map<std::string, int> word_counts;
  for (const std::string& line : corpus_lines()) {
    for (auto [b, e] : re.find_all(line)) {
      std::string w;
      for (size_t i = b; i < e; ++i) w += tok::byte_to_unicode(static_cast<uint8_t>(line[i]));
      word_counts[w]++;
    }
  }
  Trainer tr;
  for (auto& [w, n] : word_counts) tr.words.push_back({split_chars(w), n});
  std::vector<std::string> added;
  tr.train(n_model - vocab.size(), known, added, seed);
  vocab.insert(vocab.end(), added.begin(), added.end());
  for (size_t k = 0; vocab.size() < n_model; ++k) vocab.push_back("<|reserved_" + std::to_string(k) + "|>");

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson at = ojson::array();
  for (size_t i = 0; i < specials.size(); ++i) at.push_back(added_token(static_cast<int>(n_model + i), specials[i]));
  j["added_tokens"] = at;
  j["normalizer"] = {{"type", "NFC"}};
  const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        byte_level}}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = bpe_model(vocab, tr.merges, false);
  return j.dump(1);
}

std::string make_sentencepiece(int vocab_size, uint64_t seed) {
  static const std::string kSpace = "\xE2\x96\x81";  // U+2581
  std::vector<std::string> vocab = {"<unk>", "<s>", "</s>"};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
  std::set<std::string> known(vocab.begin(), vocab.end());
  const size_t budget = static_cast<size_t>(vocab_size) - vocab.size();

  // Normalize as the tokenizer will (Prepend + Replace), split into words before each U+2581.
  std::map<std::string, int> char_counts;
  std::vector<std::vector<std::string>> lines;
  for (const std::string& line : corpus_lines()) {
    std::string norm = kSpace;
    for (char c : line) {
      if (c == ' ') norm += kSpace;
      else norm += c;
    }
    lines.push_back(split_chars(norm));
    for (auto& c : lines.back())
      if (c != "\n") char_counts[c]++;
  }
  // Single characters, most frequent first; half the budget at most, the rest is merges.
  std::vector<std::pair<int, std::string>> by_freq;
  for (auto& [c, n] : char_counts) by_freq.push_back({-n, c});
  std::sort(by_freq.begin(), by_freq.end());
  const size_t n_chars = std::min(by_freq.size(), std::max<size_t>(budget / 2, std::min<size_t>(budget, 64)));
  for (size_t k = 0; k < n_chars; ++k)
    if (known.insert(by_freq[k].second).second) vocab.push_back(by_freq[k].second);

  std::map<std::vector<std::string>, int> word_counts;
  for (auto& chars : lines) {
    std::vector<std::string> w;
    for (auto& c : chars) {
      if ((c == kSpace || !known.count(c)) && !w.empty()) {
        word_counts[w]++;
        w.clear();
      }
      if (known.count(c)) w.push_back(c);  // chars outside the vocabulary go through bytes
    }
    if (!w.empty()) word_counts[w]++;
  }
  Trainer tr;
  for (auto& [w, n] : word_counts) tr.words.push_back({w, n});
  std::vector<std::string> added;
  tr.train(static_cast<size_t>(vocab_size) - vocab.size(), known, added, seed);
  vocab.insert(vocab.end(), added.begin(), added.end());
  for (size_t k = 0; vocab.size() < static_cast<size_t>(vocab_size); ++k)
    vocab.push_back("<reserved_" + std::to_string(k) + ">");

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {added_token(0, "<unk>"), added_token(1, "<s>"), added_token(2, "</s>")};
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", kSpace}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
  j["pre_tokenizer"] = nullptr;
  const ojson bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = bpe_model(vocab, tr.merges, true);
  return j.dump(1);
}

}  // namespace

std::string make_fixture_tokenizer_json(const std::string& kind, int vocab_size, uint64_t seed) {
  if (kind != "bytelevel" && kind != "sentencepiece")
    fail("make_fixture_tokenizer_json: unknown kind '", kind, "' (expected bytelevel or sentencepiece)");
  if (vocab_size < 260 || vocab_size > (1 << 24))
    fail("make_fixture_tokenizer_json: vocab_size ", vocab_size, " out of range for ", kind, " (minimum 260)");
  return kind == "bytelevel" ? make_bytelevel(vocab_size, seed) : make_sentencepiece(vocab_size, seed);
}

std::string make_fixture_tokenizer_config_json(const std::string& kind) {
  ojson c;
  if (kind == "bytelevel") {
    c["add_bos_token"] = false;
    c["add_prefix_space"] = false;
    c["bos_token"] = nullptr;
    c["eos_token"] = "<|im_end|>";
    c["pad_token"] = "<|endoftext|>";
    c["unk_token"] = nullptr;
    c["additional_special_tokens"] = {"<|im_start|>", "<|im_end|>"};
    c["clean_up_tokenization_spaces"] = false;
    c["errors"] = "replace";
    c["model_max_length"] = 32768;
    c["split_special_tokens"] = false;
    c["tokenizer_class"] = "Qwen2Tokenizer";
    c["chat_template"] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  } else if (kind == "sentencepiece") {
    c["add_bos_token"] = true;
    c["add_eos_token"] = false;
    c["bos_token"] = "<s>";
    c["eos_token"] = "</s>";
    c["unk_token"] = "<unk>";
    c["pad_token"] = nullptr;
    c["clean_up_tokenization_spaces"] = false;
    c["legacy"] = false;
    c["model_max_length"] = 4096;
    c["tokenizer_class"] = "LlamaTokenizer";
    c["chat_template"] =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
        "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + "
        "eos_token }}{% else %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}{% endif %}{% endfor %}";
  } else {
    fail("make_fixture_tokenizer_config_json: unknown kind '", kind, "' (expected bytelevel or sentencepiece)");
  }
  return c.dump(1);
}

}  // namespace kvboost
