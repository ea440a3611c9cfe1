/* npu_qs8_vadd__avx2, npu_qs16_vadd__avx2: 16 elements per step, widened to int32 lanes; the tail
 * goes through the scalar kernel (the same definition, so bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/avx2_util.h"

/* 8 widened inputs of each side -> 8 requantized outputs (before the zero point). */
NPU_INLINE_AVX2 __m256i add8(__m256i a, __m256i b, __m256i za, __m256i zb, __m128i left,
                             const struct npu_avx2_rq *rqa, const struct npu_avx2_rq *rqb,
                             const struct npu_avx2_rq *rqy, __m256i yzp) {
  const __m256i ta = npu_avx2_requantize(_mm256_sll_epi32(_mm256_sub_epi32(a, za), left), rqa);
  const __m256i tb = npu_avx2_requantize(_mm256_sll_epi32(_mm256_sub_epi32(b, zb), left), rqb);
  return npu_avx2_add_zp(npu_avx2_requantize(_mm256_add_epi32(ta, tb), rqy), yzp);
}

#define VADD_SETUP(p)                                                                              \
  const __m256i za = _mm256_set1_epi32((p)->a_zero_point);                                         \
  const __m256i zb = _mm256_set1_epi32((p)->b_zero_point);                                         \
  const __m256i yzp = _mm256_set1_epi32((p)->y_zero_point);                                        \
  const __m128i left = _mm_cvtsi32_si128((p)->left_shift);                                         \
  struct npu_avx2_rq rqa, rqb, rqy;                                                                \
  npu_avx2_rq_init1(&rqa, (p)->a_mult, (p)->a_shift);                                              \
  npu_avx2_rq_init1(&rqb, (p)->b_mult, (p)->b_shift);                                              \
  npu_avx2_rq_init1(&rqy, (p)->y_mult, (p)->y_shift)

NPU_TARGET_AVX2 void npu_qs8_vadd__avx2(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                                        const struct npu_qadd_params *restrict params) {
  VADD_SETUP(params);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128((const __m128i *)(a + i));
    const __m128i vb = _mm_loadu_si128((const __m128i *)(b + i));
    const __m256i y0 = add8(_mm256_cvtepi8_epi32(va), _mm256_cvtepi8_epi32(vb), za, zb, left, &rqa,
                            &rqb, &rqy, yzp);
    const __m256i y1 =
        add8(_mm256_cvtepi8_epi32(_mm_srli_si128(va, 8)),
             _mm256_cvtepi8_epi32(_mm_srli_si128(vb, 8)), za, zb, left, &rqa, &rqb, &rqy, yzp);
    _mm_storeu_si128((__m128i *)(y + i), npu_avx2_pack_s8(y0, y1));
  }
  if (i < n) npu_qs8_vadd__scalar(n - i, a + i, b + i, y + i, params);
}

NPU_TARGET_AVX2 void npu_qs16_vadd__avx2(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                                         const struct npu_qadd_params *restrict params) {
  VADD_SETUP(params);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)(a + i));
    const __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i));
    const __m256i y0 = add8(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(va)),
                            _mm256_cvtepi16_epi32(_mm256_castsi256_si128(vb)), za, zb, left, &rqa,
                            &rqb, &rqy, yzp);
    const __m256i y1 = add8(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(va, 1)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(vb, 1)), za, zb, left,
                            &rqa, &rqb, &rqy, yzp);
    _mm256_storeu_si256((__m256i *)(y + i), npu_avx2_pack_s16(y0, y1));
  }
  if (i < n) npu_qs16_vadd__scalar(n - i, a + i, b + i, y + i, params);
}

#endif /* __x86_64__ */
