/* npu_qs16_gemm_qs16__avx2: the w8a16 GEMM (npu_ukernels.h) in tiles of up to MR = 3 rows x 16
 * channels. Per 4-k group of the int8 layout, each 16-byte quarter (4 channels x 4 k) is
 * sign-extended to int16 (vpmovsxbw) and multiplied with the broadcast x group by vpmaddwd, two
 * products per int32 lane (qs16_gemm_x86.h). The int32 lanes are folded into int64 accumulators
 * every NPU_QS16_GEMM_KC = 512 k: a lane then holds at most 128 pair sums, each below
 * 2 * 32768 * 127 < 2^23, so below 2^30, and a channel's two lanes below 2^31 -- no partial sum
 * can overflow, and the int64 total is the exact sum of the scalar reference. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs16_gemm_x86.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 3 };

/* a[r][q] += x group 'xg[r]' times quarter q of the 64 weight bytes at w, for mr rows. */
NPU_INLINE_AVX2 void group_step(const int mr, __m256i a[MR][4], const __m256i xg[MR],
                                const int8_t *w) {
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    const __m256i wq = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * q)));
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) a[r][q] = _mm256_add_epi32(a[r][q], _mm256_madd_epi16(xg[r], wq));
  }
}

/* 'mr' (1..MR, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_AVX2 void gemm_tile(const int mr, size_t k, const int16_t *restrict x, size_t x_stride,
                               const uint8_t *block, size_t n0, size_t nc,
                               const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y,
                               size_t y_stride) {
  int64_t acc64[MR][16];
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++) npu_qs16_gemm_init(block, acc64[r]);
  const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
  for (size_t k0 = 0; k0 < k; k0 += NPU_QS16_GEMM_KC) {
    const size_t k1 = k - k0 < NPU_QS16_GEMM_KC ? k : k0 + NPU_QS16_GEMM_KC;
    __m256i a[MR][4], xg[MR];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) a[r][q] = _mm256_setzero_si256();
    size_t kk = k0;
    for (; kk + KR <= k1; kk += KR, w += NR * KR) {
#pragma GCC unroll 4
      for (int r = 0; r < mr; r++) xg[r] = npu_qs16_x4(x + r * x_stride + kk);
      group_step(mr, a, xg, w);
    }
    if (kk < k1) { /* the last, partial group of k (k1 == k here) */
#pragma GCC unroll 4
      for (int r = 0; r < mr; r++) xg[r] = npu_qs16_x4_tail(x + r * x_stride + kk, k1 - kk);
      group_step(mr, a, xg, w);
    }
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) npu_qs16_fold(a[r], acc64[r]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++) npu_qs16_gemm_store(acc64[r], n0, nc, p, y + r * y_stride);
}

NPU_TARGET_AVX2 void npu_qs16_gemm_qs16__avx2(size_t m, size_t n_begin, size_t n_end, size_t k,
                                              const int16_t *restrict x, size_t x_stride,
                                              const void *restrict w_packed, int16_t *restrict y,
                                              size_t y_stride,
                                              const struct npu_qs16_gemm_params *restrict p) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * ((k + KR - 1) / KR * KR);
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    size_t i = 0;
    for (; i + MR <= m; i += MR)
      gemm_tile(MR, k, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
    if (m - i == 2)
      gemm_tile(2, k, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
    else if (m - i == 1)
      gemm_tile(1, k, x + i * x_stride, x_stride, block, n0, nc, p, y + i * y_stride + n0,
                y_stride);
  }
}

#endif /* __x86_64__ */
