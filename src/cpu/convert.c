/* Float <-> int8/int16 activations (see convert.h): a plain loop per conversion, and an AVX2 path
 * that takes eight values at a time with the same bits and leaves the tail to the loop. */
#include "cpu/convert.h"

#include <math.h>

/* sat(round(x / scale) + zero_point) into [qmin, qmax], NaN -> zero_point. */
static int32_t quantize_one(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  const float v = x / scale;
  if (isnan(v)) return zero_point;
  const double r = (double)roundf(v) + zero_point;
  return r < qmin ? qmin : r > qmax ? qmax : (int32_t)r;
}

void npu_quantize_s8__generic(const float *x, size_t n, float scale, int32_t zero_point,
                              int8_t *q_out) {
  for (size_t i = 0; i < n; i++)
    q_out[i] = (int8_t)quantize_one(x[i], scale, zero_point, INT8_MIN, INT8_MAX);
}

void npu_quantize_s16__generic(const float *x, size_t n, float scale, int32_t zero_point,
                               int16_t *q_out) {
  for (size_t i = 0; i < n; i++)
    q_out[i] = (int16_t)quantize_one(x[i], scale, zero_point, INT16_MIN, INT16_MAX);
}

void npu_dequantize_s8__generic(const int8_t *q, size_t n, float scale, int32_t zero_point,
                                float *x_out) {
  for (size_t i = 0; i < n; i++) x_out[i] = scale * (float)(q[i] - zero_point);
}

void npu_dequantize_s16__generic(const int16_t *q, size_t n, float scale, int32_t zero_point,
                                 float *x_out) {
  for (size_t i = 0; i < n; i++) x_out[i] = scale * (float)(q[i] - zero_point);
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* quantize_one of eight values, as int32. v = x / scale is the same IEEE division; it is clamped
 * to one step past [qmin, qmax] - zero_point (the result saturates either way) so that it converts
 * to int32, NaN taken as 0 (then zero_point). Rounding half away from zero: the truncation t plus
 * the sign of v where |v - t| >= 1/2 (v - t is exact). */
struct quantize_avx2 {
  __m256 scale, lo, hi;
  __m256i qlo, qhi, zero_point;
};

__attribute__((target("avx2"))) static inline struct quantize_avx2
quantize_avx2_make(float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  return (struct quantize_avx2){
      _mm256_set1_ps(scale), _mm256_set1_ps((float)(qmin - zero_point - 1)),
      _mm256_set1_ps((float)(qmax - zero_point + 1)), _mm256_set1_epi32(qmin - zero_point),
      _mm256_set1_epi32(qmax - zero_point), _mm256_set1_epi32(zero_point)};
}

__attribute__((target("avx2"))) static inline __m256i quantize8_avx2(const float *x,
                                                                    const struct quantize_avx2 *c) {
  __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), c->scale);
  const __m256 not_nan = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
  /* max(NaN, lo) is lo; the mask then makes it 0 */
  v = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, c->lo), c->hi), not_nan);
  const __m256i t = _mm256_cvttps_epi32(v);
  const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
  /* the masks are -1 where true */
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
  const __m256i down =
      _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ));
  const __m256i r = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
  return _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(r, c->qlo), c->qhi), c->zero_point);
}

/* Eight int32 (within int16) as int16, in order. */
__attribute__((target("avx2"))) static inline __m128i pack8_s16(__m256i r) {
  return _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2"))) static void quantize_s8_avx2(const float *x, size_t n, float scale,
                                                            int32_t zero_point, int8_t *q_out) {
  const struct quantize_avx2 c = quantize_avx2_make(scale, zero_point, INT8_MIN, INT8_MAX);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i r16 = pack8_s16(quantize8_avx2(x + i, &c));
    _mm_storel_epi64((__m128i *)(void *)(q_out + i), _mm_packs_epi16(r16, r16));
  }
  npu_quantize_s8__generic(x + i, n - i, scale, zero_point, q_out + i);
}

__attribute__((target("avx2"))) static void quantize_s16_avx2(const float *x, size_t n,
                                                             float scale, int32_t zero_point,
                                                             int16_t *q_out) {
  const struct quantize_avx2 c = quantize_avx2_make(scale, zero_point, INT16_MIN, INT16_MAX);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(void *)(q_out + i), pack8_s16(quantize8_avx2(x + i, &c)));
  npu_quantize_s16__generic(x + i, n - i, scale, zero_point, q_out + i);
}

/* scale * (float)(q - zero_point) of eight int32 codes. */
__attribute__((target("avx2"))) static inline __m256 dequantize8_avx2(__m256i q, __m256i zero_point,
                                                                      __m256 scale) {
  return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, zero_point)));
}

/* Eight codes, widened to int32. */
__attribute__((target("avx2"))) static inline __m256i widen8_s8(const int8_t *q) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)q));
}

__attribute__((target("avx2"))) static inline __m256i widen8_s16(const int16_t *q) {
  return _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(const void *)q));
}

/* The AVX2 dequantization of 'type' codes: eight at a time, the tail by the plain loop. */
#define DEQUANTIZE_AVX2(name, type, widen8, loop)                                                 \
  __attribute__((target("avx2"))) static void name(const type *q, size_t n, float scale,         \
                                                   int32_t zero_point, float *x_out) {           \
    const __m256i zp = _mm256_set1_epi32(zero_point);                                           \
    const __m256 s = _mm256_set1_ps(scale);                                                     \
    size_t i = 0;                                                                               \
    for (; i + 8 <= n; i += 8)                                                                  \
      _mm256_storeu_ps(x_out + i, dequantize8_avx2(widen8(q + i), zp, s));                      \
    loop(q + i, n - i, scale, zero_point, x_out + i);                                           \
  }
DEQUANTIZE_AVX2(dequantize_s8_avx2, int8_t, widen8_s8, npu_dequantize_s8__generic)
DEQUANTIZE_AVX2(dequantize_s16_avx2, int16_t, widen8_s16, npu_dequantize_s16__generic)

#define CONVERT_AVX2(call) \
  if (__builtin_cpu_supports("avx2")) { \
    call; \
    return; \
  }
#else
#define CONVERT_AVX2(call)
#endif

void npu_quantize_s8(const float *x, size_t n, float scale, int32_t zero_point, int8_t *q_out) {
  CONVERT_AVX2(quantize_s8_avx2(x, n, scale, zero_point, q_out));
  npu_quantize_s8__generic(x, n, scale, zero_point, q_out);
}

void npu_quantize_s16(const float *x, size_t n, float scale, int32_t zero_point, int16_t *q_out) {
  CONVERT_AVX2(quantize_s16_avx2(x, n, scale, zero_point, q_out));
  npu_quantize_s16__generic(x, n, scale, zero_point, q_out);
}

void npu_dequantize_s8(const int8_t *q, size_t n, float scale, int32_t zero_point, float *x_out) {
  CONVERT_AVX2(dequantize_s8_avx2(q, n, scale, zero_point, x_out));
  npu_dequantize_s8__generic(q, n, scale, zero_point, x_out);
}

void npu_dequantize_s16(const int16_t *q, size_t n, float scale, int32_t zero_point,
                        float *x_out) {
  CONVERT_AVX2(dequantize_s16_avx2(q, n, scale, zero_point, x_out));
  npu_dequantize_s16__generic(q, n, scale, zero_point, x_out);
}
