/* npu_qs16_qc4w_gemm_qs16__avx2: the w4a16 GEMM (npu_ukernels.h), per channel or with 32-k block
 * scales, in tiles of up to MR = 3 rows x 16 channels. Per nibble pair (8 k), each 16-byte
 * quarter (4 channels x 4 k, two nibbles a byte) is zero-extended to int16 (vpmovzxbw); its low
 * nibbles minus 8 are the weights of the pair's first 4-k group, the high nibbles (vpsrlw 4)
 * minus 8 those of the second, each multiplied with its broadcast x group by vpmaddwd, two
 * products per int32 lane (qs16_gemm_x86.h). With block scales a 32-k chunk's four pairs go to
 * fresh int32 lanes, multiplied by the chunk's q of their channel (vpmulld) before they join the
 * span's lanes. Spans of NPU_QS16_GEMM_KC = 512 k are folded into int64 accumulators: a chunk
 * lane is below 8 * 2 * 32768 * 8 = 2^22, times q <= 15 below 2^26, a span's lane below 2^30 and
 * a channel's two lanes below 2^31 (per channel: a 32-k block dot below 2^23, times q below 2^27,
 * 16 blocks below 2^31), so no partial sum can overflow and the result is the scalar
 * reference's exact sum. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs16_gemm_x86.h"

enum { NR = NPU_QS8_GEMM_NR, MR = 3, PAIR = 64, CHUNK = NPU_QC4W_BLOCK };

/* a[r][q] += the nibble pair at w times the x groups xl[r] (low nibbles) and xh[r] (high). */
NPU_INLINE_AVX2 void pair_step(const int mr, __m256i a[MR][4], const __m256i xl[MR],
                               const __m256i xh[MR], const uint8_t *w) {
  const __m256i mask = _mm256_set1_epi16(0x0F), eight = _mm256_set1_epi16(8);
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    const __m256i raw = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * q)));
    const __m256i wl = _mm256_sub_epi16(_mm256_and_si256(raw, mask), eight);
    const __m256i wh = _mm256_sub_epi16(_mm256_srli_epi16(raw, 4), eight);
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
      a[r][q] = _mm256_add_epi32(
          a[r][q], _mm256_add_epi32(_mm256_madd_epi16(xl[r], wl), _mm256_madd_epi16(xh[r], wh)));
  }
}

/* The pairs of k range [kk, k1) (at most one partial pair, at the end of k) into a[][]: x groups
 * broadcast, weights from *w, which advances by the pairs read. */
NPU_INLINE_AVX2 void pairs(const int mr, __m256i a[MR][4], size_t kk, size_t k1,
                           const int16_t *restrict x, size_t x_stride, const uint8_t **w) {
  __m256i xl[MR], xh[MR];
  for (; kk + 8 <= k1; kk += 8, *w += PAIR) {
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
      xl[r] = npu_qs16_x4(x + r * x_stride + kk);
      xh[r] = npu_qs16_x4(x + r * x_stride + kk + 4);
    }
    pair_step(mr, a, xl, xh, *w);
  }
  if (kk < k1) {
    const size_t rem = k1 - kk; /* 1..7 */
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
      xl[r] = npu_qs16_x4_tail(x + r * x_stride + kk, rem < 4 ? rem : 4);
      xh[r] = npu_qs16_x4_tail(x + r * x_stride + kk + 4, rem > 4 ? rem - 4 : 0);
    }
    pair_step(mr, a, xl, xh, *w);
    *w += PAIR;
  }
}

/* The chunk scales of quarter q (channels 4q .. 4q+3) spread to its lane pairs. */
NPU_INLINE_AVX2 __m256i quarter_scales(const uint8_t *bscale, int q) {
  int32_t s4;
  memcpy(&s4, bscale + 4 * q, sizeof(s4));
  const __m256i s = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128(s4));
  return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

/* 'mr' (1..MR, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_AVX2 void gemm_tile(const int mr, size_t k, size_t blk, const int16_t *restrict x,
                               size_t x_stride, const uint8_t *block, size_t n0, size_t nc,
                               const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y,
                               size_t y_stride) {
  int64_t acc64[MR][16];
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++) npu_qs16_gemm_init(block, acc64[r]);
  const uint8_t *w = block + 2 * NR * sizeof(int32_t);
  for (size_t k0 = 0; k0 < k; k0 += NPU_QS16_GEMM_KC) {
    const size_t k1 = k - k0 < NPU_QS16_GEMM_KC ? k : k0 + NPU_QS16_GEMM_KC;
    __m256i a[MR][4];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) a[r][q] = _mm256_setzero_si256();
    if (blk == 0) {
      pairs(mr, a, k0, k1, x, x_stride, &w);
    } else {
      for (size_t c0 = k0; c0 < k1; c0 += CHUNK) {
        const uint8_t *bscale = w;
        w += NR;
        __m256i t[MR][4];
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
          for (int q = 0; q < 4; q++) t[r][q] = _mm256_setzero_si256();
        pairs(mr, t, c0, c0 + CHUNK < k1 ? c0 + CHUNK : k1, x, x_stride, &w);
        w = bscale + NR + 4 * PAIR; /* a partial last chunk is padded to 4 pairs */
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
          const __m256i s = quarter_scales(bscale, q);
#pragma GCC unroll 4
          for (int r = 0; r < mr; r++)
            a[r][q] = _mm256_add_epi32(a[r][q], _mm256_mullo_epi32(t[r][q], s));
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) npu_qs16_fold(a[r], acc64[r]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++) npu_qs16_gemm_store(acc64[r], n0, nc, p, y + r * y_stride);
}

NPU_TARGET_AVX2 void npu_qs16_qc4w_gemm_qs16__avx2(size_t m, size_t n_begin, size_t n_end, size_t k,
                                                   const int16_t *restrict x, size_t x_stride,
                                                   const void *restrict w_packed,
                                                   int16_t *restrict y, size_t y_stride,
                                                   const struct npu_qs16_gemm_params *restrict p) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  assert(p->block == 0 || p->block == NPU_QC4W_BLOCK);
  const size_t blk = (size_t)p->block, block_size = npu_qc4w_gemm_block_size(k, blk);
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    size_t i = 0;
    for (; i + MR <= m; i += MR)
      gemm_tile(MR, k, blk, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
    if (m - i == 2)
      gemm_tile(2, k, blk, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
    else if (m - i == 1)
      gemm_tile(1, k, blk, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
  }
}

#endif /* __x86_64__ */
