/* npu_qs16_pv_qs8__avx2: attention output with 16-bit multiply-adds. Two keys at a time: their V
 * rows are widened to int16 (minus the zero point) and interleaved, so that vpmaddwd with the
 * broadcast pair of probabilities (p_j, p_j+1) adds both keys' terms per channel; 16 channels
 * (then 8) per pass, accumulators in registers for the whole row, then requantized on 8 lanes.
 * Channels past the last block of eight use the scalar sum; the int32 sums are exact, so the
 * result is bit-exact with npu_qs16_pv_qs8__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

/* The pair (p[j], p[j + 1]) in every 32-bit lane (p[j + 1] = 0 past the end). */
static inline int32_t prob_pair(const int16_t *pr, int32_t j, int32_t len) {
  const uint32_t lo = (uint16_t)pr[j], hi = j + 1 < len ? (uint16_t)pr[j + 1] : 0;
  return (int32_t)(lo | hi << 16);
}

NPU_TARGET_AVX2 void npu_qs16_pv_qs8__avx2(const struct npu_attn_shape *restrict shape,
                                           const int16_t *restrict p, const int8_t *restrict v,
                                           int8_t *restrict out,
                                           const struct npu_qs16_pv_params *restrict params) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  (void)ctx;
  const __m256i zv16 = _mm256_set1_epi16((int16_t)params->v_zero_point);
  const __m128i zv8 = _mm256_castsi256_si128(zv16);
  const __m256i zy = _mm256_set1_epi32(params->y_zero_point);
  struct npu_avx2_rq rq;
  npu_avx2_rq_init1(&rq, params->mult, params->shift);
  for (int32_t t = 0; t < rows; t++) {
    const int32_t len = npu_attn_len_of(shape, t);
    for (int32_t h = 0; h < heads; h++) {
      const int16_t *pr = p + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)shape->ctx;
      const int8_t *vh = v + (size_t)(h / group) * (size_t)hd;
      int8_t *o = out + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int32_t i0 = 0;
      for (; i0 + 16 <= hd; i0 += 16) {
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int32_t j = 0; j < len; j += 2) {
          const __m256i pp = _mm256_set1_epi32(prob_pair(pr, j, len));
          const int8_t *v0 = vh + (size_t)j * kv_cols + (size_t)i0;
          const int8_t *v1 = j + 1 < len ? v0 + kv_cols : v0; /* weight 0 past the end */
          const __m256i a =
              _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)v0)), zv16);
          const __m256i b =
              _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)v1)), zv16);
          lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), pp));
          hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), pp));
        }
        /* lo holds channels 0-3 | 8-11, hi 4-7 | 12-15 */
        const __m256i c0 = _mm256_permute2x128_si256(lo, hi, 0x20);
        const __m256i c1 = _mm256_permute2x128_si256(lo, hi, 0x31);
        const __m256i y0 = npu_avx2_add_zp(npu_avx2_requantize(c0, &rq), zy);
        const __m256i y1 = npu_avx2_add_zp(npu_avx2_requantize(c1, &rq), zy);
        _mm_storeu_si128((__m128i *)(o + i0), npu_avx2_pack_s8(y0, y1));
      }
      if (i0 + 8 <= hd) {
        __m256i acc = _mm256_setzero_si256();
        for (int32_t j = 0; j < len; j += 2) {
          const __m256i pp = _mm256_set1_epi32(prob_pair(pr, j, len));
          const int8_t *v0 = vh + (size_t)j * kv_cols + (size_t)i0;
          const int8_t *v1 = j + 1 < len ? v0 + kv_cols : v0;
          const __m128i a =
              _mm_sub_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)v0)), zv8);
          const __m128i b =
              _mm_sub_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)v1)), zv8);
          const __m256i ab = _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(ab, pp));
        }
        const __m256i y = npu_avx2_add_zp(npu_avx2_requantize(acc, &rq), zy);
        _mm_storel_epi64((__m128i *)(o + i0), npu_avx2_pack_s8(y, y));
        i0 += 8;
      }
      for (int32_t i = i0; i < hd; i++) {
        int32_t acc = 0;
        for (int32_t j = 0; j < len; j++)
          acc += pr[j] * (vh[(size_t)j * kv_cols + (size_t)i] - params->v_zero_point);
        o[i] = npu_requantize_s8(acc, params->mult, params->shift, params->y_zero_point);
      }
    }
  }
}

#endif /* __x86_64__ */
