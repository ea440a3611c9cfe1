/* The AArch64 GEMMs of int8 activations (qs8_gemm and, with int4 weights, qs8_qc4w_gemm; each
 * with int8 or int16 outputs): the contract checks, the weights of 8 k (two 4-k groups) read from
 * the int8 layout or decoded from a qc4w nibble pair (the same [16][4] groups), reading x without
 * reading past a row, the per-block setup from the packed head (the two layouts share it), the
 * requantize-and-store of one row of 16 channels, the three tiles (plain NEON vmull/vmlal +
 * vpadal, sdot, smmla), and the entry points. Both weight layouts go through the same tiles, so
 * every variant sums the same exact int32 products. */
#ifndef NPU_KERNELS_NPU_QS8_GEMM_NEON_H
#define NPU_KERNELS_NPU_QS8_GEMM_NEON_H

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"
#include "kernels/npu/npu_ukernels.h"

/* Assert the npu_ukernels.h contract on k, n_begin and the x zero point; return the packed block
 * size: 128 + 16 * kp bytes (int8 layout) or npu_qc4w_gemm_block_size(k, 0) (w4, qc4w). */
static inline size_t npu_neon_gemm_block_size(size_t k, size_t n_begin,
                                              const struct npu_qs8_gemm_params *p, int w4) {
  assert(k >= 1 && k <= 32768);
  assert(n_begin % NPU_QS8_GEMM_NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  (void)n_begin, (void)p; /* with NDEBUG */
  if (w4) return npu_qc4w_gemm_block_size(k, 0);
  const size_t kp = (k + NPU_QS8_GEMM_KR - 1) / NPU_QS8_GEMM_KR * NPU_QS8_GEMM_KR;
  return 2 * NPU_QS8_GEMM_NR * sizeof(int32_t) + NPU_QS8_GEMM_NR * kp;
}

/* x[kk .. kk+7] of a row of k values, zero-filled past k (the packed weights are 0 there, so
 * whatever the filler is worth, it adds nothing), never reading past the row. */
NPU_INLINE_NEON int8x8_t npu_neon_gemm_x8(const int8_t *row, size_t kk, size_t k) {
  if (kk + 8 <= k) return vld1_s8(row + kk);
  int8_t buf[8] = {0};
  memcpy(buf, row + kk, k - kk);
  return vld1_s8(buf);
}

/* The weights of k = 8p .. 8p+7 at w: lo[q] and hi[q] the groups 2p and 2p+1 of channels 4q ..
 * 4q+3 (16 bytes: 4 channels x 4 k). The int8 layout holds them as they are (128 bytes; 'one'
 * reads only the first group, the last of a k that ends within it); a qc4w nibble pair (64 bytes)
 * holds group 2p in its low nibbles and 2p + 1 in its high ones, offset by 8. Return the bytes
 * read. */
NPU_INLINE_NEON size_t npu_neon_gemm_load_pair(const int8_t *w, int w4, int one, int8x16_t lo[4],
                                               int8x16_t hi[4]) {
  if (w4) {
    const uint8x16_t mask = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int q = 0; q < 4; q++) {
      const uint8x16_t b = vld1q_u8((const uint8_t *)w + 16 * q);
      lo[q] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, mask)), eight);
      hi[q] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
    }
    return 64;
  }
  for (int q = 0; q < 4; q++) {
    lo[q] = vld1q_s8(w + 16 * q);
    hi[q] = one ? vdupq_n_s8(0) : vld1q_s8(w + 64 + 16 * q);
  }
  return one ? 64 : 128;
}

/* What a block of 16 channels needs besides its weights. */
struct npu_neon_gemm_block {
  int32x4_t init[4];        /* accumulator start of channels 4q .. 4q+3: bias - zx * wsum */
  struct npu_neon_rq rq[4]; /* requantization of channels 4q .. 4q+3 */
  const int8_t *w;          /* packed weights: [kp / 4][16][4] */
};

/* Set up the packed block at 'block' (channels n0 .. n0 + nc - 1 valid, nc in [1, 16]) for
 * products with the raw int8 x: the zero point enters once per channel as bias - zx * wsum
 * (|zx * wsum| <= 128 * 127 * 32768 < 2^29, so with |bias| <= 2^30 the start stays in int32; the
 * accumulation wraps like the exact sum it equals in the end). */
