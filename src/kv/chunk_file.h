// Internal: the header of a chunk file, read without its payload (ChunkStore's start-up scan).
#pragma once
#include <cstdint>
#include <string>

#include "kvboost/kv.h"

namespace kvboost::kv {
struct ChunkFileInfo {
  ChunkKeys keys;
  int64_t n_tokens = 0;
  size_t file_bytes = 0;
};
// Throws Error naming the file and the problem when the header is unusable.
ChunkFileInfo peek_chunk_file(const std::string& path, const ChunkShape& s, uint64_t model_hash);
}  // namespace kvboost::kv
