// The NCCL backend of kvboost/dist.h (CUDA builds only) on the devices of this machine: one rank
// per visible GPU (NCCL takes one rank per device), each in a thread of its own, all-reduce,
// all-gather and barrier on device buffers against the sums and concatenations computed on the
// host. With one GPU the group is world 1 (the init and the collectives still run through NCCL).
// Skips without a device, as every GPU test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/dist.h"

using namespace kvboost;

namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorString(e));
}

// Element i of rank r's contribution: exact in f32 for these sizes, so sums compare exactly.
float value(int r, int64_t i) { return float((i % 97) * (r + 1)) + 0.25f * float(r); }

TEST(Nccl, AllReduceAllGatherBarrierOverEveryDevice) {
  const int world = std::min(device_count(), 8);
  if (world == 0) GTEST_SKIP() << "no CUDA device (runs where scripts/gpu_check.sh runs the GPU tests)";
  if (!dist::nccl_built()) GTEST_SKIP() << "this CUDA build found no NCCL (src/dist/CMakeLists.txt)";
  const dist::NcclId id = dist::nccl_unique_id();
  const int64_t n = 100003;  // not a multiple of anything NCCL chunks by
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        dist::Comm c = dist::nccl_comm(id, r, world, r);
        if (c.rank() != r || c.world() != world || c.backend() != dist::Backend::Nccl) fail("comm fields");
        auto* s = static_cast<cudaStream_t>(dist::nccl_stream(c));
        std::vector<float> h(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) h[size_t(i)] = value(r, i);
        float *x = nullptr, *all = nullptr;
        ok(cudaMalloc(&x, size_t(n) * 4), "cudaMalloc");
        ok(cudaMalloc(&all, size_t(n) * world * 4), "cudaMalloc");
        ok(cudaMemcpy(x, h.data(), size_t(n) * 4, cudaMemcpyHostToDevice), "upload");
        c.all_gather(x, n, all);
        c.all_reduce_sum(x, n);
        ok(cudaStreamSynchronize(s), "collectives");
        std::vector<float> sum(static_cast<size_t>(n)), gathered(size_t(n) * world);
        ok(cudaMemcpy(sum.data(), x, size_t(n) * 4, cudaMemcpyDeviceToHost), "download");
        ok(cudaMemcpy(gathered.data(), all, gathered.size() * 4, cudaMemcpyDeviceToHost), "download");
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int q = 0; q < world; ++q) want += value(q, i);
          if (sum[size_t(i)] != want) fail("rank ", r, ": sum[", i, "] = ", sum[size_t(i)], ", want ", want);
          for (int q = 0; q < world; ++q)
            if (gathered[size_t(q * n + i)] != value(q, i))
              fail("rank ", r, ": gathered[", q, "][", i, "] = ", gathered[size_t(q * n + i)]);
        }
        c.barrier();
        cudaFree(x), cudaFree(all);
        dist::nccl_destroy(c);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(std::string("rank ") + std::to_string(r) + ": " + e.what());
      }
    });
  for (std::thread& t : ranks) t.join();
  for (const std::string& e : errors) ADD_FAILURE() << e;
}

TEST(Nccl, BadArgumentsNameThemselves) {
  if (!dist::nccl_built()) GTEST_SKIP() << "this CUDA build found no NCCL (src/dist/CMakeLists.txt)";
  dist::NcclId bad;
  bad.bytes.assign(5, 0);
  try {
    dist::nccl_comm(bad, 0, 1, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unique id has 5 bytes"), std::string::npos) << e.what();
  }
  if (device_count() == 0) return;
  const dist::NcclId id = dist::nccl_unique_id();
  try {
    dist::nccl_comm(id, 0, 1, device_count());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA sees"), std::string::npos) << e.what();
  }
}

}  // namespace
