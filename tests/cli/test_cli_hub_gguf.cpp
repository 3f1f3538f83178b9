// `kvboost tokenize` / `detokenize -m ORG/NAME` on a GGUF-only Hub repo (issue 21): the id
// resolves through a fake Hugging Face cache (refs/, snapshots/ symlinks into blobs/) to the
// .gguf, and the tokenizer comes from its tokenizer.ggml.* metadata.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "cli_paths.h"
#include "gguf_builder.h"
#include "test_util.h"

namespace {

std::string run_cli(const std::string& args, int* rc) {
  const std::string dir = kvboost::test::make_temp_dir("cli_hub_gguf_run_" + std::to_string(getpid()));
  const std::string out = dir + "/out";
  const int st = std::system((kvboost::test::cli_binary() + " " + args + " >" + out + " 2>&1").c_str());
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(out, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(CliHub, TokenizeAGgufOnlyRepoFromTheCache) {
  namespace fs = std::filesystem;
  // A SentencePiece vocabulary in GGUF metadata (as in tests/model/test_gguf_tokenizer.cpp):
  // <unk> 0, <s> 1, </s> 2, <0xC3> 3, <0xA9> 4, ▁ 5, a 6, b 7, c 8, ab 9, bc 10, ▁a 11.
  const std::string sp = "\xe2\x96\x81";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", sp, "a", "b", "c", "ab", "bc", sp + "a"};
  std::vector<float> scores = {0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7};
  std::vector<int32_t> types = {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1};
  kvboost::test::Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv_str("tokenizer.ggml.model", "llama");
  b.kv_strs("tokenizer.ggml.tokens", tokens);
  b.kv_f32s("tokenizer.ggml.scores", scores);
  b.kv_i32s("tokenizer.ggml.token_type", types);
  const std::vector<uint8_t> bytes = b.finish();

  const std::string cache = kvboost::test::make_temp_dir("cli_hub_gguf_cache_" + std::to_string(getpid()));
  const std::string commit(40, 'd');
  const fs::path repo = fs::path(cache) / "models--someorg--tiny-GGUF";
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << commit;
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / commit);
  {
    std::ofstream f(repo / "blobs" / "sha256-tiny", std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  // No config.json, no tokenizer.json: only the GGUF (and a README, as Hub GGUF repos have).
  fs::create_symlink("../../blobs/sha256-tiny", repo / "snapshots" / commit / "tiny-Q4_K_M.gguf");
  std::ofstream(repo / "snapshots" / commit / "README.md") << "# tiny\n";

  setenv("HF_HUB_CACHE", cache.c_str(), 1);
  int rc_tok = 0, rc_file = 0, rc_detok = 0, rc_missing = 0;
  const std::string tok = run_cli("tokenize -m someorg/tiny-GGUF 'bc abc'", &rc_tok);
  const std::string tok_file = run_cli("tokenize -m someorg/tiny-GGUF:tiny-Q4_K_M.gguf 'bc abc'", &rc_file);
  const std::string detok = run_cli("detokenize -m someorg/tiny-GGUF --skip-special 1 5 10 5 9 8", &rc_detok);
  const std::string missing = run_cli("tokenize -m someorg/absent-GGUF x", &rc_missing);
  unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(rc_tok, 0) << tok;
  EXPECT_EQ(tok, "1 5 10 5 9 8\n");  // BOS, then llama.cpp's score-ordered merges
  EXPECT_EQ(rc_file, 0) << tok_file;
  EXPECT_EQ(tok_file, tok);
  EXPECT_EQ(rc_detok, 0) << detok;
  EXPECT_EQ(detok, "bc abc\n");
  EXPECT_NE(rc_missing, 0);
  EXPECT_NE(missing.find("huggingface-cli download someorg/absent-GGUF"), std::string::npos) << missing;
}
