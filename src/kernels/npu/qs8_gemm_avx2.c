/* npu_qs8_gemm__avx2 and npu_qs8_gemm_qs16__avx2: int8 GEMM in tiles of MR = 3 rows x 16 channels
 * (6 accumulators: the loop stays in the 16 ymm registers, where 4 rows spill); decode (m = 1) is
 * the one-row tile, block after block, so that each thread reads its share of the weights as one
 * sequential stream (two blocks side by side, sharing each broadcast, both threads each streaming
 * half of a 256 MiB matrix ran at 18-23 GB/s, one block at 20-33, a plain read at 26-35). Per
 * 4-byte k group, x[i, 4g..4g+3] is broadcast to 8 lanes and vpmaddubsw multiplies |x| (u8) by w
 * with the sign of x applied (vpsignb): each pair sum is at most 2 * 128 * 127 < 2^15, so nothing
 * saturates; vpmaddwd by 1 then sums the pairs into one int32 per channel. The zero point enters
 * once per channel as bias - x_zero_point * wsum (precomputed in the packed block). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs8_gemm_x86.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 3 };

/* acc += x-group (4 bytes, broadcast) times the 16 channels w0 (0..7), w1 (8..15). */
#define GEMM_STEP(acc0, acc1, xword, w0, w1)                                                       \
  do {                                                                                             \
    const __m256i xb_ = _mm256_set1_epi32(xword);                                                  \
    const __m256i xa_ = _mm256_abs_epi8(xb_);                                                      \
    acc0 = _mm256_add_epi32(                                                                       \
        acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(xa_, _mm256_sign_epi8(w0, xb_)), ones));      \
    acc1 = _mm256_add_epi32(                                                                       \
        acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(xa_, _mm256_sign_epi8(w1, xb_)), ones));      \
  } while (0)

/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_AVX2 void gemm_tile(const int mr, size_t k, const int8_t *restrict x, size_t x_stride,
                               const struct npu_gemm_block *c, __m256i yzp, int out16,
                               void *restrict y, size_t y_stride, size_t nc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i init0 = c->init0, init1 = c->init1;
  const int8_t *w = c->w;
  const int8_t *x0 = x;
  const int8_t *x1 = mr > 1 ? x0 + x_stride : x0;
  const int8_t *x2 = mr > 2 ? x1 + x_stride : x1;
  const int8_t *x3 = mr > 3 ? x2 + x_stride : x2;
  __m256i a00 = init0, a01 = init1, a10 = init0, a11 = init1;
  __m256i a20 = init0, a21 = init1, a30 = init0, a31 = init1;
  const size_t kfull = k / KR * KR;
  size_t kk = 0;
  for (; kk < kfull; kk += KR) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
    w += NR * KR;
    GEMM_STEP(a00, a01, npu_gemm_load_word(x0 + kk), w0, w1);
    if (mr > 1) GEMM_STEP(a10, a11, npu_gemm_load_word(x1 + kk), w0, w1);
    if (mr > 2) GEMM_STEP(a20, a21, npu_gemm_load_word(x2 + kk), w0, w1);
    if (mr > 3) GEMM_STEP(a30, a31, npu_gemm_load_word(x3 + kk), w0, w1);
  }
  if (kk < k) {
    const size_t rem = k - kk;
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
    GEMM_STEP(a00, a01, npu_gemm_load_tail(x0 + kk, rem), w0, w1);
    if (mr > 1) GEMM_STEP(a10, a11, npu_gemm_load_tail(x1 + kk, rem), w0, w1);
    if (mr > 2) GEMM_STEP(a20, a21, npu_gemm_load_tail(x2 + kk, rem), w0, w1);
    if (mr > 3) GEMM_STEP(a30, a31, npu_gemm_load_tail(x3 + kk, rem), w0, w1);
  }
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  uint8_t *yb = y;
  npu_gemm_store_row(a00, a01, c, yzp, out16, yb, nc);
  if (mr > 1) npu_gemm_store_row(a10, a11, c, yzp, out16, yb + 1 * y_stride * esize, nc);
  if (mr > 2) npu_gemm_store_row(a20, a21, c, yzp, out16, yb + 2 * y_stride * esize, nc);
  if (mr > 3) npu_gemm_store_row(a30, a31, c, yzp, out16, yb + 3 * y_stride * esize, nc);
}

NPU_INLINE_AVX2 void gemm_avx2(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, void *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p, int out16) {
  const size_t block_size = npu_gemm_block_size(k, n_begin, p);
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  const __m256i zx = _mm256_set1_epi32(p->x_zero_point);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  const uint8_t *blocks = w_packed;
  uint8_t *yb = y;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    struct npu_gemm_block c;
    npu_gemm_block_setup(blocks + n0 / NR * block_size, n0, nc, zx, p, &c);
    uint8_t *yn = yb + n0 * esize;
    size_t i = 0;
    for (; i + MR <= m; i += MR)
      gemm_tile(MR, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
    switch (m - i) { /* the last rows: fewer than MR */
    case 3:
      gemm_tile(3, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
      break;
    case 2:
      gemm_tile(2, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
      break;
    case 1:
      gemm_tile(1, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
      break;
    default: break;
    }
  }
}

NPU_QS8_GEMM_X86_ENTRY(npu_qs8_gemm__avx2, int8_t, NPU_TARGET_AVX2, gemm_avx2, 0)
NPU_QS8_GEMM_X86_ENTRY(npu_qs8_gemm_qs16__avx2, int16_t, NPU_TARGET_AVX2, gemm_avx2, 1)

#endif /* __x86_64__ */
