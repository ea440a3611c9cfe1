/* npu_qs8_vmul__avx2, npu_qs16_vmul__avx2: 16 elements per step, int32 products; the tail goes
 * through the scalar kernel (same definition, bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"

NPU_TARGET_AVX2 void npu_qs8_vmul__avx2(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                                        const struct npu_qmul_params *restrict p) {
  const __m256i za = _mm256_set1_epi32(p->a_zero_point);
  const __m256i zb = _mm256_set1_epi32(p->b_zero_point);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  struct npu_avx2_rq rq;
  npu_avx2_rq_init1(&rq, p->y_mult, p->y_shift);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128((const __m128i *)(a + i));
    const __m128i vb = _mm_loadu_si128((const __m128i *)(b + i));
    const __m256i p0 = _mm256_mullo_epi32(_mm256_sub_epi32(_mm256_cvtepi8_epi32(va), za),
                                          _mm256_sub_epi32(_mm256_cvtepi8_epi32(vb), zb));
    const __m256i p1 =
        _mm256_mullo_epi32(_mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(va, 8)), za),
                           _mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(vb, 8)), zb));
    const __m256i y0 = npu_avx2_add_zp(npu_avx2_requantize(p0, &rq), yzp);
    const __m256i y1 = npu_avx2_add_zp(npu_avx2_requantize(p1, &rq), yzp);
    _mm_storeu_si128((__m128i *)(y + i), npu_avx2_pack_s8(y0, y1));
  }
  if (i < n) npu_qs8_vmul__scalar(n - i, a + i, b + i, y + i, p);
}

NPU_TARGET_AVX2 void npu_qs16_vmul__avx2(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                                         const struct npu_qmul_params *restrict p) {
  assert(p->a_zero_point == 0 && p->b_zero_point == 0);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  struct npu_avx2_rq rq;
  npu_avx2_rq_init1(&rq, p->y_mult, p->y_shift);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)(a + i));
    const __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i));
    const __m256i p0 = _mm256_mullo_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(va)),
                                          _mm256_cvtepi16_epi32(_mm256_castsi256_si128(vb)));
    const __m256i p1 = _mm256_mullo_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(va, 1)),
                                          _mm256_cvtepi16_epi32(_mm256_extracti128_si256(vb, 1)));
    const __m256i y0 = npu_avx2_add_zp(npu_avx2_requantize(p0, &rq), yzp);
    const __m256i y1 = npu_avx2_add_zp(npu_avx2_requantize(p1, &rq), yzp);
    _mm256_storeu_si256((__m256i *)(y + i), npu_avx2_pack_s16(y0, y1));
  }
  if (i < n) npu_qs16_vmul__scalar(n - i, a + i, b + i, y + i, p);
}

#endif /* __x86_64__ */
