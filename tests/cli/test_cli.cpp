// The kvboost program as a user runs it: real processes, stdout/stderr and exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli_paths.h"
#include "kvboost/kernels.h"
#include "test_util.h"

namespace {

struct Proc {
  int rc;
  std::string out, err;
};

Proc run(const std::string& args, const std::string& stdin_data = "") {
  // unique per process and call: ctest runs these test cases in parallel processes
  static int counter = 0;
  const std::string dir = kvboost::test::make_temp_dir("cli_run_" + std::to_string(getpid()) + "_" +
                                                       std::to_string(counter++));
  const std::string in = dir + "/in", out = dir + "/out", err = dir + "/err";
  { std::ofstream(in, std::ios::binary) << stdin_data; }
  const std::string cmd = kvboost::test::cli_binary() + " " + args + " <" + in + " >" + out + " 2>" + err;
  int st = std::system(cmd.c_str());
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

}  // namespace

TEST(Cli, HelpListsEveryCommandAndOption) {
  Proc r = run("--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* s : {"generate", "tokenize", "detokenize", "logits"}) EXPECT_NE(r.out.find(s), std::string::npos) << s;
  r = run("generate --help");
  EXPECT_EQ(r.rc, 0);
  for (const char* s : {"--model", "--prompt", "--max-tokens", "--temperature", "--top-p", "--top-k", "--min-p",
                        "--repetition-penalty", "--seed", "--stop", "--prompt-file"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  EXPECT_NE(run("").rc, 0);
}

TEST(Cli, GenerateStoriesPrintsTheStoryAndStats) {
  KVBOOST_REQUIRE_PATH(stories());
  Proc r = run("generate --model " + stories() + " -p 'Once upon a time' -n 40");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << r.out;
  for (const char* s : {"prompt tokens: 5", "time to first token", "prefill:", "decode:", "tokens/s"})
    EXPECT_NE(r.err.find(s), std::string::npos) << s << " in " << r.err;
  r = run("generate --model " + stories() + " -p 'Once upon a time' -n 40 --stop Lily -q --no-echo");
  EXPECT_EQ(r.out, ", there was a little girl named \n");
  EXPECT_EQ(r.err, "");
}

TEST(Cli, TokenizeReadsExactBytesFromStdin) {
  KVBOOST_REQUIRE_PATH(stories());
  Proc r = run("tokenize --model " + stories() + " 'Once upon a time'");
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
  r = run("tokenize --model " + stories() + " --no-special 'Once upon a time'");
  EXPECT_EQ(r.out, "403 407 261 378\n");
  // stdin keeps its trailing newline: a different id sequence than the argument form
  Proc s = run("tokenize --model " + stories(), "Once upon a time\n");
  EXPECT_EQ(s.out.rfind("1 403 407 261 378 ", 0), 0u) << s.out;
  EXPECT_NE(s.out, "1 403 407 261 378\n");
  // a tokenizer-only directory is enough, here the real Qwen2.5 tokenizer
  const std::string qwen = kvboost::test::shared_path("tokenizers/qwen2.5");
  if (kvboost::test::path_exists(qwen)) {
    Proc q = run("tokenize --model " + qwen + " 'Hello, world!'");
    EXPECT_EQ(q.out, "9707 11 1879 0\n");
    Proc d = run("detokenize --model " + qwen + " 9707 11 1879 0");
    EXPECT_EQ(d.out, "Hello, world!\n");
  }
  r = run("detokenize --model " + stories() + " 1 403 407 261 378 --skip-special");
  EXPECT_EQ(r.out, "Once upon a time\n");
}

TEST(Cli, BadInputIsAClearErrorNotACrash) {
  Proc r = run("generate --model /nonexistent -p hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("kvboost: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
  KVBOOST_REQUIRE_PATH(stories());
  r = run("tokenize --model " + stories(), std::string("ok \xff\xfe bad"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("invalid UTF-8"), std::string::npos) << r.err;
  r = run("detokenize --model " + stories() + " 1 99999");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("99999"), std::string::npos) << r.err;
  r = run("generate --model " + stories() + " -p hi --top-p 3");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("top_p = 3"), std::string::npos) << r.err;
  // a prompt longer than the 512-token context
  std::string longp;
  for (int i = 0; i < 400; ++i) longp += "Once upon a time ";
  const std::string dir = kvboost::test::make_temp_dir("cli_long");
  { std::ofstream(dir + "/p.txt") << longp; }
  r = run("generate --model " + stories() + " -f " + dir + "/p.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

// --head-quant (generate, serve, bench model, bench stream): a bad value names itself and the
// choices; q8_0 on stories260K keeps the greedy story (tests/model/test_head_quant.cpp).
TEST(Cli, HeadQuantOption) {
  Proc r = run("generate --model /nonexistent -p hi --head-quant q3_k");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--head-quant: \"q3_k\" is not a head quantization (auto, none, q8_0, q6_k, q4_0)"),
            std::string::npos) << r.err;
  r = run("serve --model /nonexistent --head-quant 8bit");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("\"8bit\""), std::string::npos) << r.err;
  KVBOOST_REQUIRE_PATH(stories());
  r = run("generate --model " + stories() + " -p 'Once upon a time' -n 40 --head-quant q8_0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << r.out;
}

// --device on generate, serve, bench model and bench reuse (issue 29): cpu is the default and runs; a bad
// value names itself before the model is looked at; CUDA says why it cannot run here.
TEST(Cli, DeviceOption) {
  Proc r = run("generate --model /nonexistent -p hi --device gpu0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--device: \"gpu0\" is not a device (cpu, cuda, cuda:N"), std::string::npos) << r.err;
  for (const char* cmd : {"generate --model /nonexistent -p hi", "serve --model /nonexistent",
                          "bench model --model /nonexistent", "bench reuse --model /nonexistent",
                          "bench reuse --task needle --corpus /nonexistent --model /nonexistent"}) {
    r = run(std::string(cmd) + " --device cuda:1");
    EXPECT_EQ(r.rc, 1) << cmd;
    if (kvboost::kernels::cuda_device_count() >= 2) {  // cuda:1 is usable: the engine looks for the model
      EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << cmd << ": " << r.err;
      continue;
    }
    EXPECT_NE(r.err.find("device cuda:1: "), std::string::npos) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.find("/nonexistent"), std::string::npos) << cmd << ": " << r.err;
    const bool why = r.err.find("built without CUDA (-DKVBOOST_CUDA=ON)") != std::string::npos ||
                     r.err.find("CUDA sees") != std::string::npos || r.err.find("no CUDA device") != std::string::npos;
    EXPECT_TRUE(why) << cmd << ": " << r.err;
  }
  KVBOOST_REQUIRE_PATH(stories());
  r = run("generate --model " + stories() + " -p 'Once upon a time' -n 20 --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << r.out;
}

// --tp (tensor parallelism, docs/gpu.md): generate at --tp 2 prints what --tp 1 prints; a split the
// heads do not allow names the heads and the ranks.
TEST(Cli, TpOption) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string g = "generate --model " + stories() + " -p 'Once upon a time' -n 20";
  Proc one = run(g), two = run(g + " --tp 2");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(two.rc, 0) << two.err;
  EXPECT_EQ(two.out, one.out);
  // With layer streaming (two of the five layers' slots) and with a cold tier: the same text.
  Proc streamed = run(g + " --tp 2 --weight-budget 400K");
  ASSERT_EQ(streamed.rc, 0) << streamed.err;
  EXPECT_EQ(streamed.out, one.out);
  const std::string g80 = "generate --model " + stories() + " -p 'Once upon a time' -n 80 --ignore-eos";
  Proc one80 = run(g80);  // 85 tokens: 6 blocks over a hot pool of 3
  Proc cold = run(g80 + " --tp 2 --kv-budget 64K --kv-cold-dir " + kvboost::test::make_temp_dir("cli_tp_cold"));
  ASSERT_EQ(cold.rc, 0) << cold.err;
  EXPECT_EQ(cold.out, one80.out);
  Proc bad = run(g + " --tp 3");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("8 attention heads and 4 K/V heads do not split over 3 ranks"), std::string::npos) << bad.err;
  for (const char* cmd : {"serve", "bench model"}) {
    Proc h = run(std::string(cmd) + " --help");
    EXPECT_NE(h.out.find("--tp"), std::string::npos) << cmd;
  }
}

// --vram-budget (device layer streaming) on generate, serve and bench model: on the CPU it is an
// error naming --device and --weight-budget, before the model is looked at; a bad size names itself.
TEST(Cli, VramBudgetOption) {
  for (const char* cmd : {"generate --model /nonexistent -p hi", "serve --model /nonexistent",
                          "bench model --model /nonexistent"}) {
    Proc r = run(std::string(cmd) + " --vram-budget 2GiB");
    EXPECT_EQ(r.rc, 1) << cmd;
    EXPECT_NE(r.err.find("--vram-budget 2GiB is for a CUDA device (--device cuda); on the CPU, layers stream from "
                         "disk under --weight-budget"),
              std::string::npos)
        << cmd << ": " << r.err;
    EXPECT_EQ(r.err.find("/nonexistent"), std::string::npos) << cmd << ": " << r.err;
    r = run(std::string(cmd) + " --vram-budget 2XB --device cpu");
    EXPECT_EQ(r.rc, 1) << cmd;
    EXPECT_NE(r.err.find("--vram-budget: \"2XB\" is not a byte count"), std::string::npos) << cmd << ": " << r.err;
  }
}

// bench model's decode rows are plain decodes (one token per pass, as llama-bench's tg), not the
// engine's default prompt-lookup speculation, which accepts drafts of a benchmark's repetitive
// output and so counted several tokens per pass (2026-12-04: a random-weight Q8_0 at "161% of
// the read bandwidth"); --spec lookup measures the speculative decode and says so.
TEST(Cli, BenchModelDecodesWithoutSpeculation) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string base = "bench model --model " + stories() + " --runs 1 --prefill 16 --decode-context 8 --decode-tokens 48 --no-reuse";
  Proc r = run(base);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("| decode at context 8 (tg48) |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("speculative"), std::string::npos) << r.out;
  r = run(base + " --spec lookup");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(speculative, last run: "), std::string::npos) << r.out;
  r = run(base + " --spec sometimes");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("sometimes"), std::string::npos) << r.err;
}

TEST(Cli, DemoModelWorksOffline) {
  const std::string dir = kvboost::test::make_temp_dir("cli_demo");
  setenv("KVBOOST_DEMO_MODEL", (dir + "/demo").c_str(), 1);
  Proc r = run("generate -p 'Hello there' -n 8 --ignore-eos");
  unsetenv("KVBOOST_DEMO_MODEL");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("not meaningful"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated tokens: 8"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.rfind("Hello there", 0), 0u) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/demo/model.safetensors"));
}