NPU_INLINE_NEON void npu_neon_gemm_block_setup(const uint8_t *block, size_t n0, size_t nc,
                                               const struct npu_qs8_gemm_params *restrict p,
                                               struct npu_neon_gemm_block *b) {
  enum { NR = NPU_QS8_GEMM_NR };
  const int32_t *head = (const int32_t *)(const void *)block;
  const int32_t *mult = p->mult + n0, *shift = p->shift + n0;
  int32_t mult_pad[NR] = {0}, shift_pad[NR] = {0}; /* a partial block pads with mult 0, shift 0 */
  if (nc < NR) {
    memcpy(mult_pad, mult, nc * sizeof(int32_t));
    memcpy(shift_pad, shift, nc * sizeof(int32_t));
    mult = mult_pad;
    shift = shift_pad;
  }
  for (int q = 0; q < 4; q++) {
    b->init[q] =
        vmlsq_n_s32(vld1q_s32(head + 4 * q), vld1q_s32(head + NR + 4 * q), p->x_zero_point);
    b->rq[q] = npu_neon_rq_make(vld1q_s32(mult + 4 * q), vld1q_s32(shift + 4 * q));
  }
  b->w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
}

/* Requantize one row of 16 channels (acc[q]: channels 4q .. 4q+3) with block b's constants, add
 * the output zero point, saturate and store the first nc (1..16) as int8 or, with out16, int16. */
NPU_INLINE_NEON void npu_neon_gemm_store_row(const int32x4_t acc[4],
                                             const struct npu_neon_gemm_block *b, int32x4_t yzp,
                                             int out16, void *y, size_t nc) {
  int32x4_t q[4];
  for (int i = 0; i < 4; i++) q[i] = npu_neon_add_zp(npu_neon_requantize(acc[i], &b->rq[i]), yzp);
  if (out16) {
    const int16x8_t lo = npu_neon_narrow_s16(q[0], q[1]), hi = npu_neon_narrow_s16(q[2], q[3]);
    if (nc == NPU_QS8_GEMM_NR) {
      vst1q_s16((int16_t *)y, lo);
      vst1q_s16((int16_t *)y + 8, hi);
    } else { /* a partial block: only nc elements reach y */
      int16_t tmp[NPU_QS8_GEMM_NR];
      vst1q_s16(tmp, lo);
      vst1q_s16(tmp + 8, hi);
      memcpy(y, tmp, nc * sizeof(int16_t));
    }
  } else {
    const int8x16_t v = npu_neon_narrow_s8(q[0], q[1], q[2], q[3]);
    if (nc == NPU_QS8_GEMM_NR) {
      vst1q_s8((int8_t *)y, v);
    } else {
      int8_t tmp[NPU_QS8_GEMM_NR];
      vst1q_s8(tmp, v);
      memcpy(y, tmp, nc);
    }
  }
}

#if NPU_NEON_DOTPROD_VARIANTS /* npu_ukernels.h */
/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels with the dot product:
 * each 16-byte row of 4 channels x 4 k is what one sdot consumes, the x group picked by sdot's
 * lane index from the 8 bytes of x that a pair of groups covers. */
