// Internal: the encoding of one chunk (the disk tier's file format, also the remote tier's
// payload) and the header of a chunk file read without its payload (ChunkStore's start-up scan).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "kvboost/kv.h"

namespace kvboost::kv {
struct ChunkFileInfo {
  ChunkKeys keys;
  int64_t n_tokens = 0;
  size_t file_bytes = 0;
};
// Throws Error naming the file and the problem when the header is unusable.
ChunkFileInfo peek_chunk_file(const std::string& path, const ChunkShape& s, uint64_t model_hash);

// The bytes of a chunk file: magic, header (shape, quantization, keys, model hash), tokens,
// payload, XXH3-64 checksum over all of it.
std::string encode_chunk(const Chunk& c, const ChunkShape& s, uint64_t model_hash);
size_t chunk_encoded_bytes(size_t n_tokens, size_t payload_bytes);
// The reverse, verified (magic, version, model, shape, sizes, checksum); throws Error naming
// `what` (a file path or a remote key) and the problem.
Chunk decode_chunk(std::string_view bytes, const ChunkShape& s, uint64_t model_hash, const std::string& what);
}  // namespace kvboost::kv
