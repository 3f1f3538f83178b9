// Shared by the engine-on-device tests (test_engine_device.cpp, test_engine_stream.cpp,
// test_engine_spill.cpp): the device they use and the skip without one.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kvboost/gpu.h"
#include "kvboost/kernels.h"

namespace kvboost::test {

inline const kernels::Device kCuda{kernels::Device::Kind::Cuda, 0};

// A reordered-RAG prompt: `prefix`, the documents docs[order[0]], docs[order[1]], ..., then
// `question`; *segs gets each document's start and the question's start (segment_starts).
inline std::vector<int32_t> rag_ids(const std::vector<std::vector<int32_t>>& docs, std::initializer_list<int> order,
                                    const std::vector<int32_t>& prefix, const std::vector<int32_t>& question,
                                    std::vector<int64_t>* segs) {
  std::vector<int32_t> ids = prefix;
  segs->clear();
  for (int d : order) {
    segs->push_back(int64_t(ids.size()));
    ids.insert(ids.end(), docs[size_t(d)].begin(), docs[size_t(d)].end());
  }
  segs->push_back(int64_t(ids.size()));
  ids.insert(ids.end(), question.begin(), question.end());
  return ids;
}

}  // namespace kvboost::test

#define REQUIRE_GPU()                                                                          \
  if (::kvboost::gpu::device_count() == 0)                                                     \
  GTEST_SKIP() << (::kvboost::gpu::built_with_cuda() ? "no CUDA device" : "built without CUDA") \
               << " (device tests run only where scripts/gpu_check.sh runs them)"
