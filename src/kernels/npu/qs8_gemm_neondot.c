/* npu_qs8_gemm__neondot and npu_qs8_gemm_qs16__neondot: int8 GEMM with the Armv8.2 dot product
 * (sdot), in tiles of MR = 4 rows x 16 channels (16 accumulators of the 32 vector registers).
 * Each 16-byte row of the packed layout (4 channels x 4 k values) is what one sdot consumes: x is
 * read 16 bytes (4 k groups) at a time and each group is picked by sdot's lane index, then the
 * last whole groups broadcast one at a time, then a zero-filled partial group. sdot multiplies
 * signed by signed, so the raw int8 x enters and the zero point once per channel as
 * bias - x_zero_point * wsum (npu_neon_gemm_block_setup). Every int32 sum is exact, so the result
 * is bit-exact with npu_qs8_gemm__scalar. */
#include "kernels/npu/ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/qs8_gemm_neon.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 4 };

/* acc[0..3] += the 4 k values of x-group xg (broadcast in every lane) times the 16 channels of the
 * packed group at w. */
#define DOT_GROUP(acc, w, xg)                                                                      \
  do {                                                                                             \
    for (int q_ = 0; q_ < 4; q_++) acc[q_] = vdotq_s32(acc[q_], vld1q_s8((w) + 16 * q_), xg);      \
  } while (0)

/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels. */
static inline __attribute__((always_inline)) NPU_TARGET_DOTPROD void
gemm_tile(const int mr, size_t k, const int8_t *restrict x, size_t x_stride,
          const struct npu_neon_gemm_block *c, int32x4_t yzp, int out16, void *restrict y,
          size_t y_stride, size_t nc) {
  const int8_t *xr[MR];
  int32x4_t acc[MR][4];
  for (int r = 0; r < MR; r++) {
    xr[r] = x + (size_t)(r < mr ? r : 0) * x_stride;
    for (int q = 0; q < 4; q++) acc[r][q] = c->init[q];
  }
  const int8_t *w = c->w;
  size_t kk = 0;
  for (; kk + 4 * KR <= k; kk += 4 * KR) { /* 4 groups: x's 16 bytes, a group per lane */
    int8x16_t xv[MR];
    for (int r = 0; r < mr; r++) xv[r] = vld1q_s8(xr[r] + kk);
    for (int q = 0; q < 4; q++) {
      const int8x16_t w0 = vld1q_s8(w + 16 * q), w1 = vld1q_s8(w + 64 + 16 * q);
      const int8x16_t w2 = vld1q_s8(w + 128 + 16 * q), w3 = vld1q_s8(w + 192 + 16 * q);
      for (int r = 0; r < mr; r++) {
        acc[r][q] = vdotq_laneq_s32(acc[r][q], w0, xv[r], 0);
        acc[r][q] = vdotq_laneq_s32(acc[r][q], w1, xv[r], 1);
        acc[r][q] = vdotq_laneq_s32(acc[r][q], w2, xv[r], 2);
        acc[r][q] = vdotq_laneq_s32(acc[r][q], w3, xv[r], 3);
      }
    }
    w += 4 * NR * KR;
  }
  for (; kk + KR <= k; kk += KR) { /* the last whole groups, one at a time */
    for (int r = 0; r < mr; r++) {
      const int8x16_t xg = vreinterpretq_s8_s32(vdupq_n_s32(npu_neon_gemm_word(xr[r] + kk)));
      DOT_GROUP(acc[r], w, xg);
    }
    w += NR * KR;
  }
  if (kk < k) { /* a partial group */
    for (int r = 0; r < mr; r++) {
      const int8x16_t xg =
          vreinterpretq_s8_s32(vdupq_n_s32(npu_neon_gemm_tail(xr[r] + kk, k - kk)));
      DOT_GROUP(acc[r], w, xg);
    }
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  for (int r = 0; r < mr; r++)
    npu_neon_gemm_store_row(acc[r], c, yzp, out16, (uint8_t *)y + (size_t)r * y_stride * esize, nc);
}

static inline __attribute__((always_inline)) NPU_TARGET_DOTPROD void
gemm_neondot(size_t m, size_t n_begin, size_t n_end, size_t k, const int8_t *restrict x,
             size_t x_stride, const void *restrict w_packed, void *restrict y, size_t y_stride,
             const struct npu_qs8_gemm_params *restrict p,
             int out16){NPU_QS8_GEMM_NEON_OUTER(gemm_tile, MR)}

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm__neondot, int8_t, NPU_TARGET_DOTPROD, gemm_neondot, 0)
    NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm_qs16__neondot, int16_t, NPU_TARGET_DOTPROD, gemm_neondot,
                            1)

#endif /* __aarch64__ */
