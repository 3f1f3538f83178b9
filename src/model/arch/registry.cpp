// The architecture list: one line per file of this folder (docs/architecture.md "Adding an
// architecture"). Order is supported_model_types()'s.
#include <algorithm>

#include "../arch.h"

namespace kvboost::arch {

const std::vector<const Arch*>& all() {
  static const std::vector<const Arch*> list = {&kLlama, &kMistral, &kQwen2, &kQwen3, &kGemma3};
  return list;
}

const Arch* find(const std::string& model_type) {
  for (const Arch* a : all())
    if (model_type == a->model_type || (a->alias && model_type == a->alias)) return a;
  return nullptr;
}

const Arch& find_gguf(const std::string& gguf_arch, const std::string& path) {
  std::string list;
  for (const Arch* a : all()) {
    if (!a->gguf_arch) continue;
    if (gguf_arch == a->gguf_arch) return *a;
    list += (list.empty() ? "" : ", ") + std::string(a->gguf_arch);
  }
  fail(path, ": general.architecture \"", gguf_arch, "\" is not supported (supported: ", list, ")");
}

const LayerTensor* tensor(const Arch& a, Role r) {
  for (const LayerTensor& t : a.tensors)
    if (t.role == r) return &t;
  return nullptr;
}

}  // namespace kvboost::arch
