/* npu_qs8_bundle_dot__avx2, npu_qs8_bundle_down__avx2: the neuron-bundle kernels of sparse decode
 * (ukernels.h), bit-exact with the scalar references (integer sums, no int32 can overflow in the
 * ranges of ukernels.h, so the order of summation does not matter).
 *
 * Dot: four bundles per pass (8 accumulators, 2 x registers: within the 16 ymm), each bundle's
 * gate and up rows (2 kp contiguous bytes) read as one stream, 32 k per step. The bundles of a
 * sparse step lie anywhere, so one stream at a time stalls at each jump: at k = 2048, 4096
 * shuffled bundles (16 MiB read), one bundle per pass ran at 7.5-10 GB/s, two at 11.5-13, four at
 * 19-22 (one core of this 2-core machine, noisy). Per step, x - x_zero_point is formed in int16
 * (vpmovsxbw, vpsubw: it lies in [-255, 255]), each weight row sign-extended the same way
 * (vpmovsxbw from memory) and vpmaddwd adds the pair products into int32 lanes (a pair is at most
 * 2 * 255 * 127, exact; vpmaddwd does not saturate but for -32768 * -32768 pairs, which cannot
 * occur). The x conversion is shared by the eight rows. A last partial step of x goes through a
 * zero-padded copy of x's tail (x is never read past k); the padding meets the bundle's zero
 * padding (w = 0 past k), so it adds 0.
 *
 * Down: four bundles per pass over the columns (two pairs), the accumulator read and written once
 * per pass. The bytes of two down columns a, b are interleaved (vpunpcklbw / vpunpckhbw) and
 * sign-extended, so that each int32 lane holds the int16 pair (a[c], b[c]) and vpmaddwd with the
 * broadcast pair (coef_a, coef_b) gives coef_a a[c] + coef_b b[c] in column order, exactly (each
 * product is at most 255 * 127 = 32385). A partial last step of 16 columns goes through a copy of
 * acc's tail (acc is not touched past k); the down columns are read up to kp. */
#include "kernels/npu/ukernels.h"

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/avx2_util.h"

enum { NB = 4 }; /* bundles per dot pass */

/* 32 int8 of x from 'xp', minus the zero point, as int16 (x0: 0..15, x1: 16..31). */
NPU_INLINE_AVX2 void load_x32(const int8_t *xp, __m256i zp, __m256i *x0, __m256i *x1) {
  *x0 = _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xp)), zp);
  *x1 = _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xp + 16))), zp);
}

/* acc += the pair sums of x (x0, x1) times the 32 int8 of w. */
NPU_INLINE_AVX2 __m256i dot32(__m256i acc, __m256i x0, __m256i x1, const int8_t *w) {
  const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
  const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
  return _mm256_add_epi32(acc,
                          _mm256_add_epi32(_mm256_madd_epi16(x0, w0), _mm256_madd_epi16(x1, w1)));
}

/* [gate, up] of 'ag', 'au' (8 lanes each) into out[0..1]. */
NPU_INLINE_AVX2 void store_sums(__m256i ag, __m256i au, int32_t *out) {
  const __m256i h = _mm256_hadd_epi32(ag, au); /* [g01 g23 u01 u23 | g45 g67 u45 u67] */
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_hadd_epi32(s, s); /* [gate up gate up] */
  _mm_storel_epi64((__m128i *)out, s);
}

/* The dot of 'nb' (1 or NB, a constant after inlining) bundles b[0..nb-1] into out[0 .. 2 nb - 1].
 */
NPU_INLINE_AVX2 void dot_bundles(const int nb, size_t k, size_t kp, const int8_t *x,
                                 const int8_t *xtail, __m256i zp, const int8_t *const *b,
                                 int32_t *out) {
  const size_t kf = k & ~(size_t)31;
  __m256i a[2 * NB];
  for (int j = 0; j < 2 * nb; j++) a[j] = _mm256_setzero_si256();
  for (size_t c = 0; c < k; c += 32) { /* w read up to c + 32 <= kp: kp is a multiple of 64 */
    __m256i x0, x1;
    load_x32(c < kf ? x + c : xtail, zp, &x0, &x1);
    for (int j = 0; j < nb; j++) {
      a[2 * j] = dot32(a[2 * j], x0, x1, b[j] + c);
      a[2 * j + 1] = dot32(a[2 * j + 1], x0, x1, b[j] + kp + c);
    }
  }
  for (int j = 0; j < nb; j++) store_sums(a[2 * j], a[2 * j + 1], out + 2 * j);
}

