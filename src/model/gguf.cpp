// GGUF reader (format: github.com/ggml-org/ggml/blob/master/docs/gguf.md). Parses the header,
// metadata and tensor infos of a memory-mapped file; nothing is trusted: every count, length
// and offset is bounded by the bytes actually left in the file, so a truncated or corrupt file
// is an Error naming the file and the key or tensor at fault, never a crash or a huge allocation.
#include "gguf.h"

#include <cmath>
#include <limits>

namespace kvboost::gguf {

using kernels::GgmlType;

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

bool Value::is_int() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}

int64_t Tensor::n_elems() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

namespace {

// Size on disk of one scalar of type t; 0 for string/array (variable) and unknown types.
int scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// (elements, bytes) per block of every ggml type a file may name, so that files holding
// types we cannot compute with still parse; using such a tensor is an error later.
bool ggml_block(uint32_t id, int64_t& elems, int64_t& bytes) {
  if (kernels::ggml_type_supported(id)) {
    elems = kernels::ggml_block_elems(GgmlType(id));
    bytes = kernels::ggml_block_bytes(GgmlType(id));
    return true;
  }
  struct B { uint32_t id; int64_t e, b; };
  static const B table[] = {{3, 32, 20},   {6, 32, 22},  {7, 32, 24},  {9, 32, 36},  {10, 256, 84},
                            {11, 256, 110}, {15, 256, 292}, {24, 1, 1}, {25, 1, 2}, {26, 1, 4},
                            {27, 1, 8},   {28, 1, 8}};
  for (const B& b : table)
    if (b.id == id) {
      elems = b.e;
      bytes = b.b;
      return true;
    }
  return false;
}

class Reader {
 public:
  Reader(const MappedFile& f) : p_(f.data()), size_(f.size()), path_(f.path()) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  void need(size_t n, const std::string& what) const {
    if (n > left())
      fail(path_, ": truncated or corrupt GGUF file: ", what, " needs ", n, " bytes at offset ", pos_,
           " but only ", left(), " remain");
  }
  template <typename T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t n = get<uint64_t>(what + " (string length)");
    need(n, what + " (string of " + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  void skip(size_t n, const std::string& what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* p_;
  size_t size_, pos_ = 0;
  const std::string& path_;
};

int64_t read_int(Reader& r, ValueType t, const std::string& what, const std::string& path) {
  switch (t) {
    case ValueType::U8: return r.get<uint8_t>(what);
    case ValueType::I8: return r.get<int8_t>(what);
    case ValueType::U16: return r.get<uint16_t>(what);
    case ValueType::I16: return r.get<int16_t>(what);
    case ValueType::U32: return r.get<uint32_t>(what);
    case ValueType::I32: return r.get<int32_t>(what);
    case ValueType::I64: return r.get<int64_t>(what);
    case ValueType::BOOL: {
      const uint8_t b = r.get<uint8_t>(what);
      if (b > 1) fail(path, ": ", what, ": bool value ", int(b), " is neither 0 nor 1");
      return b;
    }
    case ValueType::U64: {
      const uint64_t u = r.get<uint64_t>(what);
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(path, ": ", what, ": u64 value ", u, " is too large");
      return int64_t(u);
    }
    default: break;
  }
  fail(path, ": ", what, ": not an integer type");
}

double read_float(Reader& r, ValueType t, const std::string& what) {
  if (t == ValueType::F32) return r.get<float>(what);
  return r.get<double>(what);
}

Value read_value(Reader& r, ValueType t, const std::string& what, const std::string& path) {
  Value v;
  v.type = t;
  if (t == ValueType::STRING) {
    v.s = r.str(what);
  } else if (t == ValueType::F32 || t == ValueType::F64) {
    v.f = read_float(r, t, what);
  } else if (t == ValueType::ARRAY) {
    const uint32_t et = r.get<uint32_t>(what + " (array element type)");
    if (!known_value_type(et)) fail(path, ": ", what, ": unknown array element type ", et);
    v.elem_type = ValueType(et);
    if (v.elem_type == ValueType::ARRAY) fail(path, ": ", what, ": nested arrays are not supported");
    const uint64_t n = r.get<uint64_t>(what + " (array length)");
    // Each element takes at least its scalar size (8 bytes for a string's length): bound the
    // count by the bytes left before reserving anything.
    const size_t min_elem = v.elem_type == ValueType::STRING ? 8 : size_t(scalar_size(v.elem_type));
    if (n > r.left() / min_elem)
      fail(path, ": truncated or corrupt GGUF file: ", what, ": array of ", n, " ", value_type_name(v.elem_type),
           " does not fit in the ", r.left(), " bytes left");
    if (v.elem_type == ValueType::STRING) {
      v.strings.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(r.str(what + "[" + std::to_string(i) + "]"));
    } else if (v.elem_type == ValueType::F32 || v.elem_type == ValueType::F64) {
      v.floats.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.floats.push_back(read_float(r, v.elem_type, what));
    } else {
      v.ints.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.ints.push_back(read_int(r, v.elem_type, what, path));
    }
  } else {
    v.i = read_int(r, t, what, path);
  }
  return v;
}

}  // namespace

File::File(const std::string& path) : map_(std::make_shared<MappedFile>(path)) {
  Reader r(*map_);
  const uint32_t magic = r.get<uint32_t>("magic");
  if (magic != 0x46554747u)  // "GGUF" little-endian
    fail(path, ": not a GGUF file (bad magic)");
  version_ = r.get<uint32_t>("version");
  if (version_ == 1) fail(path, ": GGUF version 1 is not supported (only 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xFFFF) == 0) fail(path, ": big-endian GGUF files are not supported");
    fail(path, ": unsupported GGUF version ", version_, " (supported: 2, 3)");
  }
  const uint64_t n_tensors = r.get<uint64_t>("tensor count");
  const uint64_t n_kv = r.get<uint64_t>("metadata count");
  // A key/value takes at least 8 + 4 + 1 bytes, a tensor info at least 8 + 4 + 4 + 8.
  if (n_kv > r.left() / 13) fail(path, ": corrupt GGUF header: ", n_kv, " metadata entries cannot fit in the file");
  if (n_tensors > r.left() / 24) fail(path, ": corrupt GGUF header: ", n_tensors, " tensors cannot fit in the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = r.str("metadata key #" + std::to_string(i));
    const std::string what = "metadata \"" + key + "\"";
    const uint32_t t = r.get<uint32_t>(what + " (type)");
    if (!known_value_type(t)) fail(path, ": ", what, ": unknown value type ", t);
    Value v = read_value(r, ValueType(t), what, path);
    if (kv_.count(key)) fail(path, ": ", what, " appears twice");
    kv_.emplace(key, std::move(v));
  }
  if (const Value* a = find("general.alignment")) {
    if (!a->is_int() || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > (1 << 20))
      fail(path, ": metadata \"general.alignment\" must be a power of two up to 1 MiB");
    alignment_ = uint64_t(a->i);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Tensor t;
    t.name = r.str("tensor name #" + std::to_string(i));
    const std::string what = "tensor \"" + t.name + "\"";
    const uint32_t n_dims = r.get<uint32_t>(what + " (n_dims)");
    if (n_dims == 0 || n_dims > 4) fail(path, ": ", what, ": n_dims = ", n_dims, " (must be 1..4)");
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t e = r.get<uint64_t>(what + " (dims)");
      if (e == 0 || e > (uint64_t(1) << 40)) fail(path, ": ", what, ": dimension ", d, " = ", e, " is out of range");
      n *= e;
      if (n > (uint64_t(1) << 40)) fail(path, ": ", what, ": too many elements");
      t.ne.push_back(int64_t(e));
    }
    const uint32_t type = r.get<uint32_t>(what + " (type)");
    int64_t be = 0, bb = 0;
    if (!ggml_block(type, be, bb)) fail(path, ": ", what, ": unknown ggml type ", type);
    t.type = GgmlType(type);
    if (t.ne[0] % be != 0)
      fail(path, ": ", what, ": row length ", t.ne[0], " is not a multiple of the type's block size ", be);
    t.nbytes = size_t(n / uint64_t(be) * uint64_t(bb));
    t.offset = r.get<uint64_t>(what + " (offset)");
    if (t.offset % alignment_ != 0)
      fail(path, ": ", what, ": data offset ", t.offset, " is not a multiple of the alignment ", alignment_);
    if (by_name_.count(t.name)) fail(path, ": ", what, " appears twice");
    by_name_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment (it may be empty).
  const size_t pad = size_t((alignment_ - r.pos() % alignment_) % alignment_);
  const size_t data_start = r.pos() + std::min(pad, r.left());
  if (n_tensors > 0 && pad > r.left()) fail(path, ": truncated GGUF file: no tensor data after the header");
  const uint64_t data_size = map_->size() - data_start;
  for (Tensor& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(path, ": tensor \"", t.name, "\": data [", t.offset, ", ", t.offset + t.nbytes, ") lies outside the ",
           data_size, " bytes of tensor data (truncated file?)");
    t.data = map_->data() + data_start + t.offset;
  }
}

const Value* File::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const Tensor* File::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

int64_t File::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) fail(path(), ": metadata \"", key, "\" is missing");
  if (!v->is_int()) fail(path(), ": metadata \"", key, "\" must be an integer, not ", value_type_name(v->type));
  return v->i;
}

int64_t File::get_int(const std::string& key, int64_t dflt) const { return find(key) ? get_int(key) : dflt; }

double File::get_float(const std::string& key, double dflt) const {
  const Value* v = find(key);
  if (!v) return dflt;
  if (v->is_float()) return v->f;
  if (v->is_int()) return double(v->i);
  fail(path(), ": metadata \"", key, "\" must be a number, not ", value_type_name(v->type));
}

std::string File::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) fail(path(), ": metadata \"", key, "\" is missing");
  if (v->type != ValueType::STRING) fail(path(), ": metadata \"", key, "\" must be a string, not ", value_type_name(v->type));
  return v->s;
}

std::string File::get_string(const std::string& key, const std::string& dflt) const {
  return find(key) ? get_string(key) : dflt;
}

}  // namespace kvboost::gguf
