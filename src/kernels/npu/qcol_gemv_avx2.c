/* npu_qcol8_gemv__avx2 and npu_qcol4_gemv__avx2: the input-sparse GEMVs over channel-major
 * weights (npu_ukernels.h) on AVX2 with vpmaddwd, bit-exact with the scalar references (integer
 * sums that cannot overflow int32 in the caller's bounds, so their order does not matter).
 *
 * The products and the loop order of qcol_gemv_avx512vnni.c (its head comment, with the
 * measurements) on 256-bit registers: 16 bytes of two kept channels' rows interleaved
 * (vpunpcklbw / vpunpckhbw) and widened to int16 (8-bit: vpmovsxbw; 4-bit: vpmovzxbw, low nibbles
 * by an AND with 0x0F, high ones by a shift right by 4), so that each int32 lane holds
 * (w_a[n], w_b[n]) in output order and vpmaddwd with the broadcast pair (d_a, d_b) gives
 * d_a w_a[n] + d_b w_b[n] (vpaddd into the group's sums). 4-bit: the accumulators start at
 * -8 * the group's sum of d (the nibbles' offset), and with block scales the group's sums are
 * multiplied by q (vpmulld) before they are added to acc. Tiles of 1024 outputs, groups of 8
 * channels, the next group's rows prefetched a cache line per row and step (qcol_gemv_x86.h). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/qcol_gemv_x86.h"

/* The int16 pair (d_a, d_b) in every int32 lane, a's in the low half. */
NPU_INLINE_AVX2 __m256i d_pair(int32_t a, int32_t b) {
  return _mm256_set1_epi32((int32_t)(((uint32_t)b << 16) | ((uint32_t)a & 0xFFFF)));
}

/* 8-bit: dst[0..31] += the 32 outputs at byte o of the group's 'pairs' row pairs. */
NPU_INLINE_AVX2 void step8(const int pairs, const int8_t *const *r, const __m256i *dp, size_t o,
                           int32_t *dst) {
  __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()}; /* outputs 0-7, 8-15, 16-23, 24-31 */
#pragma GCC unroll 4
  for (int p = 0; p < pairs; p++) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      const __m128i va = _mm_loadu_si128((const __m128i *)(r[2 * p] + o + 16 * h));
      const __m128i vb = _mm_loadu_si128((const __m128i *)(r[2 * p + 1] + o + 16 * h));
      s[2 * h] = _mm256_add_epi32(
          s[2 * h], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(va, vb)), dp[p]));
      s[2 * h + 1] = _mm256_add_epi32(
          s[2 * h + 1], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(va, vb)), dp[p]));
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++)
    _mm256_storeu_si256((__m256i *)(dst + 8 * j),
                        _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(dst + 8 * j)), s[j]));
}

/* One group over the outputs [o0, o1) (offsets within the rows), into dst[0 ..]. */
NPU_INLINE_AVX2 void pass8(const int pairs, const struct npu_qcol_group *g, size_t o0, size_t o1,
                           int32_t *dst) {
  __m256i dp[NPU_QCOL_G / 2];
  for (int p = 0; p < pairs; p++) dp[p] = d_pair(g->d[2 * p], g->d[2 * p + 1]);
  const int8_t *r[NPU_QCOL_G];
  for (int j = 0; j < 2 * pairs; j++) r[j] = (const int8_t *)g->row[j];
  for (size_t o = o0; o < o1; o += 64) {
    npu_qcol_prefetch(g, o - o0);
    step8(pairs, r, dp, o, dst + (o - o0));
    step8(pairs, r, dp, o + 32, dst + (o - o0) + 32);
  }
}

NPU_TARGET_AVX2 void npu_qcol8_gemv__avx2(size_t n0, size_t n1, size_t count,
                                          const int32_t *restrict idx, const int16_t *restrict d,
                                          const int8_t *restrict cols, size_t row_stride,
                                          int32_t *restrict acc) {
  npu_qcol_check(n0, n1, row_stride, 8);
  for (size_t t0 = n0; t0 < n1; t0 += NPU_QCOL_TILE) {
    const size_t t1 = t0 + NPU_QCOL_TILE < n1 ? t0 + NPU_QCOL_TILE : n1;
    for (size_t i = 0; i < count; i += NPU_QCOL_G) {
      struct npu_qcol_group g;
      npu_qcol_group_make(&g, i, count, idx, d, cols, row_stride, 0, t0, t1, n1);
      switch (g.pairs) {
      case 4: pass8(4, &g, t0, t1, acc + (t0 - n0)); break;
      case 3: pass8(3, &g, t0, t1, acc + (t0 - n0)); break;
      case 2: pass8(2, &g, t0, t1, acc + (t0 - n0)); break;
      default: pass8(1, &g, t0, t1, acc + (t0 - n0)); break;
      }
    }
  }
}

