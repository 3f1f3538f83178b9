// First contact (issue 20): `kvboost chat` over piped stdin, llama.cpp flag spellings,
// --chat-template, --version, bench --json. Real processes, as a user runs them.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli_paths.h"
#include "test_util.h"

namespace {

struct Proc {
  int rc;
  std::string out, err;
};

Proc run(const std::string& args, const std::string& stdin_data = "") {
  static int counter = 0;
  const std::string dir = kvboost::test::make_temp_dir("cli_first_" + std::to_string(getpid()) + "_" +
                                                       std::to_string(counter++));
  const std::string in = dir + "/in", out = dir + "/out", err = dir + "/err";
  { std::ofstream(in, std::ios::binary) << stdin_data; }
  const std::string cmd = kvboost::test::cli_binary() + " " + args + " <" + in + " >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  Proc r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string stories() { return kvboost::test::model_path("stories260K"); }

// stories260K with a ChatML-style template in its tokenizer_config.json (the model has none).
std::string stories_with_template() {
  namespace fs = std::filesystem;
  const std::string dir = kvboost::test::make_temp_dir("cli_chat_model");
  for (const auto& e : fs::directory_iterator(stories())) fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  std::ifstream f(dir + "/tokenizer_config.json");
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(f);
  cfg["chat_template"] =
      "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}";
  fs::permissions(dir + "/tokenizer_config.json", fs::perms::owner_write, fs::perm_options::add);
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump(2);
  return dir;
}

struct Turn {
  int n, prompt, cached;
};
std::vector<Turn> turns(const std::string& err) {
  std::vector<Turn> out;
  static const std::regex re(R"(\[turn (\d+): prompt (\d+) tokens, (\d+) cached)");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it)
    out.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3])});
  return out;
}

}  // namespace

