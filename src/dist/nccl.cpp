// kvboost/dist.h's NCCL backend (built only with -DKVBOOST_CUDA=ON): one NCCL communicator per
// rank on its CUDA device, with a stream of its own. The collectives take device pointers and
// are enqueued on that stream (callers order their kernels against it); barrier is an
// all-reduce of one float followed by a stream sync, so it orders host code too.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "kvboost/common.h"
#include "kvboost/dist.h"

namespace kvboost::dist {

struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  float* scratch = nullptr;  // one float on the device (barrier)
};

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("dist (nccl): ", what, ": ", cudaGetErrorString(e));
}
void check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) fail("dist (nccl): ", what, ": ", ncclGetErrorString(e));
}
}  // namespace

bool nccl_built() { return true; }

NcclId nccl_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  out.bytes.assign(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof id);
  return out;
}

Comm nccl_comm(const NcclId& id, int rank, int world, int device) {
  if (id.bytes.size() != sizeof(ncclUniqueId))
    fail("dist (nccl): the unique id has ", id.bytes.size(), " bytes, not ", sizeof(ncclUniqueId));
  if (world < 1 || rank < 0 || rank >= world) fail("dist (nccl): rank ", rank, " of world ", world);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    fail("dist (nccl): no CUDA device (CUDA sees 0 devices)");
  }
  if (device < 0 || device >= n) fail("dist (nccl): device ", device, ": CUDA sees ", n, " devices");
  auto* s = new NcclState();
  s->device = device;
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(reinterpret_cast<void**>(&s->scratch), sizeof(float)), "cudaMalloc");
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    check(ncclCommInitRank(&s->comm, world, uid, rank), "ncclCommInitRank");
  } catch (...) {
    if (s->scratch) cudaFree(s->scratch);
    if (s->stream) cudaStreamDestroy(s->stream);
    delete s;
    throw;
  }
  return Comm(Backend::Nccl, rank, world, nullptr, s);
}

void nccl_destroy(Comm& c) {
  NcclState* s = c.nccl_;
  if (!s) return;
  cudaSetDevice(s->device);
  if (s->comm) ncclCommDestroy(s->comm);
  if (s->scratch) cudaFree(s->scratch);
  if (s->stream) cudaStreamDestroy(s->stream);
  delete s;
  c.nccl_ = nullptr;
}

void* nccl_stream(const Comm& c) { return c.nccl_ ? static_cast<void*>(c.nccl_->stream) : nullptr; }
int nccl_device(const Comm& c) { return c.nccl_ ? c.nccl_->device : -1; }

void nccl_all_reduce_sum(NcclState* s, float* x, int64_t n) {
  if (n == 0) return;
  check(ncclAllReduce(x, x, size_t(n), ncclFloat32, ncclSum, s->comm, s->stream), "ncclAllReduce");
}

void nccl_all_gather(NcclState* s, const float* x, int64_t n, float* out) {
  if (n == 0) return;
  check(ncclAllGather(x, out, size_t(n), ncclFloat32, s->comm, s->stream), "ncclAllGather");
}

void nccl_barrier(NcclState* s) {
  check(ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->comm, s->stream), "ncclAllReduce (barrier)");
  check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize (barrier)");
}

}  // namespace kvboost::dist
