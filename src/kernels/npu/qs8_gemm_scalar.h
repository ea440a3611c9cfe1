/* What the scalar references of the int8-activation GEMMs (qs8_gemm.c, qs8_qc4w_gemm.c) share:
 * the requantized store of one row's accumulators. */
#ifndef NPU_KERNELS_NPU_QS8_GEMM_SCALAR_H
#define NPU_KERNELS_NPU_QS8_GEMM_SCALAR_H

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

/* Channels n0 .. n0 + nc - 1 of output row 'y_row' (int8 at y8, or int16 at y16 when it is not
 * NULL; element n of the row) from their accumulators acc[0 .. nc - 1]. */
static inline void npu_qs8_gemm_store_scalar(const int32_t *acc, size_t n0, size_t nc, int8_t *y8,
                                             int16_t *y16, const struct npu_qs8_gemm_params *p) {
  for (size_t j = 0; j < nc; j++) {
    const size_t n = n0 + j;
    if (y16 != NULL) y16[n] = npu_requantize_s16(acc[j], p->mult[n], p->shift[n], p->y_zero_point);
    else y8[n] = npu_requantize_s8(acc[j], p->mult[n], p->shift[n], p->y_zero_point);
  }
}

#endif /* NPU_KERNELS_NPU_QS8_GEMM_SCALAR_H */
