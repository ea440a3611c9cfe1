/* npu_qs8_gemm__neon and npu_qs8_gemm_qs16__neon: int8 GEMM on baseline Advanced SIMD (no dot
 * product), in tiles of MR = 2 rows x 16 channels, XNNPACK's "mlal + padal" scheme. Each 8-byte
 * half of a packed 16-byte row holds 2 channels x 4 k values; with the x group broadcast to match,
 * vmull_s8 forms the 8 int16 products of one group and vmlal_s8 adds the next group's (each product
 * is at most 128 * 127 in size, since no weight is -128, so two of them fit int16), and vpadalq_s16
 * adds neighbouring pairs into int32 lanes: [c (k0+k1), c (k2+k3), c+1 (k0+k1), c+1 (k2+k3)].
 * vpaddq_s32 of two such accumulators gives 4 channels' sums at the end. The raw int8 x enters and
 * the zero point once per channel as bias - x_zero_point * wsum; every int32 sum is exact, so the
 * result is bit-exact with npu_qs8_gemm__scalar. */
#include "kernels/npu/ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/qs8_gemm_neon.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 2 };

/* acc[0..7] (channel pairs) += one group of the packed weights at w times x0 (its 4 k values
 * broadcast) or, with 'two', also the next group times x1. */
NPU_INLINE_NEON void mlal_groups(int32x4_t acc[8], const int8_t *w, int8x16_t x0, int8x16_t x1,
                                 int two) {
  for (int q = 0; q < 4; q++) {
    const int8x16_t w0 = vld1q_s8(w + 16 * q);
    int16x8_t lo = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
    int16x8_t hi = vmull_high_s8(w0, x0);
    if (two) {
      const int8x16_t w1 = vld1q_s8(w + NR * KR + 16 * q);
      lo = vmlal_s8(lo, vget_low_s8(w1), vget_low_s8(x1));
      hi = vmlal_high_s8(hi, w1, x1);
    }
    acc[2 * q] = vpadalq_s16(acc[2 * q], lo);
    acc[2 * q + 1] = vpadalq_s16(acc[2 * q + 1], hi);
  }
}

/* A group's 4 bytes (one int32) broadcast to all 16 bytes. */
NPU_INLINE_NEON int8x16_t bcast_group(int32_t word) {
  return vreinterpretq_s8_s32(vdupq_n_s32(word));
}

/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_NEON void gemm_tile(const int mr, size_t k, const int8_t *restrict x, size_t x_stride,
                               const struct npu_neon_gemm_block *c, int32x4_t yzp, int out16,
                               void *restrict y, size_t y_stride, size_t nc) {
  enum { MRX = 4 };
  const int8_t *xr[MRX];
  int32x4_t acc[MRX][8];
  for (int r = 0; r < MRX; r++) {
    xr[r] = x + (size_t)(r < mr ? r : 0) * x_stride;
    for (int q = 0; q < 8; q++) acc[r][q] = vdupq_n_s32(0);
  }
  const int8_t *w = c->w;
  size_t kk = 0;
  for (; kk + 2 * KR <= k; kk += 2 * KR) { /* two groups per step */
    for (int r = 0; r < mr; r++)
      mlal_groups(acc[r], w, bcast_group(npu_neon_gemm_word(xr[r] + kk)),
                  bcast_group(npu_neon_gemm_word(xr[r] + kk + KR)), 1);
    w += 2 * NR * KR;
  }
  for (; kk < k; kk += KR) { /* the last one or two groups, the last maybe partial (zero-filled) */
    const size_t rem = k - kk;
    for (int r = 0; r < mr; r++) {
      const int32_t word =
          rem >= KR ? npu_neon_gemm_word(xr[r] + kk) : npu_neon_gemm_tail(xr[r] + kk, rem);
      mlal_groups(acc[r], w, bcast_group(word), bcast_group(word), 0);
    }
    w += NR * KR;
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  for (int r = 0; r < mr; r++) {
    int32x4_t sums[4];
    for (int q = 0; q < 4; q++)
      sums[q] = vaddq_s32(c->init[q], vpaddq_s32(acc[r][2 * q], acc[r][2 * q + 1]));
    npu_neon_gemm_store_row(sums, c, yzp, out16, (uint8_t *)y + (size_t)r * y_stride * esize, nc);
  }
}

NPU_INLINE_NEON void gemm_neon(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, void *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p,
                               int out16){NPU_QS8_GEMM_NEON_OUTER(gemm_tile, MR)}

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm__neon, int8_t, , gemm_neon, 0)
    NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm_qs16__neon, int16_t, , gemm_neon, 1)

#endif /* __aarch64__ */
