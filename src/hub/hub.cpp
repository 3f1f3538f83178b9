// --model resolution. The cache layout is huggingface_hub's (file_download.py, try_to_load_from_cache):
//   <cache>/models--ORG--NAME/refs/<revision>      a file holding the commit hash
//   <cache>/models--ORG--NAME/snapshots/<commit>/   the repo's files, symlinks into ../../blobs/
//   <cache>/models--ORG--NAME/blobs/<etag>          the contents
// A revision that is itself a 40-hex commit hash names snapshots/<revision>/ directly.
#include "kvboost/hub.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "kvboost/common.h"

namespace kvboost {

namespace fs = std::filesystem;

namespace {

bool name_ok(const std::string& s) {
  if (s.empty() || s.size() > 96 || s[0] == '.' || s[0] == '-' || s.find("..") != std::string::npos) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

bool revision_ok(const std::string& s) {
  if (s.empty() || s.find("..") != std::string::npos || s[0] == '/') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  return true;
}

bool is_commit_hash(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string expand_user(const std::string& p) {
  if (p.empty() || p[0] != '~' || (p.size() > 1 && p[1] != '/')) return p;
  const std::string home = env("HOME");
  return home.empty() ? p : home + p.substr(1);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string download_command(const HubId& id) {
  std::string cmd = "huggingface-cli download " + id.repo;
  if (!id.file.empty()) cmd += " " + id.file;
  if (id.revision != "main") cmd += " --revision " + id.revision;
  return cmd;
}

std::vector<std::string> gguf_files(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".gguf") == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string HubId::text() const {
  std::string s = repo;
  if (revision != "main") s += "@" + revision;
  if (!file.empty()) s += ":" + file;
  return s;
}

bool parse_hub_id(const std::string& s, HubId* out) {
  HubId id;
  std::string rest = s;
  // FILE after the last ':' (a Hub name never holds one), REVISION after the first '@'.
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    id.file = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (id.file.empty() || id.file.find('/') != std::string::npos || !name_ok(id.file)) return false;
  }
  if (const size_t at = rest.find('@'); at != std::string::npos) {
    id.revision = rest.substr(at + 1);
    rest = rest.substr(0, at);
    if (!revision_ok(id.revision)) return false;
  } else {
    id.revision = "main";
  }
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || rest.find('/', slash + 1) != std::string::npos) return false;
  if (!name_ok(rest.substr(0, slash)) || !name_ok(rest.substr(slash + 1))) return false;
  id.repo = rest;
  if (out) *out = id;
  return true;
}

std::string hf_hub_cache_dir(std::string* source) {
  auto pick = [&](const std::string& v, const char* from) {
    if (source) *source = from;
    return expand_user(v);
  };
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) return pick(v, "$HF_HUB_CACHE");
  if (std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return pick(v, "$HUGGINGFACE_HUB_CACHE");
  if (std::string v = env("HF_HOME"); !v.empty()) return pick(v + "/hub", "$HF_HOME/hub");
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty()) return pick(v + "/huggingface/hub", "$XDG_CACHE_HOME/huggingface/hub");
  return pick("~/.cache/huggingface/hub", "default");
}

ResolvedModel resolve_model(const std::string& arg) {
  if (arg.empty()) fail("--model: empty model path");
  std::error_code ec;
  if (fs::exists(arg, ec)) return ResolvedModel{arg, "", ""};
  HubId id;
  if (!parse_hub_id(arg, &id)) fail(arg, ": no such directory (and not a Hugging Face id ORG/NAME[@REVISION][:FILE.gguf])");

  std::string source;
  const std::string cache = hf_hub_cache_dir(&source);
  std::string folder = "models--" + id.repo;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path repo_dir = fs::path(cache) / folder;
  if (!fs::is_directory(repo_dir, ec))
    fail(arg, ": no such directory, and Hugging Face model ", id.repo, " is not in the cache (searched ",
         repo_dir.string(), "; cache ", cache, " from ", source, "). Download it with:\n  ", download_command(id));

  std::string commit;
  if (const fs::path ref = repo_dir / "refs" / id.revision; fs::is_regular_file(ref, ec)) {
    std::ifstream f(ref);
    std::stringstream ss;
    ss << f.rdbuf();
    commit = trim(ss.str());
    if (!is_commit_hash(commit)) fail(ref.string(), ": holds \"", commit, "\", not a 40-hex commit hash");
  } else if (is_commit_hash(id.revision)) {
    commit = id.revision;
  } else {
    std::string have;
    for (const auto& e : fs::directory_iterator(repo_dir / "refs", ec)) have += (have.empty() ? "" : ", ") + e.path().filename().string();
    fail(arg, ": revision \"", id.revision, "\" of ", id.repo, " is not in the Hugging Face cache (no ", ref.string(),
         have.empty() ? std::string("; no refs cached") : "; cached refs: " + have, "). Download it with:\n  ",
         download_command(id));
  }
  const fs::path snap = repo_dir / "snapshots" / commit;
  if (!fs::is_directory(snap, ec))
    fail(arg, ": ", id.repo, "@", id.revision, " points at commit ", commit, " but ", snap.string(),
         " does not exist (an interrupted download?). Download it with:\n  ", download_command(id));

  ResolvedModel r{snap.string(), id.text(), commit};
  if (!id.file.empty()) {
    const fs::path f = snap / id.file;
    if (!fs::exists(f, ec)) {
      std::string have;
      for (const auto& n : gguf_files(snap)) have += (have.empty() ? "" : ", ") + n;
      fail(arg, ": ", id.file, " is not in the cached snapshot ", snap.string(),
           have.empty() ? std::string(" (it holds no .gguf file)") : " (it holds " + have + ")", ". Download it with:\n  ",
           download_command(id));
    }
    r.path = f.string();
    return r;
  }
  if (fs::exists(snap / "config.json", ec)) return r;
  const std::vector<std::string> ggufs = gguf_files(snap);
  if (ggufs.size() == 1) {
    r.path = (snap / ggufs[0]).string();
    return r;
  }
  if (ggufs.size() > 1) {
    std::string have;
    for (const auto& n : ggufs) have += "\n  " + id.repo + ":" + n;
    fail(arg, ": the cached snapshot ", snap.string(), " holds ", ggufs.size(), " .gguf files; name one:", have);
  }
  fail(arg, ": the cached snapshot ", snap.string(), " holds neither config.json nor a .gguf file (an incomplete "
       "download?). Download it with:\n  ", download_command(id));
}

}  // namespace kvboost
