// resolve_model over a fake Hugging Face cache laid out as huggingface_hub writes it: refs/<rev>
// holding a commit hash, snapshots/<commit>/ whose files are relative symlinks into blobs/.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "kvboost/common.h"
#include "kvboost/hub.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace kvboost;
using kvboost::test::make_temp_dir;

namespace {

const std::string kMain = "0123456789abcdef0123456789abcdef01234567";
const std::string kOld = "89abcdef0123456789abcdef0123456789abcdef";

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

// One snapshot file: the blob under blobs/<etag>, the snapshot entry a relative symlink to it.
void add_file(const fs::path& repo, const std::string& commit, const std::string& name, const std::string& data) {
  const std::string etag = "blob-" + commit.substr(0, 6) + "-" + name;
  write(repo / "blobs" / etag, data);
  fs::create_directories(repo / "snapshots" / commit);
  fs::create_symlink(fs::path("../../blobs") / etag, repo / "snapshots" / commit / name);
}

std::string message_of(const std::string& arg) {
  try {
    resolve_model(arg);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const char* k, const char* v) {
    const char* old = getenv(k);
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    if (v) setenv(k, v, 1);
    else unsetenv(k);
  }
  ~EnvGuard() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      if (it->second) setenv(it->first.c_str(), it->second->c_str(), 1);
      else unsetenv(it->first.c_str());
  }
};

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache = make_temp_dir("hub_cache");
    env.set("HF_HUB_CACHE", cache.c_str());
    const fs::path repo = fs::path(cache) / "models--acme--tiny";
    write(repo / "refs" / "main", kMain);  // huggingface_hub writes no newline; accept one anyway
    write(repo / "refs" / "v1", kOld + "\n");
    add_file(repo, kMain, "config.json", "{}");
    add_file(repo, kMain, "tokenizer.json", "{}");
    add_file(repo, kOld, "config.json", "{\"old\": true}");
    const fs::path g = fs::path(cache) / "models--acme--tiny-GGUF";
    write(g / "refs" / "main", kMain);
    add_file(g, kMain, "tiny-q8_0.gguf", "GGUF");
    add_file(g, kMain, "tiny-q4_0.gguf", "GGUF");
    const fs::path one = fs::path(cache) / "models--acme--one-GGUF";
    write(one / "refs" / "main", kMain);
    add_file(one, kMain, "one.gguf", "GGUF");
    add_file(one, kMain, "README.md", "");
  }
  EnvGuard env;
  std::string cache;
};

}  // namespace

