// kvboost/dist.h's NCCL backend in a build without -DKVBOOST_CUDA=ON: one clear Error.
#include "kvboost/common.h"
#include "kvboost/dist.h"

namespace kvboost::dist {

namespace {
[[noreturn]] void no_nccl(const char* what) {
  fail("dist ", what, ": kvboost was built without CUDA (-DKVBOOST_CUDA=ON), so without NCCL");
}
}  // namespace

struct NcclState {};
bool nccl_built() { return false; }
NcclId nccl_unique_id() { no_nccl("nccl_unique_id"); }
Comm nccl_comm(const NcclId&, int, int, int) { no_nccl("nccl_comm"); }
void nccl_destroy(Comm&) { no_nccl("nccl_destroy"); }
void* nccl_stream(const Comm&) { return nullptr; }
int nccl_device(const Comm&) { return -1; }
void nccl_all_reduce_sum(NcclState*, float*, int64_t) { no_nccl("all_reduce_sum"); }
void nccl_all_gather(NcclState*, const float*, int64_t, float*) { no_nccl("all_gather"); }
void nccl_barrier(NcclState*) { no_nccl("barrier"); }

}  // namespace kvboost::dist
