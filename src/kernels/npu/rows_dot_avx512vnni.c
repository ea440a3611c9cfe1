/* npu_qs8_rows_dot__avx512vnni: dot products of int8 rows with one int8 input (npu_ukernels.h) with
 * AVX512-VNNI's vpdpbusd on 512-bit registers: 64 k per step, one aligned cache line of a row.
 * vpdpbusd multiplies unsigned by signed bytes, and x - x_zero_point lies in [-255, 255], so:
 *
 * Fast path, when every d = x[c] - x_zero_point fits int8 (always for x_zero_point = 0, checked
 * once per call): the row is made unsigned, u = w ^ 0x80 = w + 128 in [1, 255], and
 *   sum d w = sum u d - 128 sum d,
 * where sum d is one number per call: one vpdpbusd (and one vpxord) per row and step, the
 * d vector (x - x_zero_point with vpsubb, exact as checked) shared by the rows.
 * General path: x is made unsigned, x ^ 0x80 = x + 128, and
 *   sum d w = sum (x + 128) w - (x_zero_point + 128) sum w,
 * sum w per row by one more vpdpbusd against a vector of ones (as the NEON dot product kernels
 * do): two per row and step.
 * No int32 wraps, ever: every partial sum is at most 32768 * 255 * 128 < 2^31 in magnitude (u d),
 * 32768 * 255 * 127 (the (x + 128) w and the (x_zero_point + 128) w sums), and the results are
 * below 2^30; vpdpbusd's modular sums are then exact, so the results are bit-exact with
 * npu_qs8_rows_dot__scalar.
 * NR rows per pass, one accumulator each (two on the general path), summed across lanes together
 * at the end (vphaddd); the rows left over by the passes go four, then one, at a time. A last
 * partial step goes through a zero-padded copy of x's tail (d = 0 there on the fast path; x is
 * never read past k), which meets the rows' zero padding (w = 0 past k) and adds 0. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/vnni_util.h"

enum { NR = 8 }; /* rows per pass */

/* The 8 int32 lanes of the sum of a's two halves. */
NPU_INLINE_VNNI __m256i half_sum(__m512i a) {
  return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

/* The lane sums of a[0..nr-1] (nr = 1, 4 or 8) into out[0..nr-1]. */
NPU_INLINE_VNNI void store_sums(const int nr, const __m512i *a, int32_t *out) {
  if (nr == 1) {
    out[0] = _mm512_reduce_add_epi32(a[0]);
    return;
  }
  /* [r0 r1 r2 r3 | r0 r1 r2 r3] partial sums of each 128-bit half */
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(half_sum(a[0]), half_sum(a[1])),
                                       _mm256_hadd_epi32(half_sum(a[2]), half_sum(a[3])));
  if (nr == 4) {
    _mm_storeu_si128((__m128i *)out,
                     _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1)));
    return;
  }
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(half_sum(a[4]), half_sum(a[5])),
                                       _mm256_hadd_epi32(half_sum(a[6]), half_sum(a[7])));
  _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                                       _mm256_permute2x128_si256(h0, h1, 0x31)));
}

/* Fast path: sum_c (w + 128) d of 'nr' (1, 4 or NR, a constant after inlining) rows r[0..nr-1]
 * into out; 'dtail' the d of the last partial step, zero-padded. */
NPU_INLINE_VNNI void dot_rows_d8(const int nr, size_t k, const int8_t *x, __m512i zp,
                                 const int8_t *dtail, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)63;
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  __m512i a[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = _mm512_setzero_si512();
  for (size_t c = 0; c < k; c += 64) { /* rows read up to c + 64 <= kp */
    const __m512i d =
        c < kf ? _mm512_sub_epi8(_mm512_loadu_si512(x + c), zp) : _mm512_loadu_si512(dtail);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
      a[j] = _mm512_dpbusd_epi32(a[j], _mm512_xor_si512(_mm512_load_si512(r[j] + c), bias), d);
  }
  store_sums(nr, a, out);
}

/* General path: sum_c (x + 128) w - (x_zero_point + 128) sum_c w of rows r[0..nr-1] into out;
 * 'xtail' x's last partial step, zero-padded. */
NPU_INLINE_VNNI void dot_rows_x(const int nr, size_t k, const int8_t *x, __m512i zc,
                                const int8_t *xtail, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)63;
  const __m512i bias = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
  __m512i a[NR], s[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = s[j] = _mm512_setzero_si512();
  for (size_t c = 0; c < k; c += 64) {
    const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(c < kf ? x + c : xtail), bias);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
      const __m512i w = _mm512_load_si512(r[j] + c);
      a[j] = _mm512_dpbusd_epi32(a[j], u, w);
      s[j] = _mm512_dpbusd_epi32(s[j], ones, w);
    }
  }
  /* per lane sum (x + 128) w - (x_zero_point + 128) sum w = sum (x - x_zero_point) w, < 2^30 */
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = _mm512_sub_epi32(a[j], _mm512_mullo_epi32(s[j], zc));
  store_sums(nr, a, out);
}

NPU_TARGET_VNNI void npu_qs8_rows_dot__avx512vnni(size_t k, const int8_t *x, int32_t x_zero_point,
                                                  size_t count, const int8_t *const *rows,
                                                  int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kf = k & ~(size_t)63; /* full 64-k steps of x */
  /* whether every x - x_zero_point fits int8, and their sum (|sum| <= 32768 * 255) */
  int32_t dmin = 0, dmax = 0, dsum = 0;
  for (size_t c = 0; c < k; c++) {
    const int32_t d = x[c] - x_zero_point;
    dmin = d < dmin ? d : dmin;
    dmax = d > dmax ? d : dmax;
    dsum += d;
  }
  _Alignas(64) int8_t tail[64] = {0};
  size_t i = 0;
  if (dmin >= INT8_MIN && dmax <= INT8_MAX) {
    for (size_t c = kf; c < k; c++) tail[c - kf] = (int8_t)(x[c] - x_zero_point);
    const __m512i zp = _mm512_set1_epi8((char)x_zero_point);
    for (; i + NR <= count; i += NR) dot_rows_d8(NR, k, x, zp, tail, rows + i, acc + i);
    if (i + 4 <= count) dot_rows_d8(4, k, x, zp, tail, rows + i, acc + i), i += 4;
    for (; i < count; i++) dot_rows_d8(1, k, x, zp, tail, rows + i, acc + i);
    for (size_t j = 0; j < count; j++) acc[j] -= 128 * dsum; /* |128 dsum| < 2^30 */
  } else {
    memcpy(tail, x + kf, k - kf);
    const __m512i zc = _mm512_set1_epi32(x_zero_point + 128);
    for (; i + NR <= count; i += NR) dot_rows_x(NR, k, x, zc, tail, rows + i, acc + i);
    if (i + 4 <= count) dot_rows_x(4, k, x, zc, tail, rows + i, acc + i), i += 4;
    for (; i < count; i++) dot_rows_x(1, k, x, zc, tail, rows + i, acc + i);
  }
}

#endif /* __x86_64__ */