TEST(HubId, Parses) {
  HubId id;
  ASSERT_TRUE(parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct", &id));
  EXPECT_EQ(id.repo, "Qwen/Qwen2.5-0.5B-Instruct");
  EXPECT_EQ(id.revision, "main");
  EXPECT_EQ(id.file, "");
  ASSERT_TRUE(parse_hub_id("org/name@v1.0:model-Q4_K_M.gguf", &id));
  EXPECT_EQ(id.repo, "org/name");
  EXPECT_EQ(id.revision, "v1.0");
  EXPECT_EQ(id.file, "model-Q4_K_M.gguf");
  EXPECT_EQ(id.text(), "org/name@v1.0:model-Q4_K_M.gguf");
  EXPECT_FALSE(parse_hub_id("name-only", &id));
  EXPECT_FALSE(parse_hub_id("/abs/path", &id));
  EXPECT_FALSE(parse_hub_id("./rel/path", &id));
  EXPECT_FALSE(parse_hub_id("a/b/c", &id));
  EXPECT_FALSE(parse_hub_id("../x", &id));
  EXPECT_FALSE(parse_hub_id("org/na me", &id));
  EXPECT_FALSE(parse_hub_id("org/name@", &id));
}

TEST(HubCacheDir, FollowsHuggingFaceHubPrecedence) {
  EnvGuard env;
  env.set("HF_HUB_CACHE", nullptr);
  env.set("HUGGINGFACE_HUB_CACHE", nullptr);
  env.set("HF_HOME", nullptr);
  env.set("XDG_CACHE_HOME", nullptr);
  env.set("HOME", "/home/u");
  std::string src;
  EXPECT_EQ(hf_hub_cache_dir(&src), "/home/u/.cache/huggingface/hub");
  EXPECT_EQ(src, "default");
  env.set("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(hf_hub_cache_dir(), "/xdg/huggingface/hub");
  env.set("HF_HOME", "/hfhome");
  EXPECT_EQ(hf_hub_cache_dir(&src), "/hfhome/hub");
  EXPECT_EQ(src, "$HF_HOME/hub");
  env.set("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(hf_hub_cache_dir(), "/legacy");
  env.set("HF_HUB_CACHE", "~/hc");
  EXPECT_EQ(hf_hub_cache_dir(&src), "/home/u/hc");
  EXPECT_EQ(src, "$HF_HUB_CACHE");
}

TEST_F(HubTest, LocalPathsPassThrough) {
  const std::string dir = make_temp_dir("hub_local");
  EXPECT_EQ(resolve_model(dir).path, dir);
  EXPECT_EQ(resolve_model(dir).hub_id, "");
  write(fs::path(dir) / "m.gguf", "GGUF");
  EXPECT_EQ(resolve_model(dir + "/m.gguf").path, dir + "/m.gguf");
}

TEST_F(HubTest, MissingFolderSaysNoSuchDirectory) {
  const std::string m = message_of("/nonexistent/model/dir");
  EXPECT_NE(m.find("/nonexistent/model/dir: no such directory"), std::string::npos) << m;
  EXPECT_EQ(m.find("tokenizer"), std::string::npos) << m;
}

TEST_F(HubTest, ResolvesMainToTheSnapshotThroughRefs) {
  const ResolvedModel r = resolve_model("acme/tiny");
  EXPECT_EQ(r.path, cache + "/models--acme--tiny/snapshots/" + kMain);
  EXPECT_EQ(r.hub_id, "acme/tiny");
  EXPECT_EQ(r.commit, kMain);
  EXPECT_EQ(read_file(r.path + "/config.json"), "{}");  // through the blobs/ symlink
}

TEST_F(HubTest, ResolvesARevisionBranchOrCommit) {
  EXPECT_EQ(resolve_model("acme/tiny@v1").path, cache + "/models--acme--tiny/snapshots/" + kOld);
  EXPECT_EQ(resolve_model("acme/tiny@v1").hub_id, "acme/tiny@v1");
  EXPECT_EQ(resolve_model("acme/tiny@" + kOld).commit, kOld);
  const std::string m = message_of("acme/tiny@v2");
  EXPECT_NE(m.find("revision \"v2\""), std::string::npos) << m;
  EXPECT_NE(m.find("cached refs:"), std::string::npos) << m;
  EXPECT_NE(m.find("huggingface-cli download acme/tiny --revision v2"), std::string::npos) << m;
}

TEST_F(HubTest, GgufRepos) {
  const std::string snap = cache + "/models--acme--one-GGUF/snapshots/" + kMain;
  EXPECT_EQ(resolve_model("acme/one-GGUF").path, snap + "/one.gguf");  // the only .gguf
  EXPECT_EQ(resolve_model("acme/tiny-GGUF:tiny-q4_0.gguf").path,
            cache + "/models--acme--tiny-GGUF/snapshots/" + kMain + "/tiny-q4_0.gguf");
  std::string m = message_of("acme/tiny-GGUF");  // two: name one
  EXPECT_NE(m.find("holds 2 .gguf files"), std::string::npos) << m;
  EXPECT_NE(m.find("acme/tiny-GGUF:tiny-q8_0.gguf"), std::string::npos) << m;
  m = message_of("acme/tiny-GGUF:nope.gguf");
  EXPECT_NE(m.find("nope.gguf is not in the cached snapshot"), std::string::npos) << m;
  EXPECT_NE(m.find("tiny-q4_0.gguf, tiny-q8_0.gguf"), std::string::npos) << m;
}

TEST_F(HubTest, MissingIdNamesIdFolderAndDownloadCommand) {
  const std::string m = message_of("Qwen/Qwen2.5-0.5B-Instruct");
  EXPECT_NE(m.find("Qwen/Qwen2.5-0.5B-Instruct"), std::string::npos) << m;
  EXPECT_NE(m.find(cache + "/models--Qwen--Qwen2.5-0.5B-Instruct"), std::string::npos) << m;
  EXPECT_NE(m.find("$HF_HUB_CACHE"), std::string::npos) << m;
  EXPECT_NE(m.find("huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"), std::string::npos) << m;
}

TEST_F(HubTest, BrokenCacheEntriesAreNamed) {
  const fs::path repo = fs::path(cache) / "models--acme--broken";
  write(repo / "refs" / "main", "not-a-hash");
  std::string m = message_of("acme/broken");
  EXPECT_NE(m.find("not a 40-hex commit hash"), std::string::npos) << m;
  write(repo / "refs" / "main", kMain);  // the ref points at a snapshot that is not there
  m = message_of("acme/broken");
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
  fs::create_directories(repo / "snapshots" / kMain);  // empty snapshot
  m = message_of("acme/broken");
  EXPECT_NE(m.find("neither config.json nor a .gguf file"), std::string::npos) << m;
}
