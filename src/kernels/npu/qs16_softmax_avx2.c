/* npu_qs16_softmax__avx2: the integer softmax of npu_ukernels.h on 8 lanes: the maximum with
 * vpmaxsw, the exponent's multiplier with the shared AVX2 requantization, the table with vpgatherdd
 * and the per-lane shift with vpsrlvd (which gives 0 for counts past 31, as the definition does),
 * the normalization with 32 x 32 -> 64-bit products. The reciprocal is one scalar division per row;
 * tails use the scalar steps, so the result is bit-exact with npu_qs16_softmax__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

/* e_j of 8 scores x (sign-extended to int32) against the maximum m. */
NPU_INLINE_AVX2 __m256i exp8(__m256i x, __m256i m, __m256i r, const struct npu_avx2_rq *rq) {
  const __m256i u = npu_avx2_requantize(_mm256_sub_epi32(m, x), rq); /* >= 0 */
  const __m256i n = _mm256_add_epi32(_mm256_srli_epi32(u, 8), r);
  const __m256i f = _mm256_and_si256(u, _mm256_set1_epi32(255));
  return _mm256_srlv_epi32(_mm256_i32gather_epi32(npu_exp2_q30, f, 4), n);
}

static inline int32_t exp1(int32_t x, int32_t m, int32_t r,
                           const struct npu_qs16_softmax_params *restrict params) {
  const int32_t u = npu_requantize(m - x, params->mult, params->shift);
  const int32_t n = (u >> 8) + r;
  return n < 31 ? npu_exp2_q30[u & 255] >> n : 0;
}

static int32_t bit_width(int32_t x) {
  int32_t r = 0;
  while (r < 31 && (x >> r) != 0) r++;
  return r;
}

NPU_TARGET_AVX2 void npu_qs16_softmax__avx2(const struct npu_attn_shape *restrict shape,
                                            const int16_t *restrict s, int16_t *restrict p,
                                            const struct npu_qs16_softmax_params *restrict params) {
  const int32_t rows = shape->rows, ctx = shape->ctx;
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  struct npu_avx2_rq rq;
  npu_avx2_rq_init1(&rq, params->mult, params->shift);
  const __m256i cap = _mm256_set1_epi32(INT16_MAX);
  for (int32_t h = 0; h < shape->heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      const size_t off = ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int16_t *x = s + off;
      int16_t *y = p + off;
      const int32_t len = npu_attn_len_of(shape, t), r = bit_width(len);
      assert(len < (1 << 24));
      /* the maximum */
      int32_t j = 0, m = x[0];
      if (len >= 16) {
        __m256i mv = _mm256_loadu_si256((const __m256i *)x);
        for (j = 16; j + 16 <= len; j += 16)
          mv = _mm256_max_epi16(mv, _mm256_loadu_si256((const __m256i *)(x + j)));
        __m128i m8 = _mm_max_epi16(_mm256_castsi256_si128(mv), _mm256_extracti128_si256(mv, 1));
        m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0x4E));
        m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0xB1));
        m8 = _mm_max_epi16(m8, _mm_srli_epi32(m8, 16));
        m = (int16_t)_mm_cvtsi128_si32(m8);
      }
      for (; j < len; j++) m = x[j] > m ? x[j] : m;
      /* the sum of the exponentials */
      const __m256i mv = _mm256_set1_epi32(m), rv = _mm256_set1_epi32(r);
      __m256i acc = _mm256_setzero_si256();
      for (j = 0; j + 8 <= len; j += 8) {
        const __m256i xv = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(x + j)));
        acc = _mm256_add_epi32(acc, exp8(xv, mv, rv, &rq));
      }
      __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
      a4 = _mm_add_epi32(a4, _mm_shuffle_epi32(a4, 0x4E));
      a4 = _mm_add_epi32(a4, _mm_shuffle_epi32(a4, 0xB1));
      int32_t sum = _mm_cvtsi128_si32(a4);
      for (; j < len; j++) sum += exp1(x[j], m, r, params);
      /* normalize */
      const int64_t inv = ((int64_t)1 << (60 - r)) / sum;
      const int32_t shift = 45 - r;
      const __m256i invv = _mm256_set1_epi64x(inv);
      const __m256i round = _mm256_set1_epi64x((int64_t)1 << (shift - 1));
      const __m128i count = _mm_cvtsi32_si128(shift);
      for (j = 0; j + 8 <= len; j += 8) {
        const __m256i xv = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(x + j)));
        const __m256i e = exp8(xv, mv, rv, &rq);
        const __m256i even =
            _mm256_srl_epi64(_mm256_add_epi64(_mm256_mul_epu32(e, invv), round), count);
        const __m256i odd = _mm256_srl_epi64(
            _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(e, 32), invv), round), count);
        const __m256i q =
            _mm256_min_epi32(_mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA), cap);
        _mm_storeu_si128((__m128i *)(y + j), _mm_packs_epi32(_mm256_castsi256_si128(q),
                                                             _mm256_extracti128_si256(q, 1)));
      }
      for (; j < len; j++) {
        const int64_t q =
            ((int64_t)exp1(x[j], m, r, params) * inv + ((int64_t)1 << (shift - 1))) >> shift;
        y[j] = (int16_t)(q < INT16_MAX ? q : INT16_MAX);
      }
      const __m256i zero = _mm256_setzero_si256();
      for (; j + 16 <= ctx; j += 16) _mm256_storeu_si256((__m256i *)(y + j), zero);
      for (; j < ctx; j++) y[j] = 0;
    }
  }
}

#endif /* __x86_64__ */
