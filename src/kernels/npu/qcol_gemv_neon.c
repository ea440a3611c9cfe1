/* npu_qcol8_gemv__neon and npu_qcol4_gemv__neon: the input-sparse GEMVs over channel-major
 * weights (npu_ukernels.h) in plain NEON, bit-exact with the scalar references (integer sums that
 * cannot overflow int32 in the caller's bounds, so their order does not matter).
 *
 * The loop order of the x86 variants (qcol_gemv_avx512vnni.c): outputs in tiles of TILE (the
 * tile's int32 accumulators stay in L1), and inside a tile the kept channels in groups of up to G
 * = 8, each group one pass over the tile that reads its 8 rows as 8 sequential runs and adds all
 * of them to the accumulators of 64 outputs held in 16 registers, so acc is read and written once
 * per group, not per channel; the next group's rows are prefetched a cache line per row and
 * step. A weight is sign-extended (8-bit: vmovl_s8) or, 4-bit, its nibble zero-extended
 * (vandq_u8 / vshrq_n_u8, vmovl_u8: the 32-byte chunk's two 16-byte halves hold outputs 0-15,
 * 16-31 in their low nibbles and 32-47, 48-63 in their high ones), and multiplied by its d with
 * vmlal_n_s16 into int32x4 (|d w| <= 32768 * 127 < 2^22). The nibbles' offset 8 is folded into
 * the start, -8 * sum d over the group; with block scales the group's sums are multiplied by q
 * (vmulq_s32) before they are added. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/neon_util.h"

enum { G = 8, TILE = 1024 };

/* A group of up to G kept channels and the rows of the next one (for the prefetch). */
struct group {
  const uint8_t *row[G];
  int16_t d[G];
  size_t m;                /* channels in the group */
  int32_t dsum;            /* sum of their d */
  const uint8_t *next[G];  /* the next group's rows at this pass's first output */
  size_t n_next, next_len; /* how many; prefetch their first next_len bytes */
};

/* Group i / G of the 'count' channels over the tile [t0, t1) of [.., n1), rows of 'shift' (0:
 * 8-bit; 1: 4-bit, half a byte per output); the next group is the following one of the tile, else
 * the first of the next tile. */
static void group_make(struct group *g, size_t i, size_t count, const int32_t *idx,
                       const int16_t *d, const void *cols, size_t row_stride, int shift, size_t t0,
                       size_t t1, size_t n1) {
  const uint8_t *base = cols;
  g->m = count - i < G ? count - i : G;
  g->dsum = 0;
  for (size_t j = 0; j < g->m; j++) {
    assert(idx[i + j] >= 0);
    g->row[j] = base + (size_t)idx[i + j] * row_stride;
    g->d[j] = d[i + j];
    g->dsum += d[i + j];
  }
  size_t nf = 0, at = t0;
  if (i + G < count) nf = i + G;
  else if (t1 < n1) at = t1;
  else {
    g->n_next = 0, g->next_len = 0;
    return;
  }
  const size_t end = at + (t1 - t0) < n1 ? at + (t1 - t0) : n1;
  g->n_next = count - nf < G ? count - nf : G;
  g->next_len = (end - at) >> shift;
  for (size_t j = 0; j < g->n_next; j++)
    g->next[j] = base + (size_t)idx[nf + j] * row_stride + (at >> shift);
}

NPU_INLINE_NEON void prefetch_next(const struct group *g, size_t off) {
  if (off < g->next_len)
    for (size_t j = 0; j < g->n_next; j++) __builtin_prefetch(g->next[j] + off);
}

static void check(size_t n0, size_t n1, size_t row_stride, int w_bits) {
  assert(n0 % NPU_QCOL_NR == 0 && n1 % NPU_QCOL_NR == 0 && n0 <= n1);
  assert(w_bits == 8 ? row_stride % NPU_QCOL_NR == 0 && row_stride >= n1
                     : row_stride % (NPU_QCOL_NR / 2) == 0 && row_stride >= n1 / 2);
  (void)n0, (void)n1, (void)row_stride, (void)w_bits; /* with NDEBUG */
}

