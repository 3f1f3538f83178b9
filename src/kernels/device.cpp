// Compute devices (kvboost/kernels.h): parsing "cpu" / "cuda[:N]" and checking that the device
// exists. The only CUDA runtime call outside src/kernels/cuda and src/gpu; it is compiled in only
// with -DKVBOOST_CUDA=ON (KVBOOST_WITH_CUDA), so callers never need an #ifdef.
#include <charconv>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

#ifdef KVBOOST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kvboost::kernels {

std::string Device::name() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device parse_device(std::string_view s, std::string_view what) {
  Device d;
  if (s == "cpu") return d;
  if (s == "cuda") return Device{Device::Kind::Cuda, 0};
  if (s.starts_with("cuda:")) {
    const std::string_view n = s.substr(5);
    int idx = -1;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), idx);
    if (!n.empty() && ec == std::errc() && end == n.data() + n.size() && idx >= 0 && n[0] != '+')
      return Device{Device::Kind::Cuda, idx};
  }
  fail(what, ": \"", s, "\" is not a device (cpu, cuda, cuda:N with N >= 0)");
}

bool cuda_built() {
#ifdef KVBOOST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef KVBOOST_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the sticky error, report none
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void require_device(const Device& d, std::string_view what) {
  if (d.is_cpu()) return;
  if (!cuda_built()) fail(what, " ", d.name(), ": kvboost was built without CUDA (-DKVBOOST_CUDA=ON)");
  const int n = cuda_device_count();
  if (n == 0) fail(what, " ", d.name(), ": no CUDA device (CUDA sees 0 devices; check the driver and CUDA_VISIBLE_DEVICES)");
  if (d.index >= n)
    fail(what, " ", d.name(), ": CUDA sees ", n, " device", n == 1 ? "" : "s", " (cuda:0 .. cuda:", n - 1, ")");
}

}  // namespace kvboost::kernels
