/* npu_qs8_rows_dot__avx2: dot products of int8 rows with one int8 input (npu_ukernels.h), bit-exact
 * with npu_qs8_rows_dot__scalar (integer sums that cannot overflow int32 in the ranges of
 * npu_ukernels.h, so the order of summation does not matter).
 *
 * NR rows per pass, one accumulator each, 32 k per step: x - x_zero_point formed once per step in
 * int16 (vpmovsxbw, vpsubw: it lies in [-255, 255]) and shared by the rows, each row's 32 bytes
 * sign-extended (vpmovsxbw from memory) and vpmaddwd adds the pair products into int32 lanes (a
 * pair is at most 2 * 255 * 127, exact). The rows of a sparse step lie anywhere, so several are
 * streamed side by side (see bundle_avx2.c: one stream at a time stalls at each jump). The
 * accumulators are summed across lanes together (vphaddd), the rows left over by the passes go
 * four, then one, at a time. A last partial step of x goes through a zero-padded copy of x's tail
 * (x is never read past k); the padding meets the rows' zero padding (w = 0 past k), so it adds
 * 0. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/avx2_util.h"

enum { NR = 8 }; /* rows per pass */

/* acc += the pair sums of x (x0, x1) times the 32 int8 of w. */
NPU_INLINE_AVX2 __m256i dot32(__m256i acc, __m256i x0, __m256i x1, const int8_t *w) {
  const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
  const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
  return _mm256_add_epi32(acc,
                          _mm256_add_epi32(_mm256_madd_epi16(x0, w0), _mm256_madd_epi16(x1, w1)));
}

/* The lane sums of a[0..nr-1] (nr = 1, 4 or 8) into out[0..nr-1]. */
NPU_INLINE_AVX2 void store_sums(const int nr, const __m256i *a, int32_t *out) {
  if (nr == 1) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a[0]), _mm256_extracti128_si256(a[0], 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    out[0] = _mm_cvtsi128_si32(s);
    return;
  }
  /* [r0 r1 r2 r3 | r0 r1 r2 r3] partial sums of each 128-bit half */
  const __m256i h0 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  if (nr == 4) {
    _mm_storeu_si128((__m128i *)out,
                     _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1)));
    return;
  }
  const __m256i h1 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
  _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                                       _mm256_permute2x128_si256(h0, h1, 0x31)));
}

/* The dots of 'nr' (1, 4 or NR, a constant after inlining) rows r[0..nr-1] into out[0..nr-1]. */
NPU_INLINE_AVX2 void dot_rows(const int nr, size_t k, const int8_t *x, const int8_t *xtail,
                              __m256i zp, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)31;
  __m256i a[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = _mm256_setzero_si256();
  for (size_t c = 0; c < k; c += 32) { /* w read up to c + 32 <= kp: kp is a multiple of 64 */
    const int8_t *xp = c < kf ? x + c : xtail;
    const __m256i x0 =
        _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xp)), zp);
    const __m256i x1 =
        _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xp + 16))), zp);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) a[j] = dot32(a[j], x0, x1, r[j] + c);
  }
  store_sums(nr, a, out);
}

NPU_TARGET_AVX2 void npu_qs8_rows_dot__avx2(size_t k, const int8_t *x, int32_t x_zero_point,
                                            size_t count, const int8_t *const *rows, int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kf = k & ~(size_t)31; /* full 32-k steps of x */
  int8_t xtail[32] = {0};
  memcpy(xtail, x + kf, k - kf);
  const __m256i zp = _mm256_set1_epi16((int16_t)x_zero_point);
  size_t i = 0;
  for (; i + NR <= count; i += NR) dot_rows(NR, k, x, xtail, zp, rows + i, acc + i);
  if (i + 4 <= count) dot_rows(4, k, x, xtail, zp, rows + i, acc + i), i += 4;
  for (; i < count; i++) dot_rows(1, k, x, xtail, zp, rows + i, acc + i);
}

#endif /* __x86_64__ */
