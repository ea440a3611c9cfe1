/* The loop structure shared by the x86 input-sparse GEMVs (qcol_gemv_avx2.c,
 * qcol_gemv_avx512vnni.c): the contract checks, and a group of kept channels (their rows, their d,
 * and the rows that the next group will read, for the software prefetch). Plain C apart from
 * _mm_prefetch, so either target inlines it. */
#ifndef NPU_KERNELS_NPU_QCOL_GEMV_X86_H
#define NPU_KERNELS_NPU_QCOL_GEMV_X86_H

#if defined(__x86_64__)

#include <assert.h>
#include <immintrin.h>

#include "kernels/npu/npu_ukernels.h"

/* The loop order and its measured choices: qcol_gemv_avx512vnni.c's head comment. */
#define NPU_QCOL_TILE 1024 /* outputs per tile: the tile's int32 accumulators (4 KB) stay in L1 */
#define NPU_QCOL_G 8       /* kept channels per group: 4 pairs, 8 rows read side by side */

/* Assert the contract of npu_ukernels.h on the output range and the row stride. */
static inline void npu_qcol_check(size_t n0, size_t n1, size_t row_stride, int w_bits) {
  assert(n0 % NPU_QCOL_NR == 0 && n1 % NPU_QCOL_NR == 0 && n0 <= n1);
  assert(w_bits == 8 ? row_stride % NPU_QCOL_NR == 0 && row_stride >= n1
                     : row_stride % (NPU_QCOL_NR / 2) == 0 && row_stride >= n1 / 2);
  (void)n0, (void)n1, (void)row_stride, (void)w_bits; /* with NDEBUG */
}

/* Up to NPU_QCOL_G kept channels, in pairs: a missing channel of the last group reads the
 * group's first row with d = 0. */
struct npu_qcol_group {
  const uint8_t *row[NPU_QCOL_G];  /* the channels' rows */
  int32_t d[NPU_QCOL_G];           /* their d (0 for a missing channel) */
  int32_t dsum;                    /* sum of d */
  int pairs;                       /* 1 to 4 */
  int n_next;                      /* rows of the next group (0: none) */
  const uint8_t *next[NPU_QCOL_G]; /* their bytes at this pass's first output */
  size_t next_len;                 /* prefetch their first next_len bytes */
};

/* Group i / NPU_QCOL_G of the 'count' channels (idx, d) over the tile [t0, t1) of [.., n1), for
 * rows of 'shift' (0: 8-bit, one byte per output; 1: 4-bit, half a byte). The next group is the
 * following one of the tile, else the first of the next tile. */
static inline void npu_qcol_group_make(struct npu_qcol_group *g, size_t i, size_t count,
                                       const int32_t *idx, const int16_t *d, const void *cols,
                                       size_t row_stride, int shift, size_t t0, size_t t1,
                                       size_t n1) {
  const uint8_t *base = cols;
  const size_t m = count - i < NPU_QCOL_G ? count - i : NPU_QCOL_G;
  g->pairs = (int)(m + 1) / 2;
  g->dsum = 0;
  for (size_t j = 0; j < NPU_QCOL_G; j++) {
    assert(j >= m || idx[i + j] >= 0);
    g->row[j] = base + (size_t)idx[i + (j < m ? j : 0)] * row_stride;
    g->d[j] = j < m ? d[i + j] : 0;
    g->dsum += g->d[j];
  }
  size_t nf = 0, at = t0; /* the next group: channels nf from, at output 'at' */
  if (i + NPU_QCOL_G < count) nf = i + NPU_QCOL_G;
  else if (t1 < n1) at = t1;
  else {
    g->n_next = 0, g->next_len = 0;
    return;
  }
  const size_t mn = count - nf < NPU_QCOL_G ? count - nf : NPU_QCOL_G;
  const size_t end = at + (t1 - t0) < n1 ? at + (t1 - t0) : n1;
  g->n_next = (int)mn;
  g->next_len = (end - at) >> shift;
  for (size_t j = 0; j < mn; j++)
    g->next[j] = base + (size_t)idx[nf + j] * row_stride + (at >> shift);
}

/* Prefetch the cache line at byte 'off' of each row of the next group (if within its range). */
static inline __attribute__((always_inline)) void npu_qcol_prefetch(const struct npu_qcol_group *g,
                                                                    size_t off) {
  if (off < g->next_len)
    for (int j = 0; j < g->n_next; j++) _mm_prefetch((const char *)(g->next[j] + off), _MM_HINT_T0);
}

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_QCOL_GEMV_X86_H */