TEST(Cli, FixtureToolWritesEveryArchitecture) {
  const std::string dir = kvboost::test::make_temp_dir("cli_fixture");
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    const std::string out = dir + "/" + arch;
    std::string cmd = kvboost::test::fixture_tool() + " --arch " + arch + " --dtype bf16 --out " + out +
                      " --tokenizer-kind sentencepiece > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << arch;
    Proc r = run("generate --model " + out + " -p 'abc' -n 4 --ignore-eos");
    EXPECT_EQ(r.rc, 0) << arch << ": " << r.err;
    EXPECT_NE(r.err.find("generated tokens: 4"), std::string::npos) << r.err;
  }
}

TEST(Cli, GgufFileRunsWithTheTokenizerInsideIt) {
  // GGUFs holding their tokenizer (tokenizer.ggml.*) and nothing beside them generate the same
  // text as the safetensors + tokenizer.json directories they were made from: stories260K (a real
  // SentencePiece model, "llama" tokenizer) and a generated Qwen2 model ("gpt2", pre "qwen2").
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = kvboost::test::make_temp_dir("cli_gguf_tok");
  ASSERT_EQ(std::system((kvboost::test::fixture_tool() + " --arch qwen2 --dtype f32 --out " + dir + "/qsrc > /dev/null").c_str()), 0);
  struct Case { std::string src, gguf, args; };
  const std::vector<Case> cases = {
      {stories(), dir + "/s/stories.gguf", " -p 'Once upon a time' -n 24 -q"},
      {dir + "/qsrc", dir + "/q/model.gguf", " -p 'hello world' -n 12 --ignore-eos -q"}};
  for (const Case& c : cases) {
    std::filesystem::create_directories(std::filesystem::path(c.gguf).parent_path());
    const std::string conv = kvboost::test::python_bin() + " " + kvboost::test::source_dir() +
                             "/tools/oracle/gguf_fixture.py model --tokenizer --src " + c.src + " --out " + c.gguf +
                             " --type f32 > /dev/null 2>&1";
    const int st = std::system(conv.c_str());
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (kvboost::test::oracles_required()) FAIL() << "gguf_fixture.py failed: " << conv;
      GTEST_SKIP() << "python with the gguf package is not available";
    }
    EXPECT_EQ(kvboost::test::list_dir(std::filesystem::path(c.gguf).parent_path()).size(), 1u);
    Proc a = run("generate --model " + c.src + c.args);
    Proc b = run("generate --model " + c.gguf + c.args);
    ASSERT_EQ(a.rc, 0) << a.err;
    ASSERT_EQ(b.rc, 0) << b.err;
    EXPECT_EQ(a.out, b.out) << c.gguf;
    EXPECT_FALSE(a.out.empty());
  }
}

