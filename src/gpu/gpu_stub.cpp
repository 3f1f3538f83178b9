// kvboost/gpu.h in a build without -DKVBOOST_CUDA=ON: the same API, every call that needs the
// device answering one clear Error (GUIDE.md: no #ifdef at call sites).
#include "kvboost/gpu.h"

namespace kvboost::gpu {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail("GPU ", what, ": kvboost was built without CUDA (-DKVBOOST_CUDA=ON)");
}
}  // namespace

struct Decoder::Impl {};

bool built_with_cuda() { return false; }
int device_count() { return 0; }
DeviceInfo device_info(int) { no_cuda("device_info"); }
double pinned_h2d_gbps(size_t, int, int) { no_cuda("pinned_h2d_gbps"); }

Decoder::Decoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Decoder::~Decoder() = default;
std::unique_ptr<Decoder> Decoder::create(const Model&, const DecoderOptions&) { no_cuda("Decoder::create"); }
void Decoder::forward(const int32_t*, int64_t, float*, bool) { no_cuda("Decoder::forward"); }
int64_t Decoder::size() const { no_cuda("Decoder::size"); }
void Decoder::reset() { no_cuda("Decoder::reset"); }
const DecoderOptions& Decoder::options() const { no_cuda("Decoder::options"); }
bool Decoder::streamed() const { no_cuda("Decoder::streamed"); }
int64_t Decoder::n_layers() const { no_cuda("Decoder::n_layers"); }
size_t Decoder::layer_bytes() const { no_cuda("Decoder::layer_bytes"); }
size_t Decoder::device_weight_bytes() const { no_cuda("Decoder::device_weight_bytes"); }
const DecoderStats& Decoder::stats() const { no_cuda("Decoder::stats"); }
void Decoder::reset_stats() { no_cuda("Decoder::reset_stats"); }
double Decoder::time_layer_copies(int) { no_cuda("Decoder::time_layer_copies"); }

// The engine's device runner: create is the one entry point (the others are unreachable
// without an instance, but answer the same).
struct PagedRunner::Impl {};
PagedRunner::PagedRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PagedRunner::~PagedRunner() = default;
std::unique_ptr<PagedRunner> PagedRunner::create(const Model& model, const PagedRunnerOptions& o) {
  // A tensor-parallel group the model does not split over is the same Error in every build.
  if (o.comm.world() > 1) tp_plan(model.config(), o.comm.rank(), o.comm.world());
  fail("device cuda:", o.device, ": kvboost was built without CUDA (-DKVBOOST_CUDA=ON)");
}
void PagedRunner::forward_batch(const PagedSeq*, int64_t) { no_cuda("PagedRunner::forward_batch"); }
void PagedRunner::copy_block(kv::BlockId, kv::BlockId) { no_cuda("PagedRunner::copy_block"); }
void PagedRunner::write_rows(int64_t, std::span<const kv::BlockId>, int64_t, int64_t, const float*, const float*) {
  no_cuda("PagedRunner::write_rows");
}
void PagedRunner::read_rows(int64_t, std::span<const kv::BlockId>, int64_t, int64_t, float*, float*) {
  no_cuda("PagedRunner::read_rows");
}
void PagedRunner::rotate_keys(int64_t, std::span<const kv::BlockId>, int64_t, int64_t, int64_t) {
  no_cuda("PagedRunner::rotate_keys");
}
BlendStats PagedRunner::forward_blend(const int32_t*, int64_t, int64_t, std::span<const kv::BlockId>,
                                      const BlendOptions&, float*) {
  no_cuda("PagedRunner::forward_blend");
}
std::vector<float> PagedRunner::snapshot_rows(std::span<const kv::BlockId>, std::span<const int64_t>) {
  no_cuda("PagedRunner::snapshot_rows");
}
std::vector<kv::IoPiece> PagedRunner::block_pieces(kv::BlockId) { no_cuda("PagedRunner::block_pieces"); }
kv::SlotCopy PagedRunner::spill_copy() { no_cuda("PagedRunner::spill_copy"); }
const PoolLayout& PagedRunner::pool() const { no_cuda("PagedRunner::pool"); }
size_t PagedRunner::device_weight_bytes() const { no_cuda("PagedRunner::device_weight_bytes"); }
int64_t PagedRunner::passes() const { no_cuda("PagedRunner::passes"); }
int64_t PagedRunner::streamed_layers() const { no_cuda("PagedRunner::streamed_layers"); }
uint64_t PagedRunner::bytes_h2d() const { no_cuda("PagedRunner::bytes_h2d"); }

}  // namespace kvboost::gpu
