/* The pieces of the AArch64 int8 GEMMs (qs8_gemm_neon.c, qs8_gemm_neondot.c) that do not depend
 * on how the products are formed: the contract checks, reading x in k groups without reading past
 * a row, the per-block setup from the packed head (requantization constants), the requantize-and-
 * store of one row of 16 channels, and the two entry points over a kernel's inner function. */
#ifndef NPU_KERNELS_NPU_QS8_GEMM_NEON_H
#define NPU_KERNELS_NPU_QS8_GEMM_NEON_H

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"
#include "kernels/npu/ukernels.h"

/* Assert the ukernels.h contract on k, n_begin and the x zero point; return the packed block
 * size, 128 + 16 * kp bytes. */
static inline size_t npu_neon_gemm_block_size(size_t k, size_t n_begin,
                                              const struct npu_qs8_gemm_params *p) {
  assert(k >= 1 && k <= 32768);
  assert(n_begin % NPU_QS8_GEMM_NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  (void)n_begin, (void)p; /* with NDEBUG */
  const size_t kp = (k + NPU_QS8_GEMM_KR - 1) / NPU_QS8_GEMM_KR * NPU_QS8_GEMM_KR;
  return 2 * NPU_QS8_GEMM_NR * sizeof(int32_t) + NPU_QS8_GEMM_NR * kp;
}

/* x[4g .. 4g+3] as one int32 (any alignment). */
static inline int32_t npu_neon_gemm_word(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* The last, partial k group: 'rem' (1..3) bytes, zero-filled (the packed weights are 0 there, so
 * whatever the filler is worth, it adds nothing). */
static inline int32_t npu_neon_gemm_tail(const int8_t *p, size_t rem) {
  int32_t v = 0;
  memcpy(&v, p, rem);
  return v;
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

/* Define the entry point 'name' of a GEMM variant (ukernels.h signature, int8 or int16 'ytype'
 * outputs, function attributes 'target') over the variant's
 * inner(m, n_begin, n_end, k, x, x_stride, w_packed, y, y_stride, params, out16). */
#define NPU_QS8_GEMM_NEON_ENTRY(name, ytype, target, inner, out16)                                 \
  target void name(size_t m, size_t n_begin, size_t n_end, size_t k, const int8_t *restrict x,     \
                   size_t x_stride, const void *restrict w_packed, ytype *restrict y,              \
                   size_t y_stride, const struct npu_qs8_gemm_params *restrict params) {           \
    inner(m, n_begin, n_end, k, x, x_stride, w_packed, y, y_stride, params, out16);                \
  }

/* The outer loop of a variant: blocks of 16 channels, each across all rows in tiles of 'mr_max'
 * rows (then one tile of the rest), tile(mr, k, x, x_stride, &block, yzp, out16, y, y_stride, nc)
 * doing one tile ('mr' a constant after inlining). */
#define NPU_QS8_GEMM_NEON_OUTER(tile, mr_max)                                                      \
  const size_t block_size = npu_neon_gemm_block_size(k, n_begin, p);                               \
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);                                   \
  const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);                                              \
  const uint8_t *blocks = w_packed;                                                                \
  uint8_t *yb = y;                                                                                 \
  for (size_t n0 = n_begin; n0 < n_end; n0 += NPU_QS8_GEMM_NR) {                                   \
    const size_t nc = n_end - n0 < NPU_QS8_GEMM_NR ? n_end - n0 : NPU_QS8_GEMM_NR;                 \
    struct npu_neon_gemm_block c;                                                                  \
    npu_neon_gemm_block_setup(blocks + n0 / NPU_QS8_GEMM_NR * block_size, n0, nc, p, &c);          \
    uint8_t *yn = yb + n0 * esize;                                                                 \
    size_t i = 0;                                                                                  \
    for (; i + (mr_max) <= m; i += (mr_max))                                                       \
      tile((mr_max), k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,     \
           y_stride, nc);                                                                          \
    switch (m - i) { /* the last rows: fewer than mr_max (at most 3) */                            \
    case 3:                                                                                        \
      tile(3, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize, y_stride,  \
           nc);                                                                                    \
      break;                                                                                       \
    case 2:                                                                                        \
      tile(2, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize, y_stride,  \
           nc);                                                                                    \
      break;                                                                                       \
    case 1:                                                                                        \
      tile(1, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize, y_stride,  \
           nc);                                                                                    \
      break;                                                                                       \
    default: break;                                                                                \
    }                                                                                              \
  }

#endif /* __aarch64__ */
#endif /* NPU_KERNELS_NPU_QS8_GEMM_NEON_H */