TEST(Cli, GgufFileRunsWithTokenizerBesideIt) {
  // a GGUF holding the same f32 weights as a safetensors fixture generates the same text
  const std::string dir = kvboost::test::make_temp_dir("cli_gguf");
  ASSERT_EQ(std::system((kvboost::test::fixture_tool() + " --arch llama --dtype f32 --out " + dir + "/src > /dev/null").c_str()), 0);
  std::filesystem::create_directories(dir + "/g");
  const std::string conv = kvboost::test::python_bin() + " " + kvboost::test::source_dir() +
                           "/tools/oracle/gguf_fixture.py model --src " + dir + "/src --out " + dir +
                           "/g/model.gguf --type f32 > /dev/null 2>&1";
  const int st = std::system(conv.c_str());
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    if (kvboost::test::oracles_required()) FAIL() << "gguf_fixture.py failed: " << conv;
    GTEST_SKIP() << "python with the gguf package is not available";
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(dir + "/src/" + f, dir + "/g/" + f);
  const std::string args = " -p hello -n 12 --ignore-eos -q";
  Proc a = run("generate --model " + dir + "/src" + args);
  Proc b = run("generate --model " + dir + "/g/model.gguf" + args);
  Proc c = run("generate --model " + dir + "/g" + args);
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
}

