/* npu_qs16_qc4w_gemm_qs16__neon: the w4a16 GEMM (int16 x, qc4w int4 weights per channel or with
 * 32-k block scales) on NEON, npu_neon_qs16_gemm of qs16_gemm_neon.h: nibble pairs decoded into
 * int8 groups, int16 multiply-accumulates, each 32-k chunk's sums times its block scales;
 * bit-exact with npu_qs16_qc4w_gemm_qs16__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/qs16_gemm_neon.h"

void npu_qs16_qc4w_gemm_qs16__neon(size_t m, size_t n_begin, size_t n_end, size_t k,
                                   const int16_t *restrict x, size_t x_stride,
                                   const void *restrict w_packed, int16_t *restrict y,
                                   size_t y_stride,
                                   const struct npu_qs16_gemm_params *restrict params) {
  npu_neon_qs16_gemm(m, n_begin, n_end, k, x, x_stride, w_packed, y, y_stride, params, 1);
}

#endif /* __aarch64__ */
