/* npu_qs8_gemm__scalar and npu_qs8_gemm_qs16__scalar: the plain-C reference of the int8 GEMM with
 * fused per-channel requantization, reading the packed layout of npu_ukernels.h. */
#include <assert.h>
#include <string.h>

#include "kernels/npu/qs8_gemm_scalar.h"

/* Both output types; 'y16' non-NULL selects int16. Each 16-channel block is read group by group
 * (4 k values x 16 channels), the order of the packed layout. */
static inline void gemm_scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, int8_t *restrict y8,
                               int16_t *restrict y16, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p) {
  enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR };
  assert(k >= 1 && k <= 32768);
  assert(n_begin % NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  const size_t groups = (k + KR - 1) / KR;
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * KR * groups;
  const int32_t zx = p->x_zero_point;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    int32_t bias[NR]; /* the block's wsum is not needed: x - zx is formed directly */
    memcpy(bias, block, sizeof(bias));
    const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i++) {
      const int8_t *xi = x + i * x_stride;
      int32_t acc[NR];
      memcpy(acc, bias, sizeof(acc));
      for (size_t g = 0; g < groups; g++) {
        int32_t xg[KR] = {0}; /* x - zx for k = 4g .. 4g+3; 0 past k (zero weights there) */
        for (size_t t = 0; t < KR && g * KR + t < k; t++) xg[t] = xi[g * KR + t] - zx;
        const int8_t *wg = w + g * NR * KR;
        for (size_t j = 0; j < NR; j++)
          acc[j] += xg[0] * wg[j * KR] + xg[1] * wg[j * KR + 1] + xg[2] * wg[j * KR + 2] +
                    xg[3] * wg[j * KR + 3];
      }
      npu_qs8_gemm_store_scalar(acc, n0, nc, y16 != NULL ? NULL : y8 + i * y_stride,
                                y16 != NULL ? y16 + i * y_stride : NULL, p);
    }
  }
}

void npu_qs8_gemm__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                          const int8_t *restrict x, size_t x_stride, const void *restrict w_packed,
                          int8_t *restrict y, size_t y_stride,
                          const struct npu_qs8_gemm_params *restrict params) {
  gemm_scalar(m, n_begin, n_end, k, x, x_stride, w_packed, y, NULL, y_stride, params);
}

void npu_qs8_gemm_qs16__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, int16_t *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict params) {
  gemm_scalar(m, n_begin, n_end, k, x, x_stride, w_packed, NULL, y, y_stride, params);
}