TEST(CliChat, PipedStdinRunsTurnsResetAndExit) {
  const std::string model = stories_with_template();
  // turn 1, turn 2 (the history cached), /reset, turn 3 = turn 1 again, /exit; the line after
  // /exit is never read.
  Proc r = run("chat -m " + model + " -n 24 --temp 0", "Once upon a time\nThe dog ran\n/reset\nOnce upon a time\n/exit\nnever\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<Turn> t = turns(r.err);
  ASSERT_EQ(t.size(), 3u) << r.err;
  EXPECT_NE(r.err.find("conversation reset"), std::string::npos) << r.err;
  // Turn 2's prompt holds turn 1's prompt and reply: the prefix cache serves most of it.
  EXPECT_GT(t[1].prompt, t[0].prompt);
  EXPECT_GE(t[1].cached, 16) << r.err;
  // After /reset the conversation is turn 1's again: the same prompt, all but its last token
  // cached (the last is run to get logits), and greedy gives the same reply.
  EXPECT_EQ(t[2].prompt, t[0].prompt);
  EXPECT_GE(t[2].cached, (t[0].prompt - 1) / 16 * 16) << r.err;
  // Replies stream to stdout, one after another, each ending in a newline (story text may hold
  // newlines of its own): turn 3's reply is a one-turn chat's reply, and so is turn 1's.
  Proc one = run("chat -m " + model + " -n 24 --temp 0", "Once upon a time\n");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_GT(one.out.size(), 1u);
  ASSERT_GT(r.out.size(), 2 * one.out.size());
  EXPECT_EQ(r.out.substr(0, one.out.size()), one.out);
  EXPECT_EQ(r.out.substr(r.out.size() - one.out.size()), one.out);
  // Piped: no prompt characters, no colour codes.
  EXPECT_EQ(r.out.find("> "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\033'), std::string::npos);
  EXPECT_EQ(r.err.find('\033'), std::string::npos);
}

TEST(CliChat, MultiLineInputIsOneMessage) {
  const std::string model = stories_with_template();
  // a continued line and a """ block: two messages, so two turns
  Proc r = run("chat -m " + model + " -n 4 --temp 0", "Once upon \\\na time\n\"\"\"\nThe dog\nran home\n\"\"\"\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(turns(r.err).size(), 2u) << r.err;
  // the system message is rendered into the prompt: a longer prompt than without it
  Proc a = run("chat -m " + model + " -n 2 --temp 0", "Hi\n");
  Proc b = run("chat -m " + model + " -n 2 --temp 0 -sys 'You tell stories.'", "Hi\n");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  ASSERT_EQ(turns(a.err).size(), 1u);
  ASSERT_EQ(turns(b.err).size(), 1u);
  EXPECT_GT(turns(b.err)[0].prompt, turns(a.err)[0].prompt);
}

TEST(CliChat, ModelWithoutTemplateNamesTheFlag) {
  Proc r = run("chat -m " + stories() + " -n 4", "Hi\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("has no chat template"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
  r = run("chat -m " + stories() + " --chat-template vicuna", "Hi\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("chatml, llama3, gemma, mistral"), std::string::npos) << r.err;
  // a built-in template makes it work; so does a template file
  r = run("chat -m " + stories() + " --chat-template chatml -n 4 --temp 0", "Hi\n/exit\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(turns(r.err).size(), 1u) << r.err;
  const std::string dir = kvboost::test::make_temp_dir("cli_tpl");
  { std::ofstream(dir + "/t.jinja") << "{% for m in messages %}{{ m['content'] }}{% endfor %}"; }
  r = run("chat -m " + stories() + " --chat-template " + dir + "/t.jinja -n 4 --temp 0", "Once upon a time\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  { std::ofstream(dir + "/bad.jinja") << "{% for m in messages %}"; }
  r = run("chat -m " + stories() + " --chat-template " + dir + "/bad.jinja", "Hi\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("bad.jinja"), std::string::npos) << r.err;
}

TEST(CliChat, GenerateWithChatTemplateRendersTheTurn) {
  Proc r = run("generate -m " + stories() + " --chat-template chatml -p 'Hi' -n 2 --temp 0 -q");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0), 0u) << r.out;
  r = run("generate -m " + stories() + " --chat -p Hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
}

TEST(CliFlags, DashTIsThreadsAndTempIsTemperature) {
  // -t 1: one thread (said on stderr), the greedy story unchanged. -t used to be temperature.
  Proc r = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 -t 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("threads: 1 "), std::string::npos) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << r.out;
  Proc t = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 --threads 1");
  EXPECT_EQ(t.out, r.out);
  // --temp and --temperature are one option; a sampled run differs from the greedy one
  Proc a = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 --temp 1.5 -s 7 -q");
  Proc b = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 --temperature 1.5 -s 7 -q");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, r.out);
  r = run("generate -m " + stories() + " -p hi --temp -1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
}

TEST(CliFlags, RepeatPenaltyCtxSizeAndStdin) {
  Proc a = run("generate -m " + stories() + " -p 'Once upon a time' -n 60 --repeat-penalty 1.5 -q");
  Proc b = run("generate -m " + stories() + " -p 'Once upon a time' -n 60 --repetition-penalty 1.5 -q");
  Proc g60 = run("generate -m " + stories() + " -p 'Once upon a time' -n 60 -q");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, g60.out);
  Proc g = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 -q");
  // -f - reads the prompt from stdin
  Proc s = run("generate -m " + stories() + " -f - -n 24 -q", "Once upon a time");
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(s.out, g.out);
  // -c N: KV memory for N tokens. 64 tokens hold this prompt and reply; 8 do not.
  Proc c = run("generate -m " + stories() + " -p 'Once upon a time' -n 24 -q -c 64");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(c.out, g.out);
  Proc small = run("generate -m " + stories() + " -p 'Once upon a time, there was a little girl named Lily. She loved to play "
                   "outside in the park.' -n 24 -q --ctx-size 8");
  EXPECT_NE(small.rc, 0);
  EXPECT_NE(small.err.find("KV"), std::string::npos) << small.err;
}

TEST(CliFlags, UnknownFlagsFailLoudly) {
  for (const char* cmd : {"generate -p hi --bogus-flag", "chat -m x --bogus-flag", "serve --bogus-flag",
                          "bench reuse --bogus-flag"}) {
    Proc r = run(cmd);
    EXPECT_NE(r.rc, 0) << cmd;
    EXPECT_NE((r.out + r.err).find("--bogus-flag"), std::string::npos) << cmd << ": " << r.err;
  }
}

TEST(CliFlags, VersionHasTheGitCommit) {
  Proc r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^kvboost \d+\.\d+\.\d+ \(git ([0-9a-f]{7,}|unknown)\))"))) << r.out;
}

TEST(CliBench, JsonPrintsTheTables) {
  Proc r = run("bench batch --model " + stories() + " --batches 1,2 -n 4 --runs 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // the whole stdout is one document
  EXPECT_EQ(j["command"], "bench batch");
  ASSERT_GE(j["tables"].size(), 1u);
  const auto& t = j["tables"][0];
  EXPECT_EQ(t["columns"][0], "batch");
  ASSERT_EQ(t["rows"].size(), 2u);
  EXPECT_EQ(t["rows"][0]["batch"], 1);
  EXPECT_EQ(t["rows"][1]["batch"], 2);
  EXPECT_TRUE(t["rows"][1]["step ms"].is_number());
  // an error prints no JSON, only the error
  r = run("bench batch --model /nonexistent --json");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
}
