/* The pieces of the x86 int8 GEMMs (qs8_gemm_avx2.c, qs8_gemm_avx512vnni.c) that do not depend on
 * how the products are formed: the contract checks, reading x in 4-byte k groups, the per-block
 * setup from the packed head (accumulator start, requantization constants), the requantize-and-
 * store of one row of 16 channels, and the two entry points over a kernel's inner function. AVX2
 * code (avx2_util.h): a caller with a wider target (AVX512) inlines it too. */
#ifndef NPU_KERNELS_NPU_QS8_GEMM_X86_H
#define NPU_KERNELS_NPU_QS8_GEMM_X86_H

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/npu_ukernels.h"

/* Assert the npu_ukernels.h contract on k, n_begin and the x zero point; return the packed block
 * size, 128 + 16 * kp bytes. */
static inline size_t npu_gemm_block_size(size_t k, size_t n_begin,
                                         const struct npu_qs8_gemm_params *p) {
  assert(k >= 1 && k <= 32768);
  assert(n_begin % NPU_QS8_GEMM_NR == 0);
  assert(p->x_zero_point >= INT8_MIN && p->x_zero_point <= INT8_MAX);
  (void)n_begin, (void)p; /* with NDEBUG */
  const size_t kp = (k + NPU_QS8_GEMM_KR - 1) / NPU_QS8_GEMM_KR * NPU_QS8_GEMM_KR;
  return 2 * NPU_QS8_GEMM_NR * sizeof(int32_t) + NPU_QS8_GEMM_NR * kp;
}

/* x[4g .. 4g+3] as one int32 (any alignment). */
static inline int32_t npu_gemm_load_word(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* The last, partial k group: 'rem' (1..3) bytes, zero-filled (the packed weights are 0 there, so
 * whatever the filler is worth after a zero-point offset, it adds nothing). */
static inline int32_t npu_gemm_load_tail(const int8_t *p, size_t rem) {
  int32_t v = 0;
  memcpy(&v, p, rem);
  return v;
}

/* What a block of 16 channels needs besides its weights. */
struct npu_gemm_block {
  __m256i init0, init1;        /* accumulator start: bias - x_offset * wsum */
  struct npu_avx2_rq rq0, rq1; /* requantization of channels 0..7, 8..15 */
  const int8_t *w;             /* packed weights: [kp / 4][16][4] */
};

/* Set up the packed block at 'block' (channels n0 .. n0 + nc - 1 valid, nc in [1, 16]) for
 * products with x + x_offset (x_offset: every lane the same, the kernel's; |x_offset| <= 255, so
 * x_offset * wsum stays below 255 * 127 * 32768 < 2^30 and the start below 2^31). */
NPU_INLINE_AVX2 void npu_gemm_block_setup(const uint8_t *block, size_t n0, size_t nc,
                                          __m256i x_offset,
                                          const struct npu_qs8_gemm_params *restrict p,
                                          struct npu_gemm_block *b) {
  enum { NR = NPU_QS8_GEMM_NR };
  const __m256i *head = (const __m256i *)block;
  b->init0 = _mm256_sub_epi32(_mm256_loadu_si256(head),
                              _mm256_mullo_epi32(x_offset, _mm256_loadu_si256(head + 2)));
  b->init1 = _mm256_sub_epi32(_mm256_loadu_si256(head + 1),
                              _mm256_mullo_epi32(x_offset, _mm256_loadu_si256(head + 3)));
  const int32_t *mult = p->mult + n0, *shift = p->shift + n0;
  int32_t mult_pad[NR] = {0}, shift_pad[NR] = {0}; /* a partial block pads with mult 0, shift 0 */
  if (nc < NR) {
    memcpy(mult_pad, mult, nc * sizeof(int32_t));
    memcpy(shift_pad, shift, nc * sizeof(int32_t));
    mult = mult_pad;
    shift = shift_pad;
  }
  npu_avx2_rq_init(&b->rq0, _mm256_loadu_si256((const __m256i *)mult),
                   _mm256_loadu_si256((const __m256i *)shift));
  npu_avx2_rq_init(&b->rq1, _mm256_loadu_si256((const __m256i *)(mult + 8)),
                   _mm256_loadu_si256((const __m256i *)(shift + 8)));
  b->w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
}

/* 16 int32 (q0: elements 0..7, q1: 8..15) saturated to int8 or, with out16, int16 at dst. */
NPU_INLINE_AVX2 void npu_gemm_store16(void *dst, __m256i q0, __m256i q1, int out16) {
  if (out16) _mm256_storeu_si256((__m256i *)dst, npu_avx2_pack_s16(q0, q1));
  else _mm_storeu_si128((__m128i *)dst, npu_avx2_pack_s8(q0, q1));
}

/* Requantize one row of 16 channels (acc0: 0..7, acc1: 8..15) with block b's constants, add the
 * output zero point, saturate and store the first nc (1..16) as int8 or, with out16, int16. */
NPU_INLINE_AVX2 void npu_gemm_store_row(__m256i acc0, __m256i acc1, const struct npu_gemm_block *b,
                                        __m256i yzp, int out16, void *y, size_t nc) {
  const __m256i q0 = npu_avx2_add_zp(npu_avx2_requantize(acc0, &b->rq0), yzp);
  const __m256i q1 = npu_avx2_add_zp(npu_avx2_requantize(acc1, &b->rq1), yzp);
  if (nc == NPU_QS8_GEMM_NR) {
    npu_gemm_store16(y, q0, q1, out16);
  } else { /* a partial block: only nc elements reach y */
    uint8_t tmp[NPU_QS8_GEMM_NR * sizeof(int16_t)];
    npu_gemm_store16(tmp, q0, q1, out16);
    memcpy(y, tmp, nc * (out16 ? sizeof(int16_t) : sizeof(int8_t)));
  }
}

/* Define the entry point 'name' of a GEMM variant (npu_ukernels.h signature, int8 or int16 'ytype'
 * outputs, function attribute 'target') over the variant's
 * inner(m, n_begin, n_end, k, x, x_stride, w_packed, y, y_stride, params, out16). */
#define NPU_QS8_GEMM_X86_ENTRY(name, ytype, target, inner, out16)                                  \
  target void name(size_t m, size_t n_begin, size_t n_end, size_t k, const int8_t *restrict x,     \
                   size_t x_stride, const void *restrict w_packed, ytype *restrict y,              \
                   size_t y_stride, const struct npu_qs8_gemm_params *restrict params) {           \
    inner(m, n_begin, n_end, k, x, x_stride, w_packed, y, y_stride, params, out16);                \
  }

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_QS8_GEMM_X86_H */
