/* The plain-C references of the input-sparse GEMVs over channel-major weights,
 * npu_qcol8_gemv__scalar and npu_qcol4_gemv__scalar (npu_ukernels.h's definitions written out, one
 * kept channel at a time; every SIMD variant is held to their bits by tests/test_npu_kernels.c),
 * and the load-time conversions of the qs8 / qc4w packed matrices into the channel-major form. */
#include <assert.h>
#include <string.h>

#include "kernels/npu/npu_ukernels.h"

size_t npu_qcol_size(size_t n, size_t k, unsigned w_bits) {
  return k * npu_qcol_row_bytes(n, w_bits);
}

/* w[n, c] of a 4-bit channel row: nibble n % 32 of chunk n / 64, low for n % 64 < 32. */
static int32_t qcol4_weight(const uint8_t *row, size_t n) {
  const uint8_t b = row[n / NPU_QCOL_NR * (NPU_QCOL_NR / 2) + n % (NPU_QCOL_NR / 2)];
  return (int32_t)(n % NPU_QCOL_NR < NPU_QCOL_NR / 2 ? b & 0x0F : b >> 4) - 8;
}

void npu_qcol8_gemv__scalar(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                            const int16_t *restrict d, const int8_t *restrict cols,
                            size_t row_stride, int32_t *restrict acc) {
  assert(n0 % NPU_QCOL_NR == 0 && n1 % NPU_QCOL_NR == 0 && n0 <= n1);
  assert(row_stride % NPU_QCOL_NR == 0 && row_stride >= n1);
  for (size_t i = 0; i < count; i++) {
    assert(idx[i] >= 0);
    const int8_t *w = cols + (size_t)idx[i] * row_stride;
    const int32_t di = d[i];
    /* every partial sum is within the caller's bound |acc| + sum |d| * 127 < 2^31 */
    for (size_t n = n0; n < n1; n++) acc[n - n0] += di * w[n];
  }
}

void npu_qcol4_gemv__scalar(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                            const int16_t *restrict d, const uint8_t *restrict cols,
                            size_t row_stride, const uint8_t *restrict q, int32_t *restrict acc) {
  assert(n0 % NPU_QCOL_NR == 0 && n1 % NPU_QCOL_NR == 0 && n0 <= n1);
  assert(row_stride % (NPU_QCOL_NR / 2) == 0 && row_stride >= n1 / 2);
  for (size_t i = 0; i < count; i++) {
    assert(idx[i] >= 0);
    const uint8_t *row = cols + (size_t)idx[i] * row_stride;
    const int32_t di = d[i];
    /* q[n] * (d * w) summed channel by channel: every partial sum is within the caller's bound
     * |acc| + 15 * sum |d| * 8 < 2^31 */
    for (size_t n = n0; n < n1; n++) {
      const int32_t s = q != NULL ? q[n] : 1;
      assert(s <= 15);
      acc[n - n0] += s * (di * qcol4_weight(row, n));
    }
  }
}

/* ---- conversions from the packed forms ---------------------------------------------------------
 * Both read the packed layouts of npu_ukernels.h directly, in tiles of TILE_N outputs (64 packed
 * 16-channel blocks; 4-bit: 2 TILE_N) x TILE_K channels; inside a tile, 8 channels (8-bit: two
 * k groups; 4-bit: one nibble pair) of 64 outputs at a time, as 8 x 8 byte transposes in
 * registers, each channel row's 64 outputs (a cache line, 8-bit; half of one, 4-bit) written in
 * 8-byte pieces. Software prefetch of both sides: the hardware prefetcher follows neither the
 * tile's 64 read runs of 2 KB (one per packed block) nor its 128 write runs of 1 KB (one per
 * channel row). The block scales, 1/32 of the entries, come through npu_qc4w_gemm_unpack_scales,
 * 16 rows at a time (one row's scales go to rows of q_out np bytes apart, a cache set each).
 * Measured on a [4096, 8192] matrix, one core of a shared machine, output memory already
 * touched: 0.4-0.8 s per GB of output (8-bit) and 0.8-0.9 (4-bit); tiles of 256 x 256 0.7 and 1.0,
 * without the prefetches 1.2 (8-bit), byte-at-a-time transposes through a stack tile 1.3-2.3,
 * and the unpack functions alone (npu_qs8_gemm_unpack_row, npu_qc4w_gemm_unpack_row: one weight
 * at a time) 2 and 5. */
