/* npu_qs8_qk_qs16__avx2: attention scores with 16-bit multiply-adds. Per (head, row) the query is
 * widened once (minus its zero point) to int16; each key is widened 16 (then 8) channels at a
 * time and multiplied with vpmaddwd; eight keys' partial sums are reduced together by a vphaddd
 * tree, requantized on 8 lanes and stored. Keys past the last block of eight and channels past the
 * last block of eight go through the same integer sums in plain C, so every variant computes the
 * same exact int32 sums (bit-exact by construction). Head dims above QK_MAX_HD use the scalar
 * kernel. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

#define QK_MAX_HD 256

/* Partial sums (8 int32 lanes to be added up) of (q - zq) . (k - zk) over the channels of
 * 8-blocks; the rest, hd % 8 channels, is added to lane 0. */
NPU_INLINE_AVX2 __m256i dot_partial(const int16_t *qw, const int8_t *kj, int32_t hd, __m256i zk16,
                                    int32_t zk) {
  __m256i acc = _mm256_setzero_si256();
  int32_t i = 0;
  for (; i + 16 <= hd; i += 16) {
    const __m256i kv =
        _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kj + i))), zk16);
    acc =
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(qw + i)), kv));
  }
  if (i + 8 <= hd) {
    const __m128i kv = _mm_sub_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(kj + i))),
                                     _mm256_castsi256_si128(zk16));
    const __m128i m = _mm_madd_epi16(_mm_load_si128((const __m128i *)(qw + i)), kv);
    acc = _mm256_add_epi32(acc, _mm256_zextsi128_si256(m));
    i += 8;
  }
  if (i < hd) {
    int32_t rest = 0;
    for (; i < hd; i++) rest += qw[i] * (kj[i] - zk);
    acc = _mm256_add_epi32(acc, _mm256_zextsi128_si256(_mm_cvtsi32_si128(rest)));
  }
  return acc;
}

/* Lane l of the result = the sum of the 8 lanes of a[l]. */
NPU_INLINE_AVX2 __m256i hsum8(const __m256i a[8]) {
  const __m256i t0 = _mm256_hadd_epi32(a[0], a[1]), t1 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i t2 = _mm256_hadd_epi32(a[4], a[5]), t3 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

NPU_INLINE_AVX2 int32_t hsum1(__m256i a) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

NPU_TARGET_AVX2 void npu_qs8_qk_qs16__avx2(const struct npu_attn_shape *restrict shape,
                                           const int8_t *restrict q, const int8_t *restrict k,
                                           int16_t *restrict s,
                                           const struct npu_qs8_qk_params *restrict p) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  if (hd > QK_MAX_HD) {
    npu_qs8_qk_qs16__scalar(shape, q, k, s, p);
    return;
  }
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  _Alignas(32) int16_t qw[QK_MAX_HD];
  const __m256i zk16 = _mm256_set1_epi16((int16_t)p->k_zero_point);
  const __m256i zs = _mm256_set1_epi32(p->s_zero_point);
  const __m256i masked = _mm256_set1_epi16(NPU_ATTN_MASKED);
  struct npu_avx2_rq rq;
  npu_avx2_rq_init1(&rq, p->mult, p->shift);
  for (int32_t h = 0; h < heads; h++) {
    const int8_t *kh = k + (size_t)(h / group) * (size_t)hd;
    for (int32_t t = 0; t < rows; t++) {
      const int8_t *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int16_t *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int32_t len = npu_attn_len_of(shape, t);
      for (int32_t i = 0; i < hd; i++) qw[i] = (int16_t)(qt[i] - p->q_zero_point);
      int32_t j = 0;
      for (; j + 8 <= len; j += 8) {
        __m256i a[8];
        for (int l = 0; l < 8; l++)
          a[l] = dot_partial(qw, kh + (size_t)(j + l) * kv_cols, hd, zk16, p->k_zero_point);
        const __m256i y = npu_avx2_add_zp(npu_avx2_requantize(hsum8(a), &rq), zs);
        _mm_storeu_si128((__m128i *)(row + j), _mm_packs_epi32(_mm256_castsi256_si128(y),
                                                               _mm256_extracti128_si256(y, 1)));
      }
      for (; j < len; j++) {
        const int32_t acc =
            hsum1(dot_partial(qw, kh + (size_t)j * kv_cols, hd, zk16, p->k_zero_point));
        row[j] = npu_requantize_s16(acc, p->mult, p->shift, p->s_zero_point);
      }
      for (; j + 16 <= ctx; j += 16) _mm256_storeu_si256((__m256i *)(row + j), masked);
      for (; j < ctx; j++) row[j] = NPU_ATTN_MASKED;
    }
  }
}

#endif /* __x86_64__ */