/* 8-bit: dst[0..63] += the group's channels at the 64 outputs of byte o. */
NPU_INLINE_NEON void step8(const struct group *g, size_t o, int32_t *dst) {
  int32x4_t a[16];
  for (int v = 0; v < 16; v++) a[v] = vld1q_s32(dst + 4 * v);
  for (size_t j = 0; j < g->m; j++) {
    const int8_t *w = (const int8_t *)g->row[j] + o;
    const int16_t dj = g->d[j];
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
      const int8x16_t wv = vld1q_s8(w + 16 * h);
      const int16x8_t w0 = vmovl_s8(vget_low_s8(wv)), w1 = vmovl_high_s8(wv);
      a[4 * h] = vmlal_n_s16(a[4 * h], vget_low_s16(w0), dj);
      a[4 * h + 1] = vmlal_high_n_s16(a[4 * h + 1], w0, dj);
      a[4 * h + 2] = vmlal_n_s16(a[4 * h + 2], vget_low_s16(w1), dj);
      a[4 * h + 3] = vmlal_high_n_s16(a[4 * h + 3], w1, dj);
    }
  }
  for (int v = 0; v < 16; v++) vst1q_s32(dst + 4 * v, a[v]);
}

void npu_qcol8_gemv__neon(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                          const int16_t *restrict d, const int8_t *restrict cols, size_t row_stride,
                          int32_t *restrict acc) {
  check(n0, n1, row_stride, 8);
  for (size_t t0 = n0; t0 < n1; t0 += TILE) {
    const size_t t1 = t0 + TILE < n1 ? t0 + TILE : n1;
    for (size_t i = 0; i < count; i += G) {
      struct group g;
      group_make(&g, i, count, idx, d, cols, row_stride, 0, t0, t1, n1);
      for (size_t o = t0; o < t1; o += NPU_QCOL_NR) {
        prefetch_next(&g, o - t0);
        step8(&g, o, acc + (o - n0));
      }
    }
  }
}

/* 4-bit: dst[0..63] += (q *) the group's channels at the 64 outputs of the chunk at byte o. */
NPU_INLINE_NEON void step4(const struct group *g, size_t o, const uint8_t *q, int32_t *dst) {
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  int32x4_t a[16]; /* outputs 4v .. 4v+3 */
  for (int v = 0; v < 16; v++) a[v] = vdupq_n_s32(-8 * g->dsum);
  for (size_t j = 0; j < g->m; j++) {
    const uint8_t *w = g->row[j] + o;
    const int16_t dj = g->d[j];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* half h: outputs 16h .. 16h+15 and 32+16h .. */
      const uint8x16_t wv = vld1q_u8(w + 16 * h);
      const uint8x16_t nib[2] = {vandq_u8(wv, m4), vshrq_n_u8(wv, 4)};
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) {
        const int16x8_t x0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(nib[s])));
        const int16x8_t x1 = vreinterpretq_s16_u16(vmovl_high_u8(nib[s]));
        int32x4_t *r = a + 8 * s + 4 * h;
        r[0] = vmlal_n_s16(r[0], vget_low_s16(x0), dj);
        r[1] = vmlal_high_n_s16(r[1], x0, dj);
        r[2] = vmlal_n_s16(r[2], vget_low_s16(x1), dj);
        r[3] = vmlal_high_n_s16(r[3], x1, dj);
      }
    }
  }
  if (q != NULL) {
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
      const uint8x16_t qv = vld1q_u8(q + 16 * h);
      const uint16x8_t q0 = vmovl_u8(vget_low_u8(qv)), q1 = vmovl_high_u8(qv);
      a[4 * h] = vmulq_s32(a[4 * h], vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(q0))));
      a[4 * h + 1] = vmulq_s32(a[4 * h + 1], vreinterpretq_s32_u32(vmovl_high_u16(q0)));
      a[4 * h + 2] = vmulq_s32(a[4 * h + 2], vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(q1))));
      a[4 * h + 3] = vmulq_s32(a[4 * h + 3], vreinterpretq_s32_u32(vmovl_high_u16(q1)));
    }
  }
  for (int v = 0; v < 16; v++) vst1q_s32(dst + 4 * v, vaddq_s32(vld1q_s32(dst + 4 * v), a[v]));
}

void npu_qcol4_gemv__neon(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                          const int16_t *restrict d, const uint8_t *restrict cols,
                          size_t row_stride, const uint8_t *restrict q, int32_t *restrict acc) {
  check(n0, n1, row_stride, 4);
  for (size_t t0 = n0; t0 < n1; t0 += TILE) {
    const size_t t1 = t0 + TILE < n1 ? t0 + TILE : n1;
    for (size_t i = 0; i < count; i += G) {
      struct group g;
      group_make(&g, i, count, idx, d, cols, row_stride, 1, t0, t1, n1);
      for (size_t o = t0; o < t1; o += NPU_QCOL_NR) {
        if ((o - t0) % (2 * NPU_QCOL_NR) == 0) prefetch_next(&g, (o - t0) / 2);
        step4(&g, o / 2, q != NULL ? q + o : NULL, acc + (o - n0));
      }
    }
  }
}

#endif /* __aarch64__ */