enum {
  NR = NPU_QS8_GEMM_NR,                             /* outputs of a packed block */
  BLOCKS = NPU_QCOL_NR / NR,                        /* packed blocks per 64 outputs */
  HEAD = 2 * NR * sizeof(int32_t),                  /* a packed block's bias and wsum */
  GROUP = 4 * NR,                                   /* bytes of a packed k group: 16 x 4 k */
  PAIR = NR * 8 / 2,                                /* bytes of a qc4w nibble pair: 16 x 8 k */
  MAX_SCALES = NPU_QS8_GEMM_MAX_K / NPU_QC4W_BLOCK, /* block scales per packed row, at most */
  TILE_N = 1024, /* outputs per tile, a multiple of 64 (4-bit: twice as many, the same bytes) */
  TILE_K = 128,  /* channels per tile, a multiple of 8 */
  SR = 16,       /* rows of block scales moved together (np is a multiple) */
  AHEAD = 8,     /* read prefetch distance, in steps of 8 channels (1 KB of a block) */
};

/* Swap the 'bits'-bit blocks of *a and *b that (*a >> bits) and *b hold under 'mask'. */
static inline void swap_blocks(uint64_t *a, uint64_t *b, int bits, uint64_t mask) {
  const uint64_t t = (*a >> bits ^ *b) & mask;
  *b ^= t, *a ^= t << bits;
}

/* Two 16-output words of 4 channels each (word j of lo and hi: output j's channels 0-3 and 4-7,
 * byte t = channel t, as a packed k group holds them) written as the first 'rows' (1 to 8) of 8
 * channel rows of 16 outputs, out[t][j] at out + t * stride + j: two 8 x 8 byte transposes in
 * registers (byte t of x_j becomes byte j of x_t, little-endian words: byte t is bits 8t .., by
 * three rounds of swaps of 1-, 2- and 4-byte blocks, Hacker's Delight 7-3). */
