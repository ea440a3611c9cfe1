/* The AArch64 GEMMs of int16 activations, qs16_gemm_qs16 (w8a16, the int8 layout) and
 * qs16_qc4w_gemm_qs16 (w4a16, the qc4w layout per channel or with 32-k block scales), on baseline
 * NEON: one row x 16 channels at a time. The weights of each 4-k group (int8 as packed, or decoded
 * from a nibble pair by npu_neon_gemm_load_pair) are widened to int16 and vmlal_s16 multiplies
 * each channel's 4 weights by the row's 4 x values (broadcast twice over 8 lanes), one int32
 * accumulator of 4 lanes per channel, each lane adding one product (< 2^22 in size) per group.
 * Every 32 k (a chunk: 8 groups, 8 products a lane, < 2^25) vpaddq_s32 folds the lanes into the
 * chunk's 16 channel sums (< 2^27), multiplied by the chunk's block scales (< 2^27 * 15, not past
 * 2^31 for the 16 chunks of 512 k) where there are some, added into int32 span sums, which widen
 * into int64 every NPU_QS16_GEMM_KC = 512 k (< 2^31, the bound npu_ukernels.h writes down). The
 * sums are exact, so npu_narrow (vrshlq_s64 by -acc_shift, vqmovn_s64) and the requantization give
 * the bits of the scalar variants. */
#ifndef NPU_KERNELS_NPU_QS16_GEMM_NEON_H
#define NPU_KERNELS_NPU_QS16_GEMM_NEON_H

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"
#include "kernels/npu/npu_ukernels.h"
#include "kernels/npu/qs8_gemm_neon.h" /* npu_neon_gemm_load_pair */

/* x[kk .. kk+3] of a row of k values, each twice (lanes 0..3 and 4..7), zero past k (where the
 * packed weights are 0), never reading past the row. */
NPU_INLINE_NEON int16x8_t npu_neon_qs16_x4(const int16_t *row, size_t kk, size_t k) {
  int16x4_t v;
  if (kk + 4 <= k) {
    v = vld1_s16(row + kk);
  } else {
    int16_t buf[4] = {0};
    if (kk < k) memcpy(buf, row + kk, (k - kk) * sizeof(int16_t));
    v = vld1_s16(buf);
  }
  return vcombine_s16(v, v);
}

/* acc[c] (channel c of 16, 4 lanes for the 4 k of a group) += the group's weights w (w[q]:
 * channels 4q .. 4q+3 x 4 k, int8) times xb. */
NPU_INLINE_NEON void npu_neon_qs16_group(int32x4_t acc[16], const int8x16_t w[4], int16x8_t xb) {
  for (int q = 0; q < 4; q++) {
    const int16x8_t w01 = vmovl_s8(vget_low_s8(w[q])), w23 = vmovl_high_s8(w[q]);
    acc[4 * q] = vmlal_s16(acc[4 * q], vget_low_s16(w01), vget_low_s16(xb));
    acc[4 * q + 1] = vmlal_high_s16(acc[4 * q + 1], w01, xb);
    acc[4 * q + 2] = vmlal_s16(acc[4 * q + 2], vget_low_s16(w23), vget_low_s16(xb));
    acc[4 * q + 3] = vmlal_high_s16(acc[4 * q + 3], w23, xb);
  }
}

/* One row of x times one 16-channel block at blk (w4: the qc4w layout with 'block' 0 or 32; else
 * the int8 layout), requantized into the first nc (1..16) int16 of y. */
