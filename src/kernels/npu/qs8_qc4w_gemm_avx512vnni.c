/* npu_qs8_qc4w_gemm__avx512vnni and npu_qs8_qc4w_gemm_qs16__avx512vnni: the w4a8 GEMM with
 * vpdpbusd, the scheme of npu_qs8_gemm__avx512vnni over the qc4w layout (block 0): x made unsigned
 * as x ^ 0x80 = x + 128 with the offset folded into the accumulator start,
 * bias - (x_zero_point + 128) * wsum (qs8_gemm_x86.h); each nibble pair decoded into the two int8
 * 4-k groups (vpand 0x0F / vpsrlw 4, minus 8), one vpdpbusd per group and 8 channels. No int32
 * wraps: every term is at most 255 * 8 and |acc| <= 2^30 + 255 * 8 * 32768 at every step.
 * Tiles of up to MR = 4 rows x 16 channels. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs8_gemm_x86.h"
#include "kernels/npu/vnni_util.h"

enum { NR = NPU_QS8_GEMM_NR, MR = 4, PAIR = 64 };

/* acc += x-group (4 bytes, broadcast, made unsigned) times the 16 channels w0 (0..7), w1 (8..15).
 */
#define GEMM_STEP(acc0, acc1, xword, w0, w1)                                                       \
  do {                                                                                             \
    const __m256i xb_ = _mm256_xor_si256(_mm256_set1_epi32(xword), flip);                          \
    acc0 = npu_vnni_dpbusd(acc0, xb_, w0);                                                         \
    acc1 = npu_vnni_dpbusd(acc1, xb_, w1);                                                         \
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

/* 'mr' (1..4, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_VNNI void gemm_tile(const int mr, size_t k, const int8_t *restrict x, size_t x_stride,
                               const struct npu_gemm_block *c, __m256i yzp, int out16,
                               void *restrict y, size_t y_stride, size_t nc) {
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const uint8_t *w = (const uint8_t *)c->w;
  const int8_t *x0 = x;
  const int8_t *x1 = mr > 1 ? x0 + x_stride : x0;
  const int8_t *x2 = mr > 2 ? x1 + x_stride : x1;
  const int8_t *x3 = mr > 3 ? x2 + x_stride : x2;
  __m256i a00 = c->init0, a01 = c->init1, a10 = c->init0, a11 = c->init1;
  __m256i a20 = c->init0, a21 = c->init1, a30 = c->init0, a31 = c->init1;
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
    if (mr > 3) PAIR_STEP(a30, a31, XLO(x3), XHI(x3));                                             \
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
  if (mr > 3) npu_gemm_store_row(a30, a31, c, yzp, out16, yb + 3 * y_stride * esize, nc);
}

NPU_INLINE_VNNI void gemm_vnni(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, void *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p, int out16) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  const size_t block_size = npu_qc4w_gemm_block_size(k, 0);
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  const __m256i x_offset = _mm256_set1_epi32(p->x_zero_point + 128);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  const uint8_t *blocks = w_packed;
  uint8_t *yb = y;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    struct npu_gemm_block c; /* the qc4w head is the int8 layout's: bias, wsum */
    npu_gemm_block_setup(blocks + n0 / NR * block_size, n0, nc, x_offset, p, &c);
    uint8_t *yn = yb + n0 * esize;
    for (size_t i = 0; i < m; i += MR) {
      const int8_t *xi = x + i * x_stride;
      uint8_t *yi = yn + i * y_stride * esize;
      switch (m - i < MR ? m - i : MR) {
      case 4: gemm_tile(4, k, xi, x_stride, &c, yzp, out16, yi, y_stride, nc); break;
      case 3: gemm_tile(3, k, xi, x_stride, &c, yzp, out16, yi, y_stride, nc); break;
      case 2: gemm_tile(2, k, xi, x_stride, &c, yzp, out16, yi, y_stride, nc); break;
      default: gemm_tile(1, k, xi, x_stride, &c, yzp, out16, yi, y_stride, nc); break;
      }
    }
  }
}

NPU_QS8_GEMM_X86_ENTRY(npu_qs8_qc4w_gemm__avx512vnni, int8_t, NPU_TARGET_VNNI, gemm_vnni, 0)
NPU_QS8_GEMM_X86_ENTRY(npu_qs8_qc4w_gemm_qs16__avx512vnni, int16_t, NPU_TARGET_VNNI, gemm_vnni, 1)

#endif /* __x86_64__ */
