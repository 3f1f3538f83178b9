// kvboost chat: an interactive conversation over the model's chat template.
//
// Each turn renders the whole conversation through the template and generates from it; the
// engine's prefix cache holds the K/V of the previous turns (prompt and reply), so a turn
// computes only what is new since the last one. The per-turn line on stderr shows it (cached
// tokens, time to first token).
//
// Input: one line is one message; a line ending in a backslash continues on the next line; a
// line holding only """ starts a block that runs to the next such line. Commands: /exit (or
// /quit, or end of input), /reset, /system TEXT, /help. Ctrl-C while a reply streams stops the
// reply (what was generated stays in the conversation); at the prompt it exits. Prompts and
// colours appear only when stdin/stdout are a terminal, so piped input gives plain output.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_util.h"
#include "kvboost/chat.h"

namespace kvboost::cli {

namespace {
struct ChatArgs {
  std::string model, system, chat_template;
  int max_tokens = 512;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
  int threads = 0;
  int64_t ctx_size = 0;
  std::string kv_budget, weight_budget = "0", head_quant = "auto";
  bool quiet = false;
};

std::atomic<bool> g_generating{false};
std::atomic<bool> g_stop{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_stop = true;
    return;
  }
  const char nl = '\n';
  (void)!write(STDOUT_FILENO, &nl, 1);
  _exit(130);
}

// One message from the input: continuation lines (trailing backslash) and """ blocks joined.
// nullopt at the end of input.
std::optional<std::string> read_message(bool tty, const Style& st) {
  std::string msg, line;
  bool block = false, more = false;
  for (;;) {
    if (tty) {
      std::fputs(block || more ? "... " : "", stdout);
      if (!block && !more) std::fprintf(stdout, "%s> %s", st.green(), st.reset());
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) {
      if (msg.empty()) return std::nullopt;
      return msg;  // the input ended inside a block or after a continuation: take what came
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (block) {
      if (line == "\"\"\"") return msg;
      msg += (msg.empty() && !more ? "" : "\n") + line;
      more = true;
      continue;
    }
    if (line == "\"\"\"" && msg.empty()) {
      block = true;
      continue;
    }
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      msg += line + "\n";
      more = true;
      continue;
    }
    msg += line;
    return msg;
  }
}

void run_chat(const ChatArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.model.empty()) fail("kvboost chat needs a model: -m DIR or -m FILE.gguf");
  const bool tty_in = isatty(STDIN_FILENO), tty_out = isatty(STDOUT_FILENO);
  const bool interactive = tty_in && tty_out;
  const Style out_st = interactive ? Style::on(STDOUT_FILENO) : Style{};
  const Style err_st = Style::on(STDERR_FILENO);

  // The template first: a model without one fails before its weights are loaded.
  const std::string cfg = chat_config_for(a.model, a.chat_template);
  std::vector<std::string> stop;
  if (const std::string end = builtin_chat_template_end(a.chat_template); !end.empty()) stop.push_back(end);

  EngineOptions eopt;
  if (!a.kv_budget.empty()) eopt.kv_budget_bytes = parse_bytes(a.kv_budget, "--kv-budget");
  else if (a.ctx_size > 0) eopt.kv_budget_bytes = kv_bytes_for_tokens(a.model, a.ctx_size, eopt.block_size);
  eopt.load.weight_budget = parse_weight_budget(a.weight_budget);
  eopt.load.head_quant = parse_head_quant(a.head_quant, "--head-quant");
  eopt.chunk_store.ram_bytes = 0;  // one conversation: the paged prefix cache is the reuse
  auto engine = load_engine(a.model, a.quiet, eopt);
  const Tokenizer& tok = engine->tokenizer();

