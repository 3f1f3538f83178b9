// Shared by the engine-on-device tests (test_engine_device.cpp, test_engine_stream.cpp,
// test_engine_spill.cpp, test_tp_device.cpp): the device they use and the skip without one.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kvboost/dist.h"
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

// gpu::device_count() counted in a forked child (dist::run_ranks), once per process: tests whose
// ranks are forked processes (test_tp_device.cpp) must not initialize CUDA in the parent, since
// a child forked after that cannot use CUDA.
inline int device_count_forked() {
  static const int n = [] {
    auto* p = static_cast<int*>(mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) return 0;
    *p = 0;
    try {
      dist::run_ranks(1, [p](dist::Comm&) { *p = gpu::device_count(); });
    } catch (const std::exception&) {
      *p = 0;
    }
    const int v = *p;
    munmap(p, sizeof(int));
    return v;
  }();
  return n;
}

}  // namespace kvboost::test

// REQUIRE_GPU's skip without initializing CUDA in this process (device_count_forked).
#define REQUIRE_GPU_FORKED()                                                                   \
  if (::kvboost::test::device_count_forked() == 0)                                             \
  GTEST_SKIP() << (::kvboost::gpu::built_with_cuda() ? "no CUDA device" : "built without CUDA") \
               << " (device tests run only where scripts/gpu_check.sh runs them)"

#define REQUIRE_GPU()                                                                          \
  if (::kvboost::gpu::device_count() == 0)                                                     \
  GTEST_SKIP() << (::kvboost::gpu::built_with_cuda() ? "no CUDA device" : "built without CUDA") \
               << " (device tests run only where scripts/gpu_check.sh runs them)"
