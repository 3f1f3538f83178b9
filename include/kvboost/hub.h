// kvboost/hub.h — what a --model argument names: a model directory, a .gguf file, or a Hugging
// Face Hub id found in the local Hugging Face cache. One resolver, used by the CLI, the server and
// Python. Uses only kvboost/common.h (and the file system); it never touches the network.
#pragma once

#include <string>

namespace kvboost {

// A parsed Hub id: ORG/NAME[@REVISION][:FILE.gguf].
struct HubId {
  std::string repo;      // ORG/NAME
  std::string revision;  // a branch, tag or commit hash; "main" when not given
  std::string file;      // FILE.gguf inside a GGUF repo; empty: the only .gguf, or a safetensors repo
  std::string text() const;  // repo[@revision][:file] as it was given (revision shown if not main)
};
// Parses `s` as a Hub id; false when it is not of that shape (then it can only be a path).
// ORG and NAME: letters, digits, '-', '_', '.'; neither starts with '.' or '-', none holds "..".
bool parse_hub_id(const std::string& s, HubId* out);

// The Hugging Face cache folder, exactly as huggingface_hub 0.36 picks it (constants.py):
// $HF_HUB_CACHE, else the legacy $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (a leading ~ expanded).
// `source`, when given, is set to where it came from ("$HF_HUB_CACHE", ..., "default").
std::string hf_hub_cache_dir(std::string* source = nullptr);

struct ResolvedModel {
  std::string path;        // what Engine::load takes: a model directory or a .gguf file
  std::string hub_id;      // the id when the argument was a Hub id (the served model name), else ""
  std::string commit;      // the snapshot's commit hash (Hub ids only)
};

// Resolves a --model argument:
//  - an existing directory or file: itself;
//  - a Hub id ORG/NAME[@REVISION][:FILE.gguf]: <cache>/models--ORG--NAME/refs/<REVISION> holds a
//    commit hash, and snapshots/<commit>/ is the model (REVISION may itself be a commit hash
//    with a snapshots/ folder); a snapshot without config.json but with .gguf files resolves to
//    FILE.gguf, or to the only .gguf file (several without FILE: an error listing them);
//  - anything else: an Error. A path that is not a Hub id says "no such directory"; a Hub id not
//    in the cache names the id, the folders searched and the command that downloads it
//    (`huggingface-cli download ORG/NAME`).
ResolvedModel resolve_model(const std::string& arg);

}  // namespace kvboost
