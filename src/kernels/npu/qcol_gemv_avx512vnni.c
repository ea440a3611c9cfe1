/* npu_qcol8_gemv__avx512vnni and npu_qcol4_gemv__avx512vnni: the input-sparse GEMVs over
 * channel-major weights (npu_ukernels.h) on 512-bit registers with AVX512-VNNI's vpdpwssd,
 * bit-exact with the scalar references (integer sums; no int32 overflows in the caller's bounds,
 * and vpdpwssd's modular sums are then exact in any order).
 *
 * Products: two kept channels a, b at a time. Their rows' bytes are interleaved (vpunpcklbw /
 * vpunpckhbw of 32 bytes, within 128-bit lanes) and widened to int16 (8-bit: vpmovsxbw; 4-bit:
 * vpmovzxbw, then the low nibbles by an AND with 0x0F and the high ones by a 16-bit shift right by
 * 4), so that each int32 lane holds the pair (w_a[n], w_b[n]); vpdpwssd with the broadcast pair
 * (d_a, d_b) adds d_a w_a[n] + d_b w_b[n] (|d w| <= 32768 * 127 < 2^22). The lanes come out as
 * outputs 0-7, 16-23 and 8-15, 24-31 of each 32 (per nibble half, 4-bit), put in order once per
 * group and step by two vshufi64x2. The nibbles stay offset binary, u = w + 8: the sum
 * d_a u_a + d_b u_b over a group is its sum of d w plus 8 times its sum of d, so the accumulators
 * start at -8 * sum d. With block scales a group's sums are multiplied by q (vpmulld) before they
 * are added to acc.
 *
 * Loop order (the AVX2 variant shares it through qcol_gemv_x86.h, the NEON one copies it): tiles of
 * 1024 outputs (the tile's 4 KB of acc stay in L1), and inside a tile the kept channels in groups
 * of 8: one pass of a group over the tile reads its 8 rows as 8 sequential runs of 1 KB (8-bit) or
 * 512 bytes (4-bit) and adds all 8 channels to acc in registers, so acc is read and written once
 * per group, not per channel. An odd last channel pairs with a repeat of the group's first row, d =
 * 0. Each step of a pass prefetches (prefetcht0) one cache line of each row of the next group (the
 * following group of the tile, else the first of the next tile) at the same offset: the rows of
 * a sparse set are short runs in random places, where the hardware prefetcher starts late.
 * Measured (one thread, N = 2048 outputs x k = 8192 channels, weights streamed from DRAM, against
 * the dense avx512vnni GEMV's bytes/s on the same matrix; best of 9 interleaved runs on a shared
 * machine): 8-bit 97-111%, 4-bit with block scales 120-147% (every channel, or a random half);
 * without the software prefetch 71-94%; groups of 16 or 32 channels 69-107% (more runs at
 * once); tiles of 2048 outputs the same for 8-bit, 105-134% for 4-bit, of 512 96-134%;
 * prefetcht1 about the same, prefetchnta 56-110%. (Not tried: outputs outer with the
 * accumulators in registers and every channel inner, which reads one or two cache lines of each
 * of up to thousands of rows in turn.) From L3 (the same matrix over and over), where the dense
 * kernel is compute-bound too: 8-bit 94-102%, 4-bit 89-108%. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qcol_gemv_x86.h"
#include "kernels/npu/vnni_util.h"

/* The int16 pair (d_a, d_b) in every int32 lane, a's in the low half. */
NPU_INLINE_VNNI __m512i d_pair(int32_t a, int32_t b) {
  return _mm512_set1_epi32((int32_t)(((uint32_t)b << 16) | ((uint32_t)a & 0xFFFF)));
}

/* 8-bit: dst[0..31] += the 32 outputs at byte o of the group's 'pairs' row pairs. */
NPU_INLINE_VNNI void step8(const int pairs, const int8_t *const *r, const __m512i *dp, size_t o,
                           int32_t *dst) {
  __m512i lo = _mm512_setzero_si512(), hi = lo; /* outputs 0-7, 16-23 and 8-15, 24-31 */
#pragma GCC unroll 4
  for (int p = 0; p < pairs; p++) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)(r[2 * p] + o));
    const __m256i vb = _mm256_loadu_si256((const __m256i *)(r[2 * p + 1] + o));
    lo = _mm512_dpwssd_epi32(lo, _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(va, vb)), dp[p]);
    hi = _mm512_dpwssd_epi32(hi, _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(va, vb)), dp[p]);
  }
  const __m512i s0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)); /* outputs 0-15 */
  const __m512i s1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)); /* 16-31 */
  _mm512_storeu_si512(dst, _mm512_add_epi32(_mm512_loadu_si512(dst), s0));
  _mm512_storeu_si512(dst + 16, _mm512_add_epi32(_mm512_loadu_si512(dst + 16), s1));
}

