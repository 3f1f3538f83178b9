// safetensors reader: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data,
// offsets relative to the end of the header. Every field is checked against the file size
// before any tensor is used, so a truncated or corrupt file is an Error, never a crash.
#include <sys/mman.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "kvboost/model.h"
#include "kvboost/model_files.h"

namespace kvboost {

using nlohmann::json;

namespace {

int64_t dtype_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

void WeightFiles::add_file(const std::string& path, const std::vector<std::string>* only) {
  auto mf = std::make_shared<MappedFile>(path);
  const size_t size = mf->size();
  if (size < 8) fail(path, ": truncated safetensors file (", size, " bytes, no header)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(mf->data()[i]) << (8 * i);
  if (hlen > size - 8) fail(path, ": corrupt safetensors header: header length ", hlen, " exceeds file size ", size);
  // The format's own limit (safetensors refuses headers over 100 MB).
  if (hlen > (uint64_t(100) << 20)) fail(path, ": corrupt safetensors header: header length ", hlen, " exceeds 100 MB");
  json header;
  // A key given twice would silently shadow the first (nlohmann keeps the last): refused.
  std::string dup_key;
  std::set<std::string> top_keys;
  const json::parser_callback_t on_key = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && !top_keys.insert(parsed.get<std::string>()).second &&
        dup_key.empty())
      dup_key = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(reinterpret_cast<const char*>(mf->data()) + 8,
                         reinterpret_cast<const char*>(mf->data()) + 8 + hlen, on_key);
  } catch (const json::exception& e) {
    fail(path, ": corrupt safetensors header: ", e.what());
  }
  if (!dup_key.empty()) fail(path, ": corrupt safetensors header: tensor \"", dup_key, "\" appears twice");
  if (!header.is_object()) fail(path, ": corrupt safetensors header: not a JSON object");
  const uint8_t* base = mf->data() + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;  // [begin, end) of every tensor
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    if (only && std::find(only->begin(), only->end(), it.key()) == only->end()) continue;
    const std::string where = path + ": tensor \"" + it.key() + "\"";
    const json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      fail(where, ": entry must have dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) fail(where, ": dtype must be a string");
    TensorInfo ti;
    ti.name = it.key();
    ti.file = path;
    ti.dtype = t["dtype"].get<std::string>();
    const int64_t esize = dtype_size(ti.dtype);
    if (esize == 0) fail(where, ": unknown dtype \"", ti.dtype, "\"");
    if (!t["shape"].is_array()) fail(where, ": shape must be a list");
    uint64_t n = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where, ": bad shape entry ", d.dump());
      if (d.get<int64_t>() > (int64_t(1) << 40)) fail(where, ": shape entry ", d.dump(), " too large");
      ti.shape.push_back(d.get<int64_t>());
      n *= uint64_t(d.get<int64_t>());
      if (n > (uint64_t(1) << 40)) fail(where, ": shape too large");
    }
    const json& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where, ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      fail(where, ": data_offsets [", b, ", ", e, "] outside the data section of ", data_size,
           " bytes (truncated file?)");
    if (e - b != n * uint64_t(esize))
      fail(where, ": data_offsets span ", e - b, " bytes but shape and dtype need ", n * uint64_t(esize));
    ti.nbytes = size_t(e - b);
    ti.data = base + b;
    if (e > b) spans.emplace_back(b, e, it.key());
    if (reinterpret_cast<uintptr_t>(ti.data) % uintptr_t(esize) != 0) {
      // Kernels may assume natural alignment: keep an aligned copy of this tensor.
      auto buf = std::make_shared<std::vector<uint8_t>>(ti.data == nullptr ? 0 : ti.nbytes + 64);
      uint8_t* p = buf->data();
      while (reinterpret_cast<uintptr_t>(p) % 64) ++p;
      std::memcpy(p, ti.data, ti.nbytes);
      ti.data = p;
      owned_.push_back(buf);
    }
    if (tensors_.count(ti.name)) fail(where, ": tensor appears twice (also in ", tensors_[ti.name].file, ")");
    tensors_[ti.name] = std::move(ti);
  }
  // Tensors must not share bytes: an overlap means a corrupt (or crafted) header.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (std::get<0>(spans[i]) < std::get<1>(spans[i - 1]))
      fail(path, ": corrupt safetensors header: tensors \"", std::get<2>(spans[i - 1]), "\" and \"", std::get<2>(spans[i]),
           "\" overlap (data_offsets [", std::get<0>(spans[i - 1]), ", ", std::get<1>(spans[i - 1]), ") and [",
           std::get<0>(spans[i]), ", ", std::get<1>(spans[i]), "))");
  files_.push_back(std::move(mf));
}

WeightFiles WeightFiles::open_file(const std::string& path) {
  WeightFiles w;
  w.add_file(path, nullptr);
  return w;
}

WeightFiles WeightFiles::open_dir(const std::string& dir) {
  WeightFiles w;
  const std::string single = path_join(dir, "model.safetensors");
  const std::string index = path_join(dir, "model.safetensors.index.json");
  if (file_exists(single)) {
    w.add_file(single, nullptr);
    w.apply_quantization(dir);
    return w;
  }
  if (!file_exists(index))
    fail(dir, ": no model.safetensors or model.safetensors.index.json (only safetensors weights are supported)");
  json j;
  try {
    j = json::parse(read_file(index));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e512
    fail(index, ": malformed JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(index, ": missing object \"weight_map\"");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(index, ": weight_map[\"", it.key(), "\"] must be a file name");
    std::string f = it.value().get<std::string>();
    if (f.find('/') != std::string::npos || f == "..") fail(index, ": weight_map names a file outside the directory: ", f);
    by_file[f].push_back(it.key());
  }
  for (const auto& [f, names] : by_file) {
    const std::string p = path_join(dir, f);
    if (!file_exists(p)) fail(p, ": shard listed in model.safetensors.index.json is missing");
    w.add_file(p, &names);
    for (const auto& n : names)
      if (!w.tensors_.count(n)) fail(p, ": tensor \"", n, "\" listed in the index is not in this shard");
  }
  w.apply_quantization(dir);
  return w;
}

const TensorInfo* WeightFiles::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> WeightFiles::paths() const {
  std::vector<std::string> v;
  for (const auto& f : files_) v.push_back(f->path());
  return v;
}

size_t WeightFiles::total_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->size();
  return n;
}

void WeightFiles::prefault(const std::function<void(size_t, size_t)>& progress) const {
  const size_t total = total_bytes();
  size_t done = 0;
  const size_t step = size_t(64) << 20;
  volatile uint8_t sink = 0;
  for (const auto& f : files_) {
    ::madvise(const_cast<uint8_t*>(f->data()), f->size(), MADV_WILLNEED);
    for (size_t off = 0; off < f->size(); off += step) {
      const size_t end = std::min(f->size(), off + step);
      for (size_t p = off; p < end; p += 4096) sink = sink + f->data()[p];
      done += end - off;
      if (progress) progress(done, total);
    }
  }
  (void)sink;
}

}  // namespace kvboost
