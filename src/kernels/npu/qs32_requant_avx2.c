/* npu_qs32_requant_qs8__avx2, npu_qs32_requant_qs16__avx2: 16 values per step with per-lane
 * constants; the tail goes through the scalar definition (bit-exact by construction). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

NPU_INLINE_AVX2 void requant16(const int32_t *acc, const int32_t *mult, const int32_t *shift,
                               __m256i zp, __m256i *q0, __m256i *q1) {
  struct npu_avx2_rq rq0, rq1;
  npu_avx2_rq_init(&rq0, _mm256_loadu_si256((const __m256i *)mult),
                   _mm256_loadu_si256((const __m256i *)shift));
  npu_avx2_rq_init(&rq1, _mm256_loadu_si256((const __m256i *)(mult + 8)),
                   _mm256_loadu_si256((const __m256i *)(shift + 8)));
  *q0 = npu_avx2_add_zp(npu_avx2_requantize(_mm256_loadu_si256((const __m256i *)acc), &rq0), zp);
  *q1 = npu_avx2_add_zp(npu_avx2_requantize(_mm256_loadu_si256((const __m256i *)(acc + 8)), &rq1),
                        zp);
}

NPU_TARGET_AVX2 void npu_qs32_requant_qs8__avx2(size_t n, const int32_t *restrict acc,
                                                const int32_t *restrict mult,
                                                const int32_t *restrict shift, int32_t zero_point,
                                                int8_t *restrict y) {
  assert(zero_point >= INT8_MIN && zero_point <= INT8_MAX);
  const __m256i zp = _mm256_set1_epi32(zero_point);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i q0, q1;
    requant16(acc + i, mult + i, shift + i, zp, &q0, &q1);
    _mm_storeu_si128((__m128i *)(y + i), npu_avx2_pack_s8(q0, q1));
  }
  for (; i < n; i++) y[i] = npu_requantize_s8(acc[i], mult[i], shift[i], zero_point);
}

NPU_TARGET_AVX2 void npu_qs32_requant_qs16__avx2(size_t n, const int32_t *restrict acc,
                                                 const int32_t *restrict mult,
                                                 const int32_t *restrict shift, int32_t zero_point,
                                                 int16_t *restrict y) {
  assert(zero_point >= INT16_MIN && zero_point <= INT16_MAX);
  const __m256i zp = _mm256_set1_epi32(zero_point);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i q0, q1;
    requant16(acc + i, mult + i, shift + i, zp, &q0, &q1);
    _mm256_storeu_si256((__m256i *)(y + i), npu_avx2_pack_s16(q0, q1));
  }
  for (; i < n; i++) y[i] = npu_requantize_s16(acc[i], mult[i], shift[i], zero_point);
}

#endif /* __x86_64__ */
