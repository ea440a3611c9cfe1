/* npu_qs8_cols_down__avx2: the down projection of sparse decode over neuron bundles
 * (npu_ukernels.h), bit-exact with the scalar reference (integer sums, no int32 can overflow in the
 * ranges of npu_ukernels.h, so the order of summation does not matter).
 *
 * Four bundles per pass over the columns (two pairs), the accumulator read and written once
 * per pass. The bytes of two down columns a, b are interleaved (vpunpcklbw / vpunpckhbw) and
 * sign-extended, so that each int32 lane holds the int16 pair (a[c], b[c]) and vpmaddwd with the
 * broadcast pair (coef_a, coef_b) gives coef_a a[c] + coef_b b[c] in column order, exactly (each
 * product is at most 255 * 127 = 32385). A partial last step of 16 columns goes through a copy of
 * acc's tail (acc is not touched past k); the down columns are read up to kp. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/avx2_util.h"

/* The int16 pair (coef_a, coef_b) in every int32 lane, a's in the low half. */
NPU_INLINE_AVX2 __m256i coef_pair(int32_t a, int32_t b) {
  return _mm256_set1_epi32((int32_t)(((uint32_t)b << 16) | ((uint32_t)a & 0xFFFF)));
}

/* coef_a a[c] + coef_b b[c] for 16 columns: lo = columns 0..7, hi = 8..15. */
NPU_INLINE_AVX2 void pair16(const int8_t *a, const int8_t *b, __m256i cab, __m256i *lo,
                            __m256i *hi) {
  const __m128i va = _mm_loadu_si128((const __m128i *)a);
  const __m128i vb = _mm_loadu_si128((const __m128i *)b);
  *lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(va, vb)), cab);
  *hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(va, vb)), cab);
}

/* acc[0..15] += the 16 columns at offset c of the pairs (d[0], d[1]) and, with two pairs,
 * (d[2], d[3]). */
NPU_INLINE_AVX2 void down16(const int pairs, const int8_t *const d[4], size_t c, __m256i c01,
                            __m256i c23, int32_t *acc) {
  __m256i lo, hi;
  pair16(d[0] + c, d[1] + c, c01, &lo, &hi);
  if (pairs == 2) {
    __m256i lo2, hi2;
    pair16(d[2] + c, d[3] + c, c23, &lo2, &hi2);
    lo = _mm256_add_epi32(lo, lo2);
    hi = _mm256_add_epi32(hi, hi2);
  }
  _mm256_storeu_si256((__m256i *)acc,
                      _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)acc), lo));
  _mm256_storeu_si256((__m256i *)(acc + 8),
                      _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + 8)), hi));
}

/* One pass over the k columns with one or two pairs of down columns. */
NPU_INLINE_AVX2 void down_pass(const int pairs, size_t k, const int8_t *const d[4], __m256i c01,
                               __m256i c23, int32_t *acc) {
  const size_t kf = k & ~(size_t)15;
  size_t c = 0;
  for (; c < kf; c += 16) down16(pairs, d, c, c01, c23, acc + c);
  if (c < k) { /* columns read up to c + 16 <= kp; acc through a copy of its tail */
    int32_t tail[16] = {0};
    memcpy(tail, acc + c, (k - c) * sizeof(int32_t));
    down16(pairs, d, c, c01, c23, tail);
    memcpy(acc + c, tail, (k - c) * sizeof(int32_t));
  }
}

NPU_TARGET_AVX2 void npu_qs8_cols_down__avx2(size_t k, size_t count, const int8_t *const *cols,
                                             const int32_t *coef, int32_t *acc) {
  assert(count <= NPU_BUNDLE_DOWN_MAX_COUNT);
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const int8_t *const d[4] = {cols[i], cols[i + 1], cols[i + 2], cols[i + 3]};
    down_pass(2, k, d, coef_pair(coef[i], coef[i + 1]), coef_pair(coef[i + 2], coef[i + 3]), acc);
  }
  if (i < count) { /* 1 to 3 left: one or two pairs, a lone bundle paired with itself times 0 */
    const int8_t *const d0 = cols[i];
    const int8_t *const d1 = i + 1 < count ? cols[i + 1] : d0;
    const int8_t *const d2 = i + 2 < count ? cols[i + 2] : d0;
    const int8_t *const d[4] = {d0, d1, d2, d2};
    const __m256i c01 = coef_pair(coef[i], i + 1 < count ? coef[i + 1] : 0);
    const __m256i c23 = coef_pair(i + 2 < count ? coef[i + 2] : 0, 0);
    if (i + 2 < count) down_pass(2, k, d, c01, c23, acc);
    else down_pass(1, k, d, c01, c23, acc);
  }
}

#endif /* __x86_64__ */
