// kvboost — command-line interface. Errors from the library are printed as
// "kvboost: error: <message>" with exit status 1; usage errors exit with CLI11's codes.
#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvboost_version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "KVBoost: a C++ inference engine for Hugging Face causal language models\n"
      "(Llama, Mistral, Qwen2/2.5, Qwen3) on the CPU."};
  app.name("kvboost");
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvboost " KVBOOST_VERSION " (git " KVBOOST_GIT_COMMIT ")");
  kvboost::cli::add_generate(app);
  kvboost::cli::add_tokenize(app);
  kvboost::cli::add_logits(app);
  kvboost::cli::add_cache_commands(app);
  CLI::App* bench = kvboost::cli::add_bench(app);
  kvboost::cli::add_bench_reuse(bench);
  kvboost::cli::add_bench_stream(bench);
  kvboost::cli::add_bench_batch(bench);
  kvboost::cli::add_bench_grammar(bench);
  kvboost::cli::add_json_output(bench);  // after every bench subcommand exists
  kvboost::cli::add_serve(app);
  kvboost::cli::add_chat(app);
  // llama.cpp spells the system prompt -sys; CLI11 takes one-letter short options only.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(std::string(argv[i]) == "-sys" ? "--system" : argv[i]);
  try {
    app.parse(args);
    kvboost::cli::finish_json_output(true);
  } catch (const CLI::ParseError& e) {
    kvboost::cli::finish_json_output(false);
    return app.exit(e);
  } catch (const std::exception& e) {  // kvboost::Error and anything else
    kvboost::cli::finish_json_output(false);
    std::fflush(stdout);
    const kvboost::cli::Style st = kvboost::cli::Style::on(2);
    std::fprintf(stderr, "kvboost: %serror:%s %s\n", st.red(), st.reset(), e.what());
    return 1;
  }
  return 0;
}
