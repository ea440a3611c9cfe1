/* npu_qs8_qc4w_gemm__avx2 and npu_qs8_qc4w_gemm_qs16__avx2: the w4a8 GEMM, npu_qs8_gemm__avx2's
 * scheme over the qc4w layout (block 0): tiles of MR = 3 rows x 16 channels, the zero point
 * folded into the accumulator start (bias - x_zero_point * wsum, qs8_gemm_x86.h). Each nibble
 * pair (64 bytes, 8 k x 16 channels) is decoded into the two 4-k groups of the int8 layout: low
 * nibbles (vpand 0x0F) and high nibbles (vpsrlw 4, vpand) minus 8 (vpsubb). Each group then goes
 * through the int8 kernel's step: vpmaddubsw of |x| (u8) by w with the sign of x (vpsignb), pair
 * sums at most 2 * 128 * 8 (no saturation), vpmaddwd by 1 into int32; no int32 sum can
 * overflow (|acc| <= 2^30 + 255 * 8 * 32768). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs8_gemm_x86.h"

enum { NR = NPU_QS8_GEMM_NR, MR = 3, PAIR = 64 };

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

/* One row's nibble pair: x words xl (k = 8p .. 8p+3) and xh (8p+4 .. 8p+7). */
#define PAIR_STEP(acc0, acc1, xl, xh)                                                              \
  do {                                                                                             \
    GEMM_STEP(acc0, acc1, xl, l0, l1);                                                             \
    GEMM_STEP(acc0, acc1, xh, h0, h1);                                                             \
  } while (0)

/* x[kk .. kk+3] and x[kk+4 .. kk+7] of one row's last pair: its first 'rem' (1..7) values,
 * zero-filled (the packed weights are 0 past k, so the filler adds nothing). */
static inline int32_t word_lo(const int8_t *p, size_t rem) {
  return rem >= 4 ? npu_gemm_load_word(p) : npu_gemm_load_tail(p, rem);
}
static inline int32_t word_hi(const int8_t *p, size_t rem) {
  return rem >= 8 ? npu_gemm_load_word(p + 4) : rem > 4 ? npu_gemm_load_tail(p + 4, rem - 4) : 0;
}

/* 'mr' (1..3, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_AVX2 void gemm_tile(const int mr, size_t k, const int8_t *restrict x, size_t x_stride,
                               const struct npu_gemm_block *c, __m256i yzp, int out16,
                               void *restrict y, size_t y_stride, size_t nc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const uint8_t *w = (const uint8_t *)c->w;
  const int8_t *x0 = x;
  const int8_t *x1 = mr > 1 ? x0 + x_stride : x0;
  const int8_t *x2 = mr > 2 ? x1 + x_stride : x1;
  __m256i a00 = c->init0, a01 = c->init1, a10 = c->init0, a11 = c->init1;
  __m256i a20 = c->init0, a21 = c->init1;
  /* One nibble pair at w: decode, then each row's two x words from XLO(p), XHI(p). */
#define TILE_PAIR(XLO, XHI)                                                                        \
  do {                                                                                             \
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)w);                                     \
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 32));                              \
    const __m256i l0 = _mm256_sub_epi8(_mm256_and_si256(v0, mask), eight);                         \
    const __m256i l1 = _mm256_sub_epi8(_mm256_and_si256(v1, mask), eight);                         \
    const __m256i h0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v0, 4), mask), eight);   \
    const __m256i h1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v1, 4), mask), eight);   \
    PAIR_STEP(a00, a01, XLO(x0), XHI(x0));                                                         \
    if (mr > 1) PAIR_STEP(a10, a11, XLO(x1), XHI(x1));                                             \
    if (mr > 2) PAIR_STEP(a20, a21, XLO(x2), XHI(x2));                                             \
  } while (0)
#define FULL_LO(p) npu_gemm_load_word((p) + kk)
#define FULL_HI(p) npu_gemm_load_word((p) + kk + 4)
#define TAIL_LO(p) word_lo((p) + kk, k - kk)
#define TAIL_HI(p) word_hi((p) + kk, k - kk)
  size_t kk = 0;
  for (; kk + 8 <= k; kk += 8, w += PAIR) TILE_PAIR(FULL_LO, FULL_HI);
  if (kk < k) TILE_PAIR(TAIL_LO, TAIL_HI);
#undef TILE_PAIR
#undef FULL_LO
#undef FULL_HI
#undef TAIL_LO
#undef TAIL_HI
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  uint8_t *yb = y;
  npu_gemm_store_row(a00, a01, c, yzp, out16, yb, nc);
  if (mr > 1) npu_gemm_store_row(a10, a11, c, yzp, out16, yb + 1 * y_stride * esize, nc);
  if (mr > 2) npu_gemm_store_row(a20, a21, c, yzp, out16, yb + 2 * y_stride * esize, nc);
}

NPU_INLINE_AVX2 void gemm_avx2(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, void *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p, int out16) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  const size_t block_size = npu_qc4w_gemm_block_size(k, 0);
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  const __m256i zx = _mm256_set1_epi32(p->x_zero_point);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  const uint8_t *blocks = w_packed;
  uint8_t *yb = y;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    struct npu_gemm_block c; /* the qc4w head is the int8 layout's: bias, wsum */
    npu_gemm_block_setup(blocks + n0 / NR * block_size, n0, nc, zx, p, &c);
    uint8_t *yn = yb + n0 * esize;
    size_t i = 0;
    for (; i + MR <= m; i += MR)
      gemm_tile(MR, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
    if (m - i == 2)
      gemm_tile(2, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
    else if (m - i == 1)
      gemm_tile(1, k, x + i * x_stride, x_stride, &c, yzp, out16, yn + i * y_stride * esize,
                y_stride, nc);
  }
}

NPU_QS8_GEMM_X86_ENTRY(npu_qs8_qc4w_gemm__avx2, int8_t, NPU_TARGET_AVX2, gemm_avx2, 0)
NPU_QS8_GEMM_X86_ENTRY(npu_qs8_qc4w_gemm_qs16__avx2, int16_t, NPU_TARGET_AVX2, gemm_avx2, 1)

#endif /* __x86_64__ */
