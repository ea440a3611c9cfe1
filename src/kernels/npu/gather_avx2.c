/* npu_qs8_gather__avx2, npu_qs8_gather_qs16__avx2: 16 columns per step with the row's constants
 * broadcast; the tail of a row uses the scalar definition (bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

NPU_INLINE_AVX2 void gather(size_t n_ids, const int32_t *restrict ids, size_t n_rows, size_t cols,
                            const int8_t *restrict table, void *restrict y, size_t y_stride,
                            const struct npu_qs8_gather_params *restrict p, int out16) {
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  for (size_t t = 0; t < n_ids; t++) {
    assert(ids[t] >= 0 && (size_t)ids[t] < n_rows);
    const size_t r = (size_t)ids[t];
    const int8_t *row = table + r * cols;
    int8_t *y8 = (int8_t *)y + t * y_stride;
    int16_t *y16 = (int16_t *)y + t * y_stride;
    struct npu_avx2_rq rq;
    npu_avx2_rq_init1(&rq, p->mult[r], p->shift[r]);
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m128i v = _mm_loadu_si128((const __m128i *)(row + c));
      const __m256i q0 = npu_avx2_add_zp(npu_avx2_requantize(_mm256_cvtepi8_epi32(v), &rq), yzp);
      const __m256i q1 = npu_avx2_add_zp(
          npu_avx2_requantize(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)), &rq), yzp);
      if (out16) _mm256_storeu_si256((__m256i *)(y16 + c), npu_avx2_pack_s16(q0, q1));
      else _mm_storeu_si128((__m128i *)(y8 + c), npu_avx2_pack_s8(q0, q1));
    }
    for (; c < cols; c++) {
      if (out16) y16[c] = npu_requantize_s16(row[c], p->mult[r], p->shift[r], p->y_zero_point);
      else y8[c] = npu_requantize_s8(row[c], p->mult[r], p->shift[r], p->y_zero_point);
    }
  }
  (void)n_rows;
}

NPU_TARGET_AVX2 void npu_qs8_gather__avx2(size_t n_ids, const int32_t *restrict ids, size_t n_rows,
                                          size_t cols, const int8_t *restrict table,
                                          int8_t *restrict y, size_t y_stride,
                                          const struct npu_qs8_gather_params *restrict params) {
  gather(n_ids, ids, n_rows, cols, table, y, y_stride, params, 0);
}

NPU_TARGET_AVX2 void
npu_qs8_gather_qs16__avx2(size_t n_ids, const int32_t *restrict ids, size_t n_rows, size_t cols,
                          const int8_t *restrict table, int16_t *restrict y, size_t y_stride,
                          const struct npu_qs8_gather_params *restrict params) {
  gather(n_ids, ids, n_rows, cols, table, y, y_stride, params, 1);
}

#endif /* __x86_64__ */
