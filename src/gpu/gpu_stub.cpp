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

}  // namespace kvboost::gpu
