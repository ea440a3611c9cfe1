/* npu_qs8_cols_down__avx512vnni: the down projection of the neuron bundles (npu_ukernels.h) on
 * 512-bit registers with AVX512-VNNI's vpdpwssd, bit-exact with npu_qs8_cols_down__scalar (each
 * product at most 255 * 127 = 32385, exact in int32; no int32 overflows in the ranges of
 * npu_ukernels.h, so every order of summation gives the same bits).
 *
 * Eight bundles per pass over the columns (four pairs), the accumulator read and written once per
 * pass and 32 columns. The bytes of two down columns a, b are interleaved (vpunpcklbw /
 * vpunpckhbw within 128-bit lanes) and sign-extended to 512 bits, so that each int32 lane holds
 * the int16 pair (a[c], b[c]) (columns 0-7 and 16-23 from the low halves, 8-15 and 24-31 from the
 * high ones), and vpdpwssd with the broadcast pair (coef_a, coef_b) adds coef_a a[c] + coef_b b[c];
 * the four pairs' sums are put back in column order (vshufi64x2) once per step. The 1 to 7
 * bundles left over go through one more pass with their coefficients and zeros (a missing bundle
 * repeats the first, times 0). A partial last step goes through a copy of acc's tail (acc is not
 * touched past k); the down columns are read up to kp. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/vnni_util.h"

enum { NB = 8 }; /* bundles per pass */

/* The int16 pair (coef_a, coef_b) in every int32 lane, a's in the low half. */
NPU_INLINE_VNNI __m512i coef_pair(int32_t a, int32_t b) {
  return _mm512_set1_epi32((int32_t)(((uint32_t)b << 16) | ((uint32_t)a & 0xFFFF)));
}

/* acc[0..31] += sum over the 4 pairs p of cp[p] times the columns c .. c + 31 of d[2p], d[2p+1]. */
NPU_INLINE_VNNI void down32(const int8_t *const d[NB], const __m512i cp[NB / 2], size_t c,
                            int32_t *acc) {
  __m512i lo = _mm512_setzero_si512(), hi = lo; /* columns 0-7, 16-23 and 8-15, 24-31 */
#pragma GCC unroll 4
  for (int p = 0; p < NB / 2; p++) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)(d[2 * p] + c));
    const __m256i vb = _mm256_loadu_si256((const __m256i *)(d[2 * p + 1] + c));
    lo = _mm512_dpwssd_epi32(lo, _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(va, vb)), cp[p]);
    hi = _mm512_dpwssd_epi32(hi, _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(va, vb)), cp[p]);
  }
  const __m512i s0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)); /* columns 0-15 */
  const __m512i s1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)); /* 16-31 */
  _mm512_storeu_si512(acc, _mm512_add_epi32(_mm512_loadu_si512(acc), s0));
  _mm512_storeu_si512(acc + 16, _mm512_add_epi32(_mm512_loadu_si512(acc + 16), s1));
}

/* One pass over the k columns with the NB down columns d and their coefficient pairs cp. */
NPU_INLINE_VNNI void down_pass(size_t k, const int8_t *const d[NB], const __m512i cp[NB / 2],
                               int32_t *acc) {
  const size_t kf = k & ~(size_t)31;
  size_t c = 0;
  for (; c < kf; c += 32) down32(d, cp, c, acc + c);
  if (c < k) { /* columns read up to c + 32 <= kp; acc through a copy of its tail */
    int32_t tail[32] = {0};
    memcpy(tail, acc + c, (k - c) * sizeof(int32_t));
    down32(d, cp, c, tail);
    memcpy(acc + c, tail, (k - c) * sizeof(int32_t));
  }
}

NPU_TARGET_VNNI void npu_qs8_cols_down__avx512vnni(size_t k, size_t count,
                                                   const int8_t *const *cols, const int32_t *coef,
                                                   int32_t *acc) {
  assert(count <= NPU_BUNDLE_DOWN_MAX_COUNT);
  for (size_t i = 0; i < count; i += NB) {
    const int8_t *d[NB];
    int32_t cf[NB];
    for (size_t j = 0; j < NB; j++) {
      const int here = i + j < count;
      d[j] = cols[here ? i + j : i];
      cf[j] = here ? coef[i + j] : 0;
      assert(cf[j] >= -255 && cf[j] <= 255);
    }
    __m512i cp[NB / 2];
    for (int p = 0; p < NB / 2; p++) cp[p] = coef_pair(cf[2 * p], cf[2 * p + 1]);
    down_pass(k, d, cp, acc);
  }
}

#endif /* __x86_64__ */
