// kvboost tokenize / detokenize: need only the model's tokenizer (its files, or a GGUF's metadata).
#include <cstdio>
#include <memory>

#include "cli_util.h"

namespace kvboost::cli {

namespace {
struct TokArgs {
  std::string model;
  std::vector<std::string> text;
  bool no_special = false;
  std::vector<std::string> ids;
  bool skip_special = false;
};

// The model's tokenizer, as Engine::load finds it: a model directory's tokenizer.json; for a GGUF
// (a .gguf file, a directory or Hub snapshot holding only one) the tokenizer.json beside it, else
// the tokenizer in its tokenizer.ggml.* metadata (a GGUF-only Hub repo has nothing else).
Tokenizer load_tokenizer(const std::string& model) {
  const std::string path = resolve_model_dir(model, true);
  const std::string gguf = gguf_model_file(path);
  if (gguf.empty()) return Tokenizer::from_dir(path);
  const size_t slash = gguf.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : gguf.substr(0, slash);
  if (file_exists(path_join(dir, "tokenizer.json"))) return Tokenizer::from_dir(dir);
  const GgufTokenizerFiles t = gguf_tokenizer_files(gguf);
  return Tokenizer::from_json(t.tokenizer_json, t.tokenizer_config_json, gguf + " (tokenizer.ggml.*)");
}
}  // namespace

void add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokArgs>();
  CLI::App* t = app.add_subcommand("tokenize", "Print the token ids of TEXT (or of standard input, read as exact bytes)");
  t->add_option("-m,--model", a->model, "Model directory, .gguf file or Hub id (ORG/NAME[:FILE.gguf]); default: the demo model");
  t->add_option("text", a->text, "Text to tokenize (words are joined by single spaces); omitted: standard input");
  t->add_flag("--no-special", a->no_special, "Omit BOS/EOS special tokens");
  t->callback([a]() {
    Tokenizer tok = load_tokenizer(a->model);
    std::string text;
    if (a->text.empty()) {
      text = read_stdin();
    } else {
      for (size_t i = 0; i < a->text.size(); ++i) text += (i ? " " : "") + a->text[i];
    }
    auto ids = tok.encode(text, !a->no_special);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", out.c_str());
  });

  CLI::App* d = app.add_subcommand("detokenize", "Print the text of token IDs");
  d->add_option("-m,--model", a->model, "Model directory, .gguf file or Hub id (ORG/NAME[:FILE.gguf]); default: the demo model");
  d->add_option("ids", a->ids, "Token ids (separated by spaces or commas)")->required();
  d->add_flag("--skip-special", a->skip_special, "Leave out special tokens");
  d->callback([a]() {
    Tokenizer tok = load_tokenizer(a->model);
    std::vector<int32_t> ids;
    for (const auto& arg : a->ids) {
      size_t pos = 0;
      while (pos < arg.size()) {
        size_t end = arg.find_first_of(", ", pos);
        if (end == std::string::npos) end = arg.size();
        std::string s = arg.substr(pos, end - pos);
        pos = end + 1;
        if (s.empty()) continue;
        char* e = nullptr;
        long v = std::strtol(s.c_str(), &e, 10);
        if (*e || v < 0 || v >= tok.vocab_size())
          fail("\"", s, "\" is not a token id of this tokenizer (0 .. ", tok.vocab_size() - 1, ")");
        ids.push_back(int32_t(v));
      }
    }
    std::string text = tok.decode(ids, a->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  });
}

}  // namespace kvboost::cli
