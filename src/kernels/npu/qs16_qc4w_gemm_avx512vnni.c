/* npu_qs16_qc4w_gemm_qs16__avx512vnni: the w4a16 GEMM, per channel or with 32-k block scales,
 * with vpdpbusd and x split into bytes (qs16_gemm_vnni.h). Each nibble pair (8 k x 16 channels)
 * is decoded into the two 4-k groups of int8 weights (vpand 0x0F / vpsrlw 4, minus 8, as the w4a8
 * kernels do); per group and row, four vpdpbusd with the broadcast low bytes and high bytes + 128
 * of x. With block scales a 32-k chunk goes to fresh int32 lanes (one per channel), multiplied by
 * the chunk's q (vpmulld) before they join the totals. Tiles of up to MR = 3 rows x 16 channels. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs16_gemm_vnni.h"

enum {
  NR = NPU_QS8_GEMM_NR,
  MR = 3,
  KC = NPU_QS16_GEMM_KC,
  XG = KC / 4 + 1, /* x groups of a span, + 1: the second group of a last pair past k */
  PAIR = 64,
  CHUNK = NPU_QC4W_BLOCK
};

/* t[r][.] += the nibble pairs [p0, p1) of the span (x groups 2p, 2p + 1 in xl, xh), the first
 * of them at w. */
NPU_INLINE_VNNI void pairs(const int mr, __m256i t[MR][4], size_t p0, size_t p1,
                           const uint32_t xl[MR][XG], const uint32_t xh[MR][XG], const uint8_t *w) {
  const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  if (mr == 1) { /* decode: a pair's two groups into accumulators of their own, so that eight
                  * vpdpbusd chains, not four of two steps each, hide the instruction's latency */
    const __m256i z = _mm256_setzero_si256();
    __m256i e0 = z, e1 = z, e2 = z, e3 = z, o0 = z, o1 = z, o2 = z, o3 = z;
    for (size_t pr = p0; pr < p1; pr++, w += PAIR) {
      const __m256i v0 = _mm256_loadu_si256((const __m256i *)w);
      const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 32));
      const __m256i l0 = _mm256_sub_epi8(_mm256_and_si256(v0, mask), eight);
      const __m256i l1 = _mm256_sub_epi8(_mm256_and_si256(v1, mask), eight);
      const __m256i h0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v0, 4), mask), eight);
      const __m256i h1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v1, 4), mask), eight);
      const __m256i hg0 = _mm256_set1_epi32((int32_t)xh[0][2 * pr]);
      const __m256i hg1 = _mm256_set1_epi32((int32_t)xh[0][2 * pr + 1]);
      const __m256i lg0 = _mm256_set1_epi32((int32_t)xl[0][2 * pr]);
      const __m256i lg1 = _mm256_set1_epi32((int32_t)xl[0][2 * pr + 1]);
      e0 = npu_vnni_dpbusd(e0, hg0, l0);
      o0 = npu_vnni_dpbusd(o0, hg1, h0);
      e1 = npu_vnni_dpbusd(e1, hg0, l1);
      o1 = npu_vnni_dpbusd(o1, hg1, h1);
      e2 = npu_vnni_dpbusd(e2, lg0, l0);
      o2 = npu_vnni_dpbusd(o2, lg1, h0);
      e3 = npu_vnni_dpbusd(e3, lg0, l1);
      o3 = npu_vnni_dpbusd(o3, lg1, h1);
    }
    t[0][0] = _mm256_add_epi32(t[0][0], _mm256_add_epi32(e0, o0));
    t[0][1] = _mm256_add_epi32(t[0][1], _mm256_add_epi32(e1, o1));
    t[0][2] = _mm256_add_epi32(t[0][2], _mm256_add_epi32(e2, o2));
    t[0][3] = _mm256_add_epi32(t[0][3], _mm256_add_epi32(e3, o3));
    return;
  }
  for (size_t pr = p0; pr < p1; pr++, w += PAIR) {
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)w);
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 32));
    const __m256i l0 = _mm256_sub_epi8(_mm256_and_si256(v0, mask), eight);
    const __m256i l1 = _mm256_sub_epi8(_mm256_and_si256(v1, mask), eight);
    const __m256i h0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v0, 4), mask), eight);
    const __m256i h1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v1, 4), mask), eight);
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
      /* t[r]: A of channels 0..7, 8..15, then B of channels 0..7, 8..15 */
      const __m256i hg0 = _mm256_set1_epi32((int32_t)xh[r][2 * pr]);
      const __m256i hg1 = _mm256_set1_epi32((int32_t)xh[r][2 * pr + 1]);
      const __m256i lg0 = _mm256_set1_epi32((int32_t)xl[r][2 * pr]);
      const __m256i lg1 = _mm256_set1_epi32((int32_t)xl[r][2 * pr + 1]);
      t[r][0] = npu_vnni_dpbusd(npu_vnni_dpbusd(t[r][0], hg0, l0), hg1, h0);
      t[r][1] = npu_vnni_dpbusd(npu_vnni_dpbusd(t[r][1], hg0, l1), hg1, h1);
      t[r][2] = npu_vnni_dpbusd(npu_vnni_dpbusd(t[r][2], lg0, l0), lg1, h0);
      t[r][3] = npu_vnni_dpbusd(npu_vnni_dpbusd(t[r][3], lg0, l1), lg1, h1);
    }
  }
}

