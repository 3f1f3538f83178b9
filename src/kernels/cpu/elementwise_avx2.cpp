#include "cpu/cpu_kernels.h"
#define KVBOOST_ISA_NS avx2_impl
#include "cpu/elementwise_impl.h"

namespace kvboost::kernels::cpu {

void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim,
                   float eps) {
  avx2_impl::rms_norm(x, w, y, n_rows, dim, eps);
}

void silu_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  avx2_impl::silu_mul(gate, up, y, n);
}

void gelu_tanh_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  avx2_impl::gelu_tanh_mul(gate, up, y, n);
}

}  // namespace kvboost::kernels::cpu