NPU_INLINE_NEON void npu_neon_qs16_row(size_t k, const int16_t *restrict x, const uint8_t *blk,
                                       int w4, size_t block, const struct npu_neon_rq rq[4],
                                       int32x4_t yzp, int64x2_t neg_acc_shift, int16_t *y,
                                       size_t nc) {
  enum { NR = NPU_QS8_GEMM_NR, CH = NPU_QC4W_BLOCK, KC = NPU_QS16_GEMM_KC };
  const int8_t *w = (const int8_t *)(blk + 2 * NR * sizeof(int32_t));
  int64x2_t wide[8]; /* channels 2l, 2l+1 */
  for (int q = 0; q < 4; q++) {
    const int32x4_t b = vld1q_s32((const int32_t *)(const void *)blk + 4 * q);
    wide[2 * q] = vmovl_s32(vget_low_s32(b));
    wide[2 * q + 1] = vmovl_high_s32(b);
  }
  for (size_t k0 = 0; k0 < k; k0 += KC) {
    int32x4_t span[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    const size_t k1 = k - k0 < KC ? k : k0 + KC;
    for (size_t c0 = k0; c0 < k1; c0 += CH) {
      const uint8_t *scales = NULL;
      if (w4 && block != 0) { /* a chunk starts with its 16 scales */
        scales = (const uint8_t *)w;
        w += NR;
      }
      int32x4_t acc[16];
      for (int c = 0; c < 16; c++) acc[c] = vdupq_n_s32(0);
      const size_t c1 = k1 - c0 < CH ? k1 : c0 + CH;
      for (size_t kk = c0; kk < c1; kk += 8) {
        int8x16_t lo[4], hi[4];
        w += npu_neon_gemm_load_pair(w, w4, !w4 && k - kk <= 4, lo, hi);
        npu_neon_qs16_group(acc, lo, npu_neon_qs16_x4(x, kk, k));
        npu_neon_qs16_group(acc, hi, npu_neon_qs16_x4(x, kk + 4, k));
      }
      uint8x16_t qv = vdupq_n_u8(1);
      if (scales != NULL) qv = vld1q_u8(scales);
      const uint16x8_t q01 = vmovl_u8(vget_low_u8(qv)), q23 = vmovl_high_u8(qv);
      int32x4_t qs[4] = {
          vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(q01))),
          vreinterpretq_s32_u32(vmovl_high_u16(q01)),
          vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(q23))),
          vreinterpretq_s32_u32(vmovl_high_u16(q23)),
      };
      for (int q = 0; q < 4; q++) {
        const int32x4_t sums = vpaddq_s32(vpaddq_s32(acc[4 * q], acc[4 * q + 1]),
                                          vpaddq_s32(acc[4 * q + 2], acc[4 * q + 3]));
        span[q] = vmlaq_s32(span[q], sums, qs[q]);
      }
    }
    for (int q = 0; q < 4; q++) {
      wide[2 * q] = vaddw_s32(wide[2 * q], vget_low_s32(span[q]));
      wide[2 * q + 1] = vaddw_high_s32(wide[2 * q + 1], span[q]);
    }
  }
  int32x4_t out[4];
  for (int q = 0; q < 4; q++) {
    const int32x4_t narrowed = vcombine_s32(vqmovn_s64(vrshlq_s64(wide[2 * q], neg_acc_shift)),
                                            vqmovn_s64(vrshlq_s64(wide[2 * q + 1], neg_acc_shift)));
    out[q] = npu_neon_add_zp(npu_neon_requantize(narrowed, &rq[q]), yzp);
  }
  const int16x8_t lo = npu_neon_narrow_s16(out[0], out[1]),
                  hi = npu_neon_narrow_s16(out[2], out[3]);
  if (nc == NR) {
    vst1q_s16(y, lo);
    vst1q_s16(y + 8, hi);
  } else { /* a partial block: only nc elements reach y */
    int16_t tmp[NR];
    vst1q_s16(tmp, lo);
    vst1q_s16(tmp + 8, hi);
    memcpy(y, tmp, nc * sizeof(int16_t));
  }
}

/* The whole GEMM over either layout (npu_ukernels.h): blocks of 16 channels, each across all rows.
 */
NPU_INLINE_NEON void npu_neon_qs16_gemm(size_t m, size_t n_begin, size_t n_end, size_t k,
                                        const int16_t *restrict x, size_t x_stride,
                                        const void *restrict w_packed, int16_t *restrict y,
                                        size_t y_stride,
                                        const struct npu_qs16_gemm_params *restrict p, int w4) {
  enum { NR = NPU_QS8_GEMM_NR };
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  assert(w4 ? p->block == 0 || p->block == NPU_QC4W_BLOCK : p->block == 0);
  const size_t block = w4 ? (size_t)p->block : 0;
  const size_t block_size =
      w4 ? npu_qc4w_gemm_block_size(k, block) : 2 * NR * sizeof(int32_t) + NR * ((k + 3) / 4 * 4);
  const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);
  const int64x2_t neg_acc_shift = vdupq_n_s64(-p->acc_shift);
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    const int32_t *mult = p->mult + n0, *shift = p->shift + n0;
    int32_t mult_pad[NR] = {0}, shift_pad[NR] = {0}; /* a partial block pads with 0, 0 */
    if (nc < NR) {
      memcpy(mult_pad, mult, nc * sizeof(int32_t));
      memcpy(shift_pad, shift, nc * sizeof(int32_t));
      mult = mult_pad;
      shift = shift_pad;
    }
    struct npu_neon_rq rq[4];
    for (int q = 0; q < 4; q++)
      rq[q] = npu_neon_rq_make(vld1q_s32(mult + 4 * q), vld1q_s32(shift + 4 * q));
    const uint8_t *blk = (const uint8_t *)w_packed + n0 / NR * block_size;
    for (size_t i = 0; i < m; i++)
      npu_neon_qs16_row(k, x + i * x_stride, blk, w4, block, rq, yzp, neg_acc_shift,
                        y + i * y_stride + n0, nc);
  }
}

#endif /* __aarch64__ */
#endif /* NPU_KERNELS_NPU_QS16_GEMM_NEON_H */