NPU_TARGET_AVX2 void npu_qs8_bundle_dot__avx2(size_t k, const int8_t *x, int32_t x_zero_point,
                                              size_t count, const int8_t *const *bundles,
                                              int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kp = npu_bundle_kp(k), kf = k & ~(size_t)31; /* full 32-k steps of x */
  int8_t xtail[32] = {0};
  memcpy(xtail, x + kf, k - kf);
  const __m256i zp = _mm256_set1_epi16((int16_t)x_zero_point);
  size_t i = 0;
  for (; i + NB <= count; i += NB) dot_bundles(NB, k, kp, x, xtail, zp, bundles + i, acc + 2 * i);
  for (; i < count; i++) dot_bundles(1, k, kp, x, xtail, zp, bundles + i, acc + 2 * i);
}

/* The int16 pair (coef_a, coef_b) in every int32 lane, a's in the low half. */
NPU_INLINE_AVX2 __m256i coef_pair(int32_t a, int32_t b) {
  return _mm256_set1_epi32((int32_t)(((uint32_t)b << 16) | ((uint32_t)a & 0xFFFF)));
}

/* coef_a a[c] + coef_b b[c] for 16 columns: lo = columns 0..7, hi = 8..15. */
NPU_INLINE_AVX2 void pair16(const int8_t *a, const int8_t *b, __m256i cab, __m256i *lo,
                            __m256i *hi) {
  const __m128i va = _mm_loadu_si128((const __m128i *)a);
  const __m128i vb = _mm_loadu_si128((const __m128i *)b);
  *lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(va, vb)), cab);
  *hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(va, vb)), cab);
}

/* acc[0..15] += the 16 columns at offset c of the pairs (d[0], d[1]) and, with two pairs,
 * (d[2], d[3]). */
NPU_INLINE_AVX2 void down16(const int pairs, const int8_t *const d[4], size_t c, __m256i c01,
                            __m256i c23, int32_t *acc) {
  __m256i lo, hi;
  pair16(d[0] + c, d[1] + c, c01, &lo, &hi);
  if (pairs == 2) {
    __m256i lo2, hi2;
    pair16(d[2] + c, d[3] + c, c23, &lo2, &hi2);
    lo = _mm256_add_epi32(lo, lo2);
    hi = _mm256_add_epi32(hi, hi2);
  }
  _mm256_storeu_si256((__m256i *)acc,
                      _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)acc), lo));
  _mm256_storeu_si256((__m256i *)(acc + 8),
                      _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + 8)), hi));
}

/* One pass over the k columns with one or two pairs of down columns. */
NPU_INLINE_AVX2 void down_pass(const int pairs, size_t k, const int8_t *const d[4], __m256i c01,
                               __m256i c23, int32_t *acc) {
  const size_t kf = k & ~(size_t)15;
  size_t c = 0;
  for (; c < kf; c += 16) down16(pairs, d, c, c01, c23, acc + c);
  if (c < k) { /* columns read up to c + 16 <= kp; acc through a copy of its tail */
    int32_t tail[16] = {0};
    memcpy(tail, acc + c, (k - c) * sizeof(int32_t));
    down16(pairs, d, c, c01, c23, tail);
    memcpy(acc + c, tail, (k - c) * sizeof(int32_t));
  }
}

NPU_TARGET_AVX2 void npu_qs8_bundle_down__avx2(size_t k, size_t count, const int8_t *const *bundles,
                                               const int32_t *coef, int32_t *acc) {
  assert(count <= NPU_BUNDLE_DOWN_MAX_COUNT);
  const size_t kp = npu_bundle_kp(k);
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const int8_t *const d[4] = {bundles[i] + 2 * kp, bundles[i + 1] + 2 * kp,
                                bundles[i + 2] + 2 * kp, bundles[i + 3] + 2 * kp};
    down_pass(2, k, d, coef_pair(coef[i], coef[i + 1]), coef_pair(coef[i + 2], coef[i + 3]), acc);
  }
  if (i < count) { /* 1 to 3 left: one or two pairs, a lone bundle paired with itself times 0 */
    const int8_t *const d0 = bundles[i] + 2 * kp;
    const int8_t *const d1 = i + 1 < count ? bundles[i + 1] + 2 * kp : d0;
    const int8_t *const d2 = i + 2 < count ? bundles[i + 2] + 2 * kp : d0;
    const int8_t *const d[4] = {d0, d1, d2, d2};
    const __m256i c01 = coef_pair(coef[i], i + 1 < count ? coef[i + 1] : 0);
    const __m256i c23 = coef_pair(i + 2 < count ? coef[i + 2] : 0, 0);
    if (i + 2 < count) down_pass(2, k, d, c01, c23, acc);
    else down_pass(1, k, d, c01, c23, acc);
  }
}

#endif /* __x86_64__ */