/* One group over the outputs [o0, o1) (offsets within the rows), into dst[0 ..]. */
NPU_INLINE_VNNI void pass8(const int pairs, const struct npu_qcol_group *g, size_t o0, size_t o1,
                           int32_t *dst) {
  __m512i dp[NPU_QCOL_G / 2];
  for (int p = 0; p < pairs; p++) dp[p] = d_pair(g->d[2 * p], g->d[2 * p + 1]);
  const int8_t *r[NPU_QCOL_G];
  for (int j = 0; j < 2 * pairs; j++) r[j] = (const int8_t *)g->row[j];
  for (size_t o = o0; o < o1; o += 64) {
    npu_qcol_prefetch(g, o - o0);
    step8(pairs, r, dp, o, dst + (o - o0));
    step8(pairs, r, dp, o + 32, dst + (o - o0) + 32);
  }
}

NPU_TARGET_VNNI void npu_qcol8_gemv__avx512vnni(size_t n0, size_t n1, size_t count,
                                                const int32_t *restrict idx,
                                                const int16_t *restrict d,
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

/* 4-bit: dst[0..63] += (q *) the 64 outputs of the 32-byte chunk at byte o of the group's
 * 'pairs' row pairs; 'start' = -8 * the group's sum of d (the nibbles' offset). */
NPU_INLINE_VNNI void step4(const int pairs, const int with_q, const uint8_t *const *r,
                           const __m512i *dp, __m512i start, size_t o, const uint8_t *q,
                           int32_t *dst) {
  const __m512i m4 = _mm512_set1_epi16(0x0F);
  /* low nibbles (outputs 0-31): 0-7, 16-23 and 8-15, 24-31; high nibbles (32-63) likewise */
  __m512i l0 = start, l1 = start, h0 = start, h1 = start;
#pragma GCC unroll 4
  for (int p = 0; p < pairs; p++) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)(r[2 * p] + o));
    const __m256i vb = _mm256_loadu_si256((const __m256i *)(r[2 * p + 1] + o));
    const __m512i x0 = _mm512_cvtepu8_epi16(_mm256_unpacklo_epi8(va, vb));
    const __m512i x1 = _mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(va, vb));
    l0 = _mm512_dpwssd_epi32(l0, _mm512_and_si512(x0, m4), dp[p]);
    l1 = _mm512_dpwssd_epi32(l1, _mm512_and_si512(x1, m4), dp[p]);
    h0 = _mm512_dpwssd_epi32(h0, _mm512_srli_epi16(x0, 4), dp[p]);
    h1 = _mm512_dpwssd_epi32(h1, _mm512_srli_epi16(x1, 4), dp[p]);
  }
  __m512i s[4] = {
      _mm512_shuffle_i64x2(l0, l1, _MM_SHUFFLE(1, 0, 1, 0)), /* outputs 0-15 */
      _mm512_shuffle_i64x2(l0, l1, _MM_SHUFFLE(3, 2, 3, 2)), /* 16-31 */
      _mm512_shuffle_i64x2(h0, h1, _MM_SHUFFLE(1, 0, 1, 0)), /* 32-47 */
      _mm512_shuffle_i64x2(h0, h1, _MM_SHUFFLE(3, 2, 3, 2)), /* 48-63 */
  };
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    if (with_q)
      s[j] = _mm512_mullo_epi32(
          s[j], _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * j))));
    _mm512_storeu_si512(dst + 16 * j, _mm512_add_epi32(_mm512_loadu_si512(dst + 16 * j), s[j]));
  }
}

/* One group over the outputs [n0, n1) (absolute; row bytes n0 / 2 ..), into dst[0 ..]. */
NPU_INLINE_VNNI void pass4(const int pairs, const int with_q, const struct npu_qcol_group *g,
                           size_t n0, size_t n1, const uint8_t *q, int32_t *dst) {
  __m512i dp[NPU_QCOL_G / 2];
  for (int p = 0; p < pairs; p++) dp[p] = d_pair(g->d[2 * p], g->d[2 * p + 1]);
  const __m512i start = _mm512_set1_epi32(-8 * g->dsum);
  const uint8_t *r[NPU_QCOL_G];
  for (int j = 0; j < 2 * pairs; j++) r[j] = g->row[j];
  for (size_t n = n0; n < n1; n += 128) {
    npu_qcol_prefetch(g, (n - n0) / 2);
    step4(pairs, with_q, r, dp, start, n / 2, with_q ? q + n : q, dst + (n - n0));
    if (n + 64 < n1)
      step4(pairs, with_q, r, dp, start, n / 2 + 32, with_q ? q + n + 64 : q, dst + (n - n0) + 64);
  }
}

NPU_INLINE_VNNI void pass4_any(const int with_q, const struct npu_qcol_group *g, size_t n0,
                               size_t n1, const uint8_t *q, int32_t *dst) {
  switch (g->pairs) {
  case 4: pass4(4, with_q, g, n0, n1, q, dst); break;
  case 3: pass4(3, with_q, g, n0, n1, q, dst); break;
  case 2: pass4(2, with_q, g, n0, n1, q, dst); break;
  default: pass4(1, with_q, g, n0, n1, q, dst); break;
  }
}

NPU_TARGET_VNNI void npu_qcol4_gemv__avx512vnni(size_t n0, size_t n1, size_t count,
                                                const int32_t *restrict idx,
                                                const int16_t *restrict d,
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