/* 4-bit: the 32 outputs of half h of the 32-byte chunk at byte o (outputs 16h .. 16h+15 from the
 * low nibbles, 32+16h .. from the high ones) of the group's 'pairs' row pairs, added (times q)
 * to dst[16h ..] and dst[32 + 16h ..]; 'start' = -8 * the group's sum of d. */
NPU_INLINE_AVX2 void step4(const int pairs, const int with_q, const uint8_t *const *r,
                           const __m256i *dp, __m256i start, size_t o, int h, const uint8_t *q,
                           int32_t *dst) {
  const __m256i m4 = _mm256_set1_epi16(0x0F);
  __m256i s[4] = {start, start, start, start}; /* outputs +0-7, +8-15, +32-39, +40-47 */
#pragma GCC unroll 4
  for (int p = 0; p < pairs; p++) {
    const __m128i va = _mm_loadu_si128((const __m128i *)(r[2 * p] + o + 16 * h));
    const __m128i vb = _mm_loadu_si128((const __m128i *)(r[2 * p + 1] + o + 16 * h));
    const __m256i x0 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(va, vb));
    const __m256i x1 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(va, vb));
    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(_mm256_and_si256(x0, m4), dp[p]));
    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(_mm256_and_si256(x1, m4), dp[p]));
    s[2] = _mm256_add_epi32(s[2], _mm256_madd_epi16(_mm256_srli_epi16(x0, 4), dp[p]));
    s[3] = _mm256_add_epi32(s[3], _mm256_madd_epi16(_mm256_srli_epi16(x1, 4), dp[p]));
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    const size_t at = 16 * (size_t)h + (size_t)(j & 1) * 8 + (size_t)(j >> 1) * 32;
    if (with_q)
      s[j] = _mm256_mullo_epi32(s[j],
                                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + at))));
    _mm256_storeu_si256((__m256i *)(dst + at),
                        _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(dst + at)), s[j]));
  }
}

/* One group over the outputs [n0, n1) (absolute; row bytes n0 / 2 ..), into dst[0 ..]. */
NPU_INLINE_AVX2 void pass4(const int pairs, const int with_q, const struct npu_qcol_group *g,
                           size_t n0, size_t n1, const uint8_t *q, int32_t *dst) {
  __m256i dp[NPU_QCOL_G / 2];
  for (int p = 0; p < pairs; p++) dp[p] = d_pair(g->d[2 * p], g->d[2 * p + 1]);
  const __m256i start = _mm256_set1_epi32(-8 * g->dsum);
  const uint8_t *r[NPU_QCOL_G];
  for (int j = 0; j < 2 * pairs; j++) r[j] = g->row[j];
  for (size_t n = n0; n < n1; n += 64) {
    if ((n - n0) % 128 == 0) npu_qcol_prefetch(g, (n - n0) / 2);
    const uint8_t *qn = with_q ? q + n : q;
    step4(pairs, with_q, r, dp, start, n / 2, 0, qn, dst + (n - n0));
    step4(pairs, with_q, r, dp, start, n / 2, 1, qn, dst + (n - n0));
  }
}

NPU_INLINE_AVX2 void pass4_any(const int with_q, const struct npu_qcol_group *g, size_t n0,
                               size_t n1, const uint8_t *q, int32_t *dst) {
  switch (g->pairs) {
  case 4: pass4(4, with_q, g, n0, n1, q, dst); break;
  case 3: pass4(3, with_q, g, n0, n1, q, dst); break;
  case 2: pass4(2, with_q, g, n0, n1, q, dst); break;
  default: pass4(1, with_q, g, n0, n1, q, dst); break;
  }
}

NPU_TARGET_AVX2 void npu_qcol4_gemv__avx2(size_t n0, size_t n1, size_t count,
                                          const int32_t *restrict idx, const int16_t *restrict d,
                                          const uint8_t *restrict cols, size_t row_stride,
                                          const uint8_t *restrict q, int32_t *restrict acc) {
  npu_qcol_check(n0, n1, row_stride, 4);
  for (size_t t0 = n0; t0 < n1; t0 += NPU_QCOL_TILE) {
    const size_t t1 = t0 + NPU_QCOL_TILE < n1 ? t0 + NPU_QCOL_TILE : n1;
    for (size_t i = 0; i < count; i += NPU_QCOL_G) {
      struct npu_qcol_group g;
      npu_qcol_group_make(&g, i, count, idx, d, cols, row_stride, 1, t0, t1, n1);
      if (q != NULL) pass4_any(1, &g, t0, t1, q, acc + (t0 - n0));
      else pass4_any(0, &g, t0, t1, NULL, acc + (t0 - n0));
    }
  }
}

#endif /* __x86_64__ */
