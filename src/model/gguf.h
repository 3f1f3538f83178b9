// Internal: a GGUF (v2/v3) file, memory-mapped and validated. Layout (little-endian):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x (string key, u32 value_type, value), n_tensors x (string name, u32 n_dims,
//   u64 ne[n_dims] (ne[0] = the contiguous dimension), u32 ggml_type, u64 offset),
//   padding to `general.alignment` (default 32), then the tensor data; offsets are relative to
//   the start of the data section. Strings are u64 length + bytes (no terminator).
// Every count, length and offset is checked against the file size before use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars: integers in i (u64 values above INT64_MAX are rejected), floats in
// f, bools in i (0/1), strings in s. Arrays: elem_type and one of ints / floats / strings.
struct Value {
  ValueType type = ValueType::U8;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  ValueType elem_type = ValueType::U8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  bool is_int() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  size_t array_size() const { return ints.size() + floats.size() + strings.size(); }
};

struct Tensor {
  std::string name;
  kernels::GgmlType type = kernels::GgmlType::F32;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the row length (contiguous)
  uint64_t offset = 0;      // from the start of the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t n_elems() const;
  int64_t rows() const { return ne.size() < 2 ? 1 : n_elems() / ne[0]; }
};

class File {
 public:
  explicit File(const std::string& path);
  const std::string& path() const { return map_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::shared_ptr<MappedFile>& mapping() const { return map_; }

  const std::map<std::string, Value>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  // Typed access; Error naming the file and key when missing (no default) or of the wrong type.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key, double dflt) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* tensor(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, Value> kv_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace kvboost::gguf
