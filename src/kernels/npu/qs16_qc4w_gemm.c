/* npu_qs16_qc4w_gemm_qs16__scalar: the plain-C reference of the w4a16 GEMM (int16 symmetric x,
 * int4 weights in the qc4w layout, per channel or with 32-k block scales; int64 accumulation,
 * npu_narrow, int16 output). */
#include <assert.h>
#include <string.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs16_qc4w_gemm_qs16__scalar(size_t m, size_t n_begin, size_t n_end, size_t k,
                                     const int16_t *restrict x, size_t x_stride,
                                     const void *restrict w_packed, int16_t *restrict y,
                                     size_t y_stride,
                                     const struct npu_qs16_gemm_params *restrict p) {
  enum { NR = NPU_QS8_GEMM_NR, CH = NPU_QC4W_BLOCK };
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  assert(p->block == 0 || p->block == NPU_QC4W_BLOCK);
  const size_t block = (size_t)p->block, block_size = npu_qc4w_gemm_block_size(k, block);
  const size_t pairs = npu_qc4w_gemm_kp(k, block) / 8;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *blk = (const uint8_t *)w_packed + n0 / NR * block_size;
    int32_t bias[NR]; /* the block's wsum is not needed: x is symmetric */
    memcpy(bias, blk, sizeof(bias));
    const uint8_t *w = blk + 2 * NR * sizeof(int32_t);
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i++) {
      const int16_t *xi = x + i * x_stride;
      int64_t acc[NR];
      for (size_t j = 0; j < NR; j++) acc[j] = bias[j];
      const uint8_t *q = NULL; /* the current chunk's scales (block 32) */
      const uint8_t *wp = w;
      for (size_t pr = 0; pr < pairs; pr++, wp += 64) {
        if (block != 0 && pr % (CH / 8) == 0) { /* a chunk starts with its 16 scales */
          q = wp;
          wp += NR;
        }
        for (size_t j = 0; j < NR; j++) {
          int64_t dot = 0; /* 8 k of channel j */
          for (size_t t = 0; t < 8 && pr * 8 + t < k; t++) {
            const uint8_t b = wp[j * 4 + t % 4];
            dot += (int64_t)xi[pr * 8 + t] * ((t < 4 ? b & 0x0F : b >> 4) - 8);
          }
          acc[j] += (q != NULL ? q[j] : 1) * dot;
        }
      }
      for (size_t j = 0; j < nc; j++) {
        const size_t n = n0 + j;
        y[i * y_stride + n] = npu_requantize_s16(npu_narrow(acc[j], p->acc_shift), p->mult[n],
                                                 p->shift[n], p->y_zero_point);
      }
    }
  }
}
