/* npu_qs16_gemm_qs16__scalar: the plain-C reference of the w8a16 GEMM (int16 symmetric x, int8
 * weights in npu_qs8_gemm_pack's layout, int64 accumulation, npu_narrow, int16 output). */
#include <assert.h>
#include <string.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs16_gemm_qs16__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                                const int16_t *restrict x, size_t x_stride,
                                const void *restrict w_packed, int16_t *restrict y, size_t y_stride,
                                const struct npu_qs16_gemm_params *restrict p) {
  enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR };
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  const size_t groups = (k + KR - 1) / KR;
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * KR * groups;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    int32_t bias[NR]; /* the block's wsum is not needed: x is symmetric */
    memcpy(bias, block, sizeof(bias));
    const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i++) {
      const int16_t *xi = x + i * x_stride;
      int64_t acc[NR];
      for (size_t j = 0; j < NR; j++) acc[j] = bias[j];
      for (size_t kk = 0; kk < k; kk++) {
        const int8_t *wk = w + kk / KR * NR * KR + kk % KR;
        for (size_t j = 0; j < NR; j++) acc[j] += (int64_t)xi[kk] * wk[j * KR];
      }
      for (size_t j = 0; j < nc; j++) {
        const size_t n = n0 + j;
        y[i * y_stride + n] = npu_requantize_s16(npu_narrow(acc[j], p->acc_shift), p->mult[n],
                                                 p->shift[n], p->y_zero_point);
      }
    }
  }
}