// bench reuse --corpus: prompts from real text files; the RAG rows come out, the repair settings
// are echoed, and a file too short for distinct documents is refused by name.
TEST(Cli, BenchReuseReadsACorpus) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string dir = kvboost::test::make_temp_dir("cli_corpus");
  {
    std::ofstream f(dir + "/text.txt");
    for (int i = 0; i < 300; ++i) f << "Once upon a time the little dog\nplayed in the garden. ";
  }
  { std::ofstream(dir + "/short.txt") << "too few words here"; }
  Proc r = run("bench reuse --model " + stories() + " --scenarios rag --runs 2 --docs 2 --pool 3 --doc-words 20 " +
               "--sys-words 30 --chunk 32 --repair-tokens 8 --blend-ratio 0.25 --check-layer 2 --corpus " + dir +
               "/text.txt");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("selective first 8 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cacheblend 25% by layer 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| rag | cacheblend |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("text.txt"), std::string::npos) << r.out;
  // --modes: only the named modes beside the full prefill; an unknown name is refused by name.
  r = run("bench reuse --model " + stories() + " --scenarios rag,coding --runs 1 --docs 2 --pool 3 --doc-words 20 " +
          "--sys-words 30 --chunk 32 --modes none,cacheblend --corpus " + dir + "/text.txt");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("| rag | full prefill |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| rag | chunk none |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| rag | cacheblend |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| rag | selective |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| rag | prefix |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| coding | prefix |"), std::string::npos) << r.out;
  // The guard: off, the run estimates what each threshold would do; at 1000 logits every
  // approximate prompt is recomputed and agrees with the full prefill. Real prose shipped in the
  // repository (tests/data/corpus, public domain), so this half always runs.
  const std::string gpl = kvboost::test::test_corpus();
  ASSERT_TRUE(std::ifstream(gpl).good()) << "missing " << gpl;
  {
    const std::string rag = "bench reuse --model " + stories() + " --scenarios rag --runs 4 --docs 3 --pool 5 " +
                            "--doc-words 20 --sys-words 30 --chunk 32 --modes cacheblend --corpus " + gpl;
    r = run(rag + " --guard-lead 0");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("guard below a lead of 0.00"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cacheblend, guard off: what --guard-lead L would do"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("| 0.10 | "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("the guard recomputed"), std::string::npos) << r.out;
    r = run(rag + " --guard-lead 1000");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("cacheblend: the guard recomputed 4 of 4 prompts in full"), std::string::npos) << r.out;
    // (4 prompts: the guard learns from its 4th recomputed one on, so every threshold is the given L)
    EXPECT_NE(r.out.find("threshold median 1000.000, last 1000.000 logits"), std::string::npos) << r.out;
    const size_t row = r.out.find("| rag | cacheblend |");
    ASSERT_NE(row, std::string::npos) << r.out;
    const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
    EXPECT_NE(line.find("| 100.0% | 1.00000 |"), std::string::npos) << line;
    EXPECT_EQ(r.out.find("what --guard-lead L would do"), std::string::npos) << r.out;
  }
  r = run("bench reuse --model " + stories() + " --scenarios rag --runs 1 --modes none,blend --corpus " + dir + "/text.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown mode 'blend'"), std::string::npos) << r.err;
  r = run("bench reuse --model " + stories() + " --scenarios rag --runs 1 --corpus " + dir + "/short.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("short.txt: 4 words"), std::string::npos) << r.err;
  r = run("bench reuse --model " + stories() + " --scenarios rag --runs 1 --corpus " + dir + "/missing.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
}

// --model takes a Hugging Face id through the cache layout (refs/main -> snapshots/<commit>/,
// files symlinked into blobs/); a missing one names the id and the download command.
TEST(Cli, ModelTakesAHuggingFaceIdFromTheCache) {
  KVBOOST_REQUIRE_PATH(stories());
  namespace fs = std::filesystem;
  const std::string cache = kvboost::test::make_temp_dir("cli_hf_cache_" + std::to_string(getpid()));
  const std::string commit(40, 'c');
  const fs::path repo = fs::path(cache) / "models--karpathy--stories260K";
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << commit;
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / commit);
  for (const auto& e : fs::directory_iterator(stories())) {
    const std::string name = e.path().filename().string();
    fs::copy_file(e.path(), repo / "blobs" / ("etag-" + name));
    fs::create_symlink(fs::path("../../blobs") / ("etag-" + name), repo / "snapshots" / commit / name);
  }
  setenv("HF_HUB_CACHE", cache.c_str(), 1);
  Proc r = run("generate --model karpathy/stories260K -p \"Once upon a time\" -n 8 --temperature 0 --quiet");
  Proc missing = run("generate --model karpathy/absent -p hi");
  Proc dir = run("generate --model /nonexistent/model -p hi");
  unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("huggingface-cli download karpathy/absent"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find(cache + "/models--karpathy--absent"), std::string::npos) << missing.err;
  EXPECT_NE(dir.err.find("no such directory"), std::string::npos) << dir.err;
  EXPECT_EQ(dir.err.find("tokenizer"), std::string::npos) << dir.err;
}
