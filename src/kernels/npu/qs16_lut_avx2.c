/* npu_qs16_lut__avx2: the piecewise-linear int16 lookup of npu_ukernels.h, 16 elements per step in
 * two halves of 8 int32 lanes. One vpgatherdd per half reads, at byte offset 2i of the table, the
 * knot pair (t[i], t[i + 1]) as one 32-bit lane (i <= 511, so the read ends at t[512]); the two
 * knots are its sign-extended halves. The interpolation is the scalar formula in int32 lanes
 * (vpmulld, arithmetic shift), exact, so the results are bit for bit the scalar kernel's; the
 * last n % 16 elements go through the scalar kernel. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/avx2_util.h"

/* 8 inputs widened to int32 -> 8 outputs in int32 lanes. */
NPU_INLINE_AVX2 __m256i lut8(__m256i x, const int16_t *restrict table) {
  const __m256i u = _mm256_add_epi32(x, _mm256_set1_epi32(32768));
  const __m256i i = _mm256_srli_epi32(u, 7);
  const __m256i f = _mm256_and_si256(u, _mm256_set1_epi32(127));
  const __m256i pair = _mm256_i32gather_epi32((const int *)table, i, 2);
  const __m256i t0 = _mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16);
  const __m256i d = _mm256_sub_epi32(_mm256_srai_epi32(pair, 16), t0);
  const __m256i step = _mm256_add_epi32(_mm256_mullo_epi32(d, f), _mm256_set1_epi32(64));
  return _mm256_add_epi32(t0, _mm256_srai_epi32(step, 7));
}

NPU_TARGET_AVX2 void npu_qs16_lut__avx2(size_t n, const int16_t *x, int16_t *y,
                                        const int16_t *restrict table) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) { /* both loads before the store: in place is fine */
    const __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
    const __m256i lo = lut8(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)), table);
    const __m256i hi = lut8(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)), table);
    _mm256_storeu_si256((__m256i *)(y + i), npu_avx2_pack_s16(lo, hi));
  }
  npu_qs16_lut__scalar(n - i, x + i, y + i, table);
}

#endif /* __x86_64__ */