static inline __attribute__((always_inline)) NPU_TARGET_DOTPROD void
npu_neon_gemm_tile_dot(const int mr, const int w4, size_t k, const int8_t *restrict x,
                       size_t x_stride, const struct npu_neon_gemm_block *c, int32x4_t yzp,
                       int out16, void *restrict y, size_t y_stride, size_t nc) {
  enum { MR = 4 };
  const int8_t *xr[MR];
  int32x4_t acc[MR][4];
  for (int r = 0; r < MR; r++) {
    xr[r] = x + (size_t)(r < mr ? r : 0) * x_stride;
    for (int q = 0; q < 4; q++) acc[r][q] = c->init[q];
  }
  const int8_t *w = c->w;
  for (size_t kk = 0; kk < k; kk += 8) {
    int8x16_t lo[4], hi[4];
    w += npu_neon_gemm_load_pair(w, w4, !w4 && k - kk <= 4, lo, hi);
    for (int r = 0; r < mr; r++) {
      const int8x8_t x8 = npu_neon_gemm_x8(xr[r], kk, k);
      const int8x16_t xv = vcombine_s8(x8, x8);
      for (int q = 0; q < 4; q++) {
        acc[r][q] = vdotq_laneq_s32(acc[r][q], lo[q], xv, 0);
        acc[r][q] = vdotq_laneq_s32(acc[r][q], hi[q], xv, 1);
      }
    }
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  for (int r = 0; r < mr; r++)
    npu_neon_gemm_store_row(acc[r], c, yzp, out16, (uint8_t *)y + (size_t)r * y_stride * esize, nc);
}

#if NPU_NEON_I8MM_VARIANTS
/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels with the int8 matrix
 * multiply (smmla: a 2 x 8 block of x times the 8 x 2 of two channels' weights into 2 x 2 int32):
 * two rows at a time, the 8 bytes of each row's x for k = 8p .. 8p+7 side by side, and each
 * channel's 8 k gathered from its two groups by vzip1q_s32 / vzip2q_s32 (4 k of group 2p, then 4
 * of group 2p + 1). One row alone (decode) would waste half of each smmla: it takes the sdot
 * tile. */
static inline __attribute__((always_inline)) NPU_TARGET_I8MM void
npu_neon_gemm_tile_mmla(const int mr, const int w4, size_t k, const int8_t *restrict x,
                        size_t x_stride, const struct npu_neon_gemm_block *c, int32x4_t yzp,
                        int out16, void *restrict y, size_t y_stride, size_t nc) {
  enum { MR = 4 };
  if (mr == 1) {
    npu_neon_gemm_tile_dot(1, w4, k, x, x_stride, c, yzp, out16, y, y_stride, nc);
    return;
  }
  const int8_t *xr[MR];
  int32x4_t acc[MR / 2][8]; /* row pair rp, channel pair cp: [r0 c0, r0 c1, r1 c0, r1 c1] */
  for (int r = 0; r < MR; r++) xr[r] = x + (size_t)(r < mr ? r : 0) * x_stride;
  for (int rp = 0; rp < MR / 2; rp++)
    for (int cp = 0; cp < 8; cp++) acc[rp][cp] = vdupq_n_s32(0);
  const int8_t *w = c->w;
  for (size_t kk = 0; kk < k; kk += 8) {
    int8x16_t lo[4], hi[4], b[8];
    w += npu_neon_gemm_load_pair(w, w4, !w4 && k - kk <= 4, lo, hi);
    for (int q = 0; q < 4; q++) {
      const int32x4_t l = vreinterpretq_s32_s8(lo[q]), h = vreinterpretq_s32_s8(hi[q]);
      b[2 * q] = vreinterpretq_s8_s32(vzip1q_s32(l, h));     /* channels 4q, 4q+1 */
      b[2 * q + 1] = vreinterpretq_s8_s32(vzip2q_s32(l, h)); /* channels 4q+2, 4q+3 */
    }
    for (int rp = 0; 2 * rp < mr; rp++) {
      const int8x16_t a =
          vcombine_s8(npu_neon_gemm_x8(xr[2 * rp], kk, k), npu_neon_gemm_x8(xr[2 * rp + 1], kk, k));
      for (int cp = 0; cp < 8; cp++) acc[rp][cp] = vmmlaq_s32(acc[rp][cp], a, b[cp]);
    }
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  for (int rp = 0; 2 * rp < mr; rp++) {
    int32x4_t r0[4], r1[4];
    for (int q = 0; q < 4; q++) {
      const int64x2_t a01 = vreinterpretq_s64_s32(acc[rp][2 * q]);
      const int64x2_t a23 = vreinterpretq_s64_s32(acc[rp][2 * q + 1]);
      r0[q] = vaddq_s32(c->init[q], vreinterpretq_s32_s64(vzip1q_s64(a01, a23)));
      r1[q] = vaddq_s32(c->init[q], vreinterpretq_s32_s64(vzip2q_s64(a01, a23)));
    }
    uint8_t *y0 = (uint8_t *)y + (size_t)(2 * rp) * y_stride * esize;
    npu_neon_gemm_store_row(r0, c, yzp, out16, y0, nc);
    if (2 * rp + 1 < mr) npu_neon_gemm_store_row(r1, c, yzp, out16, y0 + y_stride * esize, nc);
  }
}
#endif /* NPU_NEON_I8MM_VARIANTS */
#endif /* NPU_NEON_DOTPROD_VARIANTS */

/* acc[0..7] (channel pairs) += the 16 channels' groups w0 and w1 times x0 and x1 (each x group's 4
 * bytes broadcast): vmull_s8 forms the 8 int16 products of 2 channels x 4 k of one group and
 * vmlal_s8 adds the other group's (each product is at most 128 * 127 in size, since no weight is
 * -128, so two of them fit int16); vpadalq_s16 adds neighbouring pairs into int32 lanes:
 * [c (k0+k1), c (k2+k3), c+1 (k0+k1), c+1 (k2+k3)]. */
NPU_INLINE_NEON void npu_neon_gemm_mlal(int32x4_t acc[8], const int8x16_t w0[4],
                                        const int8x16_t w1[4], int8x16_t x0, int8x16_t x1) {
  for (int q = 0; q < 4; q++) {
    int16x8_t lo = vmull_s8(vget_low_s8(w0[q]), vget_low_s8(x0));
    int16x8_t hi = vmull_high_s8(w0[q], x0);
    lo = vmlal_s8(lo, vget_low_s8(w1[q]), vget_low_s8(x1));
    hi = vmlal_high_s8(hi, w1[q], x1);
    acc[2 * q] = vpadalq_s16(acc[2 * q], lo);
    acc[2 * q + 1] = vpadalq_s16(acc[2 * q + 1], hi);
  }
}

/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels on baseline NEON
 * (XNNPACK's "mlal + padal" scheme); vpaddq_s32 of two accumulators gives 4 channels' sums at
 * the end. */
NPU_INLINE_NEON void npu_neon_gemm_tile_mlal(const int mr, const int w4, size_t k,
                                             const int8_t *restrict x, size_t x_stride,
                                             const struct npu_neon_gemm_block *c, int32x4_t yzp,
                                             int out16, void *restrict y, size_t y_stride,
                                             size_t nc) {
  enum { MR = 4 };
  const int8_t *xr[MR];
  int32x4_t acc[MR][8];
  for (int r = 0; r < MR; r++) {
    xr[r] = x + (size_t)(r < mr ? r : 0) * x_stride;
    for (int q = 0; q < 8; q++) acc[r][q] = vdupq_n_s32(0);
  }
  const int8_t *w = c->w;
  for (size_t kk = 0; kk < k; kk += 8) {
    int8x16_t lo[4], hi[4];
    w += npu_neon_gemm_load_pair(w, w4, !w4 && k - kk <= 4, lo, hi);
    for (int r = 0; r < mr; r++) {
      const int32x2_t x8 = vreinterpret_s32_s8(npu_neon_gemm_x8(xr[r], kk, k));
      npu_neon_gemm_mlal(acc[r], lo, hi, vreinterpretq_s8_s32(vdupq_lane_s32(x8, 0)),
                         vreinterpretq_s8_s32(vdupq_lane_s32(x8, 1)));
    }
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  for (int r = 0; r < mr; r++) {
    int32x4_t sums[4];
    for (int q = 0; q < 4; q++)
      sums[q] = vaddq_s32(c->init[q], vpaddq_s32(acc[r][2 * q], acc[r][2 * q + 1]));
    npu_neon_gemm_store_row(sums, c, yzp, out16, (uint8_t *)y + (size_t)r * y_stride * esize, nc);
  }
}

/* Define the entry point 'name' of a variant (npu_ukernels.h signature, int8 or int16 'ytype'
 * outputs, function attributes 'target'): blocks of 16 channels, each across all rows in tiles of
 * 'mr_max' rows of 'tile' (npu_neon_gemm_tile_mmla, _dot or _mlal, with w4 for the qc4w layout),
 * then one tile of the rest; decode (m = 1) walks the blocks one after another, a sequential
 * stream. */
#define NPU_QS8_GEMM_NEON_ENTRY(name, ytype, target, tile, mr_max, w4, out16)                      \
  target void name(size_t m, size_t n_begin, size_t n_end, size_t k, const int8_t *restrict x,     \
                   size_t x_stride, const void *restrict w_packed, ytype *restrict y,              \
                   size_t y_stride, const struct npu_qs8_gemm_params *restrict p) {                \
    const size_t block_size = npu_neon_gemm_block_size(k, n_begin, p, w4);                         \
    const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);                                            \
    const uint8_t *blocks = w_packed;                                                              \
    for (size_t n0 = n_begin; n0 < n_end; n0 += NPU_QS8_GEMM_NR) {                                 \
      const size_t nc = n_end - n0 < NPU_QS8_GEMM_NR ? n_end - n0 : NPU_QS8_GEMM_NR;               \
      struct npu_neon_gemm_block c;                                                                \
      npu_neon_gemm_block_setup(blocks + n0 / NPU_QS8_GEMM_NR * block_size, n0, nc, p, &c);        \
      ytype *yn = y + n0;                                                                          \
      size_t i = 0;                                                                                \
      for (; i + (mr_max) <= m; i += (mr_max))                                                     \
        tile((mr_max), w4, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride,       \
             y_stride, nc);                                                                        \
      switch (m - i) { /* the last rows: fewer than mr_max (at most 3) */                          \
      case 3:                                                                                      \
        tile(3, w4, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride, y_stride,    \
             nc);                                                                                  \
        break;                                                                                     \
      case 2:                                                                                      \
        tile(2, w4, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride, y_stride,    \
             nc);                                                                                  \
        break;                                                                                     \
      case 1:                                                                                      \
        tile(1, w4, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride, y_stride,    \
             nc);                                                                                  \
        break;                                                                                     \
      default: break;                                                                              \
      }                                                                                            \
    }                                                                                              \
  }

#endif /* __aarch64__ */
#endif /* NPU_KERNELS_NPU_QS8_GEMM_NEON_H */