  std::string system = a.system;
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  auto reset = [&] {
    msgs = nlohmann::ordered_json::array();
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
  };
  reset();

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);

  if (interactive && !a.quiet)
    std::fprintf(stderr,
                 "%skvboost chat: %s (context %lld tokens). /exit, /reset, /system TEXT, /help; end a line with \\ "
                 "or wrap lines in \"\"\" for multi-line input; Ctrl-C stops a reply.%s\n",
                 err_st.dim(), a.model.c_str(), (long long)engine->context_length(), err_st.reset());
  int turn = 0;
  for (;;) {
    std::optional<std::string> in = read_message(interactive, out_st);
    if (!in) break;
    std::string text = *in;
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/help") {
      std::fprintf(stderr,
                   "/exit, /quit: leave | /reset: forget the conversation (the system message stays) | "
                   "/system TEXT: set the system message and start over | a line ending in \\ continues | "
                   "\"\"\" on its own line starts and ends a multi-line message\n");
      continue;
    }
    if (text == "/reset") {
      reset();
      if (!a.quiet) std::fprintf(stderr, "%skvboost chat: conversation reset%s\n", err_st.yellow(), err_st.reset());
      continue;
    }
    if (text.rfind("/system", 0) == 0 && (text.size() == 7 || text[7] == ' ')) {
      system = text.size() > 8 ? text.substr(8) : "";
      reset();
      if (!a.quiet)
        std::fprintf(stderr, "%skvboost chat: system message %s; conversation reset%s\n", err_st.yellow(),
                     system.empty() ? "cleared" : "set", err_st.reset());
      continue;
    }
    if (text[0] == '/' && text.find(' ') == std::string::npos && text.find('\n') == std::string::npos) {
      std::fprintf(stderr, "kvboost chat: unknown command %s (/help lists them)\n", text.c_str());
      continue;
    }

    msgs.push_back({{"role", "user"}, {"content", text}});
    GenerateResult r;
    try {
      const std::string prompt = apply_chat_template(cfg, msgs, true);
      // As transformers' apply_chat_template(tokenize=True): the template supplies special tokens.
      const std::vector<int32_t> ids = tok.encode(prompt, false);
      GenerateOptions opt;
      opt.max_new_tokens = a.max_tokens;
      opt.sampling.temperature = a.temperature;
      opt.sampling.top_k = a.top_k;
      opt.sampling.top_p = a.top_p;
      opt.sampling.min_p = a.min_p;
      opt.sampling.repetition_penalty = a.repetition_penalty;
      opt.sampling.seed = a.seed + uint64_t(turn);
      opt.stop = stop;
      opt.on_text = [&](std::string_view s) {
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
        return !g_stop.load();
      };
      if (interactive) std::fputs(out_st.cyan(), stdout);
      g_stop = false;
      g_generating = true;
      r = engine->generate_ids(ids, opt);
      g_generating = false;
      if (interactive) std::fputs(out_st.reset(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    } catch (const Error& e) {
      g_generating = false;
      msgs.erase(msgs.size() - 1);
      std::fflush(stdout);
      std::fprintf(stderr, "kvboost chat: %serror:%s %s (the message was dropped; /reset starts over)\n", err_st.red(),
                   err_st.reset(), e.what());
      continue;
    }
    ++turn;
    const bool stopped = g_stop.exchange(false);
    msgs.push_back({{"role", "assistant"}, {"content", r.text}});
    if (!a.quiet) {
      const double pct = r.n_prompt() ? 100.0 * double(r.n_cached) / double(r.n_prompt()) : 0;
      std::fprintf(stderr,
                   "%s[turn %d: prompt %d tokens, %lld cached (%.0f%%) | ttft %.1f ms | %zu tokens, %.1f tokens/s | %s]%s\n",
                   err_st.dim(), turn, r.n_prompt(), (long long)r.n_cached, pct, r.ttft_ms, r.output_ids.size(),
                   r.decode_tok_per_s(), stopped ? "stopped by Ctrl-C" : r.finish_reason.c_str(), err_st.reset());
      if (r.finish_reason == "length" && r.n_prompt() + int64_t(r.output_ids.size()) >= engine->context_length())
        std::fprintf(stderr, "%skvboost chat: the context is full; /reset starts over%s\n", err_st.yellow(), err_st.reset());
    }
  }
}
}  // namespace

void add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* c = app.add_subcommand("chat", "Chat with a model interactively (reads stdin; works piped too)");
  c->add_option("-m,--model", a->model, "Model: a Hugging Face directory or a .gguf file")->required();
  c->add_option("--system", a->system, "System message (-sys works too, as in llama.cpp)");
  c->add_option("--chat-template", a->chat_template, kChatTemplateHelp);
  c->add_option("-n,--max-tokens", a->max_tokens, "Most tokens per reply")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--temp,--temperature", a->temperature, "Sampling temperature; 0 = greedy (default: the model's generation_config.json)");
  c->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)");
  c->add_option("--top-p", a->top_p, "Nucleus sampling (1 = off)");
  c->add_option("--min-p", a->min_p, "Drop tokens less likely than min-p times the most likely one (0 = off)");
  c->add_option("--repeat-penalty,--repetition-penalty", a->repetition_penalty, "Penalise repeated tokens (1 = off)");
  c->add_option("-s,--seed", a->seed, "Random seed (turn i uses seed + i)")->capture_default_str();
  c->add_option("-t,--threads", a->threads, "Worker threads (default: all cores)");
  c->add_option("-c,--ctx-size", a->ctx_size, "KV memory for this many tokens (default: the model's context)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--kv-budget", a->kv_budget, "Bytes of KV memory, e.g. 512MiB (overrides -c)");
  c->add_option("--weight-budget", a->weight_budget, kWeightBudgetHelp);
  c->add_option("--head-quant", a->head_quant, kHeadQuantHelp)->capture_default_str();
  c->add_flag("-q,--quiet", a->quiet, "No banner or per-turn statistics on stderr");
  c->callback([a]() { run_chat(*a); });
}

}  // namespace kvboost::cli