static inline void transpose_16x8(const uint32_t lo[NR], const uint32_t hi[NR], size_t rows,
                                  uint8_t *restrict out, size_t stride) {
  const uint64_t m1 = 0x00FF00FF00FF00FFu, m2 = 0x0000FFFF0000FFFFu, m4 = 0x00000000FFFFFFFFu;
  for (size_t j0 = 0; j0 < NR; j0 += 8) {
    const uint32_t *l = lo + j0, *h = hi + j0;
    uint64_t x0 = l[0] | (uint64_t)h[0] << 32, x1 = l[1] | (uint64_t)h[1] << 32;
    uint64_t x2 = l[2] | (uint64_t)h[2] << 32, x3 = l[3] | (uint64_t)h[3] << 32;
    uint64_t x4 = l[4] | (uint64_t)h[4] << 32, x5 = l[5] | (uint64_t)h[5] << 32;
    uint64_t x6 = l[6] | (uint64_t)h[6] << 32, x7 = l[7] | (uint64_t)h[7] << 32;
    swap_blocks(&x0, &x1, 8, m1), swap_blocks(&x2, &x3, 8, m1);
    swap_blocks(&x4, &x5, 8, m1), swap_blocks(&x6, &x7, 8, m1);
    swap_blocks(&x0, &x2, 16, m2), swap_blocks(&x1, &x3, 16, m2);
    swap_blocks(&x4, &x6, 16, m2), swap_blocks(&x5, &x7, 16, m2);
    swap_blocks(&x0, &x4, 32, m4), swap_blocks(&x1, &x5, 32, m4);
    swap_blocks(&x2, &x6, 32, m4), swap_blocks(&x3, &x7, 32, m4);
    const uint64_t x[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
    if (rows == 8) { /* all but the last k group: a fixed count, the stores unrolled */
      for (size_t t = 0; t < 8; t++) memcpy(out + t * stride + j0, &x[t], sizeof(x[t]));
    } else {
      for (size_t t = 0; t < rows; t++) memcpy(out + t * stride + j0, &x[t], sizeof(x[t]));
    }
  }
}

/* The weights of the 4 packed blocks of outputs r0 .. r0+63 (NULL for a block past n). */
static void block_ptrs(const void *packed, size_t bsize, size_t blocks, size_t r0,
                       const uint8_t *src[BLOCKS]) {
  for (size_t b = 0; b < BLOCKS; b++) {
    const size_t blk = r0 / NR + b;
    src[b] = blk < blocks ? (const uint8_t *)packed + blk * bsize + HEAD : NULL;
  }
}

/* Prefetch for writing the line at 'out' of each of the 8 channel rows 8 after it, if below k. */
static void prefetch_rows(uint8_t *out, size_t stride, size_t c, size_t k) {
  if (c + 16 <= k)
    for (size_t t = 8; t < 16; t++) __builtin_prefetch(out + t * stride, 1);
}

bool npu_qcol8_from_packed(size_t n, size_t k, const void *packed, int8_t *cols_out) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  const size_t np = npu_qcol_np(n), blocks = (n + NR - 1) / NR;
  const size_t groups = (k + NPU_QS8_GEMM_KR - 1) / NPU_QS8_GEMM_KR; /* packed k groups */
  const size_t bsize = HEAD + GROUP * groups;
  static const uint32_t zero[NR]; /* a k group past the packed ones: weight 0 */
  for (size_t n0 = 0; n0 < np; n0 += TILE_N) {
    const size_t n1 = n0 + TILE_N < np ? n0 + TILE_N : np;
    for (size_t c0 = 0; c0 < k; c0 += TILE_K) {
      const size_t c1 = c0 + TILE_K < k ? c0 + TILE_K : k;
      for (size_t c = c0; c < c1; c += 8) { /* channels c .. c+7: k groups g, g + 1 */
        const size_t g = c / 4, rows = k - c < 8 ? k - c : 8;
        for (size_t r0 = n0; r0 < n1; r0 += NPU_QCOL_NR) {
          const uint8_t *src[BLOCKS];
          block_ptrs(packed, bsize, blocks, r0, src);
          uint8_t *out = (uint8_t *)cols_out + c * np + r0; /* channel c, output r0 */
          prefetch_rows(out, np, c, k);
          for (size_t b = 0; b < BLOCKS; b++) {
            uint32_t lo[NR], hi[NR]; /* k groups g, g + 1 of block b */
            if (src[b] == NULL) {    /* past n: weight 0 */
              memcpy(lo, zero, sizeof(lo)), memcpy(hi, zero, sizeof(hi));
            } else {
              const uint8_t *w = src[b] + g * GROUP;
              if (g + 2 * AHEAD + 1 < groups)
                __builtin_prefetch(w + 2 * AHEAD * GROUP),
                    __builtin_prefetch(w + (2 * AHEAD + 1) * GROUP);
              memcpy(lo, w, sizeof(lo));
              memcpy(hi, g + 1 < groups ? w + GROUP : (const uint8_t *)zero, sizeof(hi));
            }
            transpose_16x8(lo, hi, rows, out + b * NR, np);
          }
        }
      }
    }
  }
  return true;
}