/* 'mr' (1..MR, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_VNNI void gemm_tile(const int mr, size_t k, size_t blk, const int16_t *restrict x,
                               size_t x_stride, const uint8_t *block, size_t n0, size_t nc,
                               const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y,
                               size_t y_stride) {
  uint32_t xl[MR][XG], xh[MR][XG];
  __m256i acc[MR][4];
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_si256();
  const uint8_t *w = block + 2 * NR * sizeof(int32_t);
  for (size_t k0 = 0; k0 < k; k0 += KC) {
    const size_t kn = k - k0 < KC ? k - k0 : KC, npairs = (kn + 7) / 8;
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
      npu_qs16_split(x + r * x_stride + k0, kn, xl[r], xh[r]);
      xl[r][(kn + 3) / 4] = xh[r][(kn + 3) / 4] = 0; /* a last pair's second group past k */
    }
    if (blk == 0) {
      pairs(mr, acc, 0, npairs, (const uint32_t(*)[XG])xl, (const uint32_t(*)[XG])xh, w);
      w += npairs * PAIR;
      continue;
    }
    for (size_t c = 0; c * CHUNK < kn; c++) {
      const uint8_t *q = w;
      const size_t p0 = c * (CHUNK / 8), p1 = p0 + CHUNK / 8 < npairs ? p0 + CHUNK / 8 : npairs;
      __m256i t[MR][4];
#pragma GCC unroll 4
      for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) t[r][j] = _mm256_setzero_si256();
      pairs(mr, t, p0, p1, (const uint32_t(*)[XG])xl, (const uint32_t(*)[XG])xh, q + NR);
      const __m256i s0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
      const __m256i s1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
#pragma GCC unroll 4
      for (int r = 0; r < mr; r++) {
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_mullo_epi32(t[r][0], s0));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_mullo_epi32(t[r][1], s1));
        acc[r][2] = _mm256_add_epi32(acc[r][2], _mm256_mullo_epi32(t[r][2], s0));
        acc[r][3] = _mm256_add_epi32(acc[r][3], _mm256_mullo_epi32(t[r][3], s1));
      }
      w = q + NR + 4 * PAIR;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++)
    npu_qs16_vnni_store(block, acc[r][0], acc[r][1], acc[r][2], acc[r][3], n0, nc, p,
                        y + r * y_stride);
}

NPU_TARGET_VNNI void npu_qs16_qc4w_gemm_qs16__avx512vnni(
    size_t m, size_t n_begin, size_t n_end, size_t k, const int16_t *restrict x, size_t x_stride,
    const void *restrict w_packed, int16_t *restrict y, size_t y_stride,
    const struct npu_qs16_gemm_params *restrict p) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  assert(p->block == 0 || p->block == NPU_QC4W_BLOCK);
  const size_t blk = (size_t)p->block, block_size = npu_qc4w_gemm_block_size(k, blk);
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i += MR) {
      const int16_t *xi = x + i * x_stride;
      int16_t *yi = y + i * y_stride + n0;
      switch (m - i < MR ? m - i : MR) {
      case 3: gemm_tile(3, k, blk, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      case 2: gemm_tile(2, k, blk, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      default: gemm_tile(1, k, blk, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      }
    }
  }
}

#endif /* __x86_64__ */
