/* npu_qs8_qc4w_gemm__scalar and npu_qs8_qc4w_gemm_qs16__scalar: the plain-C reference of the
 * w4a8 GEMM (npu_qs8_gemm's math with int4 weights in the qc4w layout of npu_ukernels.h, block 0).
 */
#include <assert.h>
#include <string.h>

#include "kernels/npu/qs8_gemm_scalar.h"

/* Both output types; 'y16' non-NULL selects int16. Each 16-channel block is read nibble pair by
 * nibble pair (8 k values x 16 channels), the order of the packed layout. */
static void gemm_scalar(size_t m, size_t n_begin, size_t n_end, size_t k, const int8_t *restrict x,
                        size_t x_stride, const void *restrict w_packed, int8_t *restrict y8,
                        int16_t *restrict y16, size_t y_stride,
                        const struct npu_qs8_gemm_params *restrict p) {
  enum { NR = NPU_QS8_GEMM_NR };
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  const size_t pairs = npu_qc4w_gemm_kp(k, 0) / 8, block_size = npu_qc4w_gemm_block_size(k, 0);
  const int32_t zx = p->x_zero_point;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    int32_t bias[NR]; /* the block's wsum is not needed: x - zx is formed directly */
    memcpy(bias, block, sizeof(bias));
    const uint8_t *w = block + 2 * NR * sizeof(int32_t);
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i++) {
      const int8_t *xi = x + i * x_stride;
      int32_t acc[NR];
      memcpy(acc, bias, sizeof(acc));
      for (size_t pr = 0; pr < pairs; pr++) {
        int32_t xp[8] = {0}; /* x - zx for k = 8pr .. 8pr+7; 0 past k (zero weights there) */
        for (size_t t = 0; t < 8 && pr * 8 + t < k; t++) xp[t] = xi[pr * 8 + t] - zx;
        const uint8_t *wp = w + pr * 64;
        for (size_t j = 0; j < NR; j++)
          for (size_t t = 0; t < 4; t++) {
            const uint8_t b = wp[j * 4 + t];
            acc[j] += xp[t] * ((b & 0x0F) - 8) + xp[4 + t] * ((b >> 4) - 8);
          }
      }
      npu_qs8_gemm_store_scalar(acc, n0, nc, y16 != NULL ? NULL : y8 + i * y_stride,
                                y16 != NULL ? y16 + i * y_stride : NULL, p);
    }
  }
}

void npu_qs8_qc4w_gemm__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, int8_t *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict params) {
  gemm_scalar(m, n_begin, n_end, k, x, x_stride, w_packed, y, NULL, y_stride, params);
}

void npu_qs8_qc4w_gemm_qs16__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                                    const int8_t *restrict x, size_t x_stride,
                                    const void *restrict w_packed, int16_t *restrict y,
                                    size_t y_stride,
                                    const struct npu_qs8_gemm_params *restrict params) {
  gemm_scalar(m, n_begin, n_end, k, x, x_stride, w_packed, NULL, y, y_stride, params);
}