bool npu_qcol4_from_packed(size_t n, size_t k, size_t block, const void *packed, uint8_t *cols_out,
                           uint8_t *q_out) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(block == 0 || block == NPU_QC4W_BLOCK);
  const size_t np = npu_qcol_np(n), rb = np / 2, blocks = (n + NR - 1) / NR;
  const size_t pairs = npu_qc4w_gemm_kp(k, block) / 8; /* packed nibble pairs */
  const size_t bsize = npu_qc4w_gemm_block_size(k, block);
  uint32_t eights[NR]; /* the nibble pair of a block past n: weight 0 */
  memset(eights, 0x88, sizeof(eights));
  for (size_t n0 = 0; n0 < np; n0 += 2 * TILE_N) {
    const size_t n1 = n0 + 2 * TILE_N < np ? n0 + 2 * TILE_N : np;
    for (size_t c0 = 0; c0 < k; c0 += TILE_K) {
      const size_t c1 = c0 + TILE_K < k ? c0 + TILE_K : k;
      for (size_t c = c0; c < c1; c += 8) { /* channels c .. c+7: nibble pair p */
        const size_t p = c / 8, rows = k - c < 8 ? k - c : 8;
        /* the bytes of pairs p and p + AHEAD in a block (block 32: after the scales of their
         * 32-k chunks) */
        const size_t at = block == 0 ? p * PAIR : p / 4 * (NR + 4 * PAIR) + NR + p % 4 * PAIR;
        const size_t ahead =
            block == 0 ? at + AHEAD * PAIR : at + AHEAD / 4 * (NR + 4 * PAIR); /* AHEAD % 4 = 0 */
        for (size_t r0 = n0; r0 < n1; r0 += NPU_QCOL_NR) {
          const uint8_t *src[BLOCKS];
          block_ptrs(packed, bsize, blocks, r0, src);
          uint8_t *out = cols_out + c * rb + r0 / 2; /* channel c, output r0 */
          if (r0 % (2 * NPU_QCOL_NR) == 0) prefetch_rows(out, rb, c, k);
          /* Byte jj < 32 of a channel's 32-byte chunk holds output r0 + jj in its low nibble
           * (block jj / 16) and r0 + 32 + jj in its high one (block 2 + jj / 16), both at
           * j = jj % 16: so the pair's bytes a, e of blocks b and b + 2 give, byte by byte,
           * channel c + t's output bytes (a & 0x0F) | e << 4 and channel c + 4 + t's
           * a >> 4 | (e & 0xF0), in the [16][4] order that transpose_16x8 turns. */
          for (size_t b = 0; b < 2; b++) {
            uint32_t wa[NR], we[NR], lo[NR], hi[NR]; /* word j: output j */
            for (size_t s = 0; s < 2; s++) {
              const uint8_t *w = src[b + 2 * s];
              if (w != NULL && p + AHEAD < pairs) __builtin_prefetch(w + ahead);
              memcpy(s == 0 ? wa : we, w != NULL ? w + at : (const uint8_t *)eights, sizeof(wa));
            }
            for (size_t j = 0; j < NR; j++) {
              lo[j] = (wa[j] & 0x0F0F0F0Fu) | (we[j] << 4 & 0xF0F0F0F0u);
              hi[j] = (wa[j] >> 4 & 0x0F0F0F0Fu) | (we[j] & 0xF0F0F0F0u);
            }
            transpose_16x8(lo, hi, rows, out + b * NR, rb);
          }
        }
      }
    }
  }
  if (block != 0) { /* the block scales, q_out[b * np + r], SR rows at a time */
    const size_t nb = (k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
    for (size_t r0 = 0; r0 < np; r0 += SR) {
      uint8_t scales[SR][MAX_SCALES];
      for (size_t j = 0; j < SR; j++) {
        if (r0 + j < n) npu_qc4w_gemm_unpack_scales(k, packed, r0 + j, scales[j]);
        else memset(scales[j], 0, nb);
      }
      for (size_t b = 0; b < nb; b++)
        for (size_t j = 0; j < SR; j++) q_out[b * np + r0 + j] = scales[j][b];
    }
  }
  return true;
}
