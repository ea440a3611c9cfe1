/* Helpers of the conversions between float activations and the NPU's int8/int16 ones
 * (npu_quantize_s8, _s16, npu_dequantize_s8, _s16 in cpu_ukernels.h): the scalar rounding of one
 * value, and the AVX2 steps of eight values with the same bits. */
#ifndef NPU_KERNELS_CPU_CONVERT_UTIL_H
#define NPU_KERNELS_CPU_CONVERT_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_ukernels.h"

/* sat(round(x / scale) + zero_point) into [qmin, qmax], NaN -> zero_point. */
static inline int32_t npu_quantize_one(float x, float scale, int32_t zero_point, int32_t qmin,
                                       int32_t qmax) {
  const float v = x / scale;
  if (isnan(v)) return zero_point;
  const double r = (double)roundf(v) + zero_point;
  return r < qmin ? qmin : r > qmax ? qmax : (int32_t)r;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* npu_quantize_one of eight values, as int32. v = x / scale is the same IEEE division; it is
 * clamped to one step past [qmin, qmax] - zero_point (the result saturates either way) so that it
 * converts to int32, NaN taken as 0 (then zero_point). Rounding half away from zero: the
 * truncation t plus the sign of v where |v - t| >= 1/2 (v - t is exact). */
struct npu_quantize_avx2 {
  __m256 scale, lo, hi;
  __m256i qlo, qhi, zero_point;
};

__attribute__((target("avx2"))) static inline struct npu_quantize_avx2
npu_quantize_avx2_make(float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  return (struct npu_quantize_avx2){_mm256_set1_ps(scale),
                                    _mm256_set1_ps((float)(qmin - zero_point - 1)),
                                    _mm256_set1_ps((float)(qmax - zero_point + 1)),
                                    _mm256_set1_epi32(qmin - zero_point),
                                    _mm256_set1_epi32(qmax - zero_point),
                                    _mm256_set1_epi32(zero_point)};
}

__attribute__((target("avx2"))) static inline __m256i
npu_quantize8_avx2(const float *x, const struct npu_quantize_avx2 *c) {
  __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), c->scale);
  const __m256 not_nan = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
  /* max(NaN, lo) is lo; the mask then makes it 0 */
  v = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, c->lo), c->hi), not_nan);
  const __m256i t = _mm256_cvttps_epi32(v);
  const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
  /* the masks are -1 where true */
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
  const __m256i down = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ));
  const __m256i r = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
  return _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(r, c->qlo), c->qhi), c->zero_point);
}

/* Eight int32 (within int16) as int16, in order. */
__attribute__((target("avx2"))) static inline __m128i npu_pack8_s16(__m256i r) {
  return _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* x = scale * (float)(q - zero_point) of the codes q[0 .. i-1] (int16 if 's16', else int8), eight
 * at a time, i the largest multiple of 8 up to n; returns i (the caller's scalar variant converts
 * the rest). */
__attribute__((target("avx2"))) static inline size_t
npu_dequantize_avx2_blocks(const void *restrict q, bool s16, size_t n, float scale,
                           int32_t zero_point, float *restrict x_out) {
  const __m256i zp = _mm256_set1_epi32(zero_point);
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i c =
        s16 ? _mm256_cvtepi16_epi32(
                  _mm_loadu_si128((const __m128i *)(const void *)((const int16_t *)q + i)))
            : _mm256_cvtepi8_epi32(
                  _mm_loadl_epi64((const __m128i *)(const void *)((const int8_t *)q + i)));
    _mm256_storeu_ps(x_out + i, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(c, zp))));
  }
  return i;
}
#endif

#endif /* NPU_KERNELS_CPU_CONVERT_UTIL_H */
