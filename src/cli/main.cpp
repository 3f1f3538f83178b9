// kvboost — command-line interface. Errors from the library are printed as
// "kvboost: error: <message>" with exit status 1; usage errors exit with CLI11's codes.
#include <cstdio>

#include "cli_util.h"

int main(int argc, char** argv) {
  CLI::App app{
      "KVBoost: a C++ inference engine for Hugging Face causal language models\n"
      "(Llama, Mistral, Qwen2/2.5, Qwen3) on the CPU."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvboost 0.1.0");
  kvboost::cli::add_generate(app);
  kvboost::cli::add_tokenize(app);
  kvboost::cli::add_logits(app);
  kvboost::cli::add_cache_commands(app);
  CLI::App* bench = kvboost::cli::add_bench(app);
  kvboost::cli::add_bench_reuse(bench);
  kvboost::cli::add_bench_stream(bench);
  kvboost::cli::add_bench_batch(bench);
  kvboost::cli::add_bench_grammar(bench);
  kvboost::cli::add_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvboost::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvboost: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvboost: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
