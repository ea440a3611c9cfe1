/* npu_qs16_gemm_qs16__avx512vnni: the w8a16 GEMM with vpdpbusd on the int8 layout as it lies in
 * memory, x split into bytes (qs16_gemm_vnni.h): per 4-k group and row, two broadcasts (low bytes,
 * high bytes + 128) and four vpdpbusd against the group's two 32-byte weight rows (channels
 * 0..7, 8..15). Tiles of up to MR = 4 rows x 16 channels (16 accumulators), x split per span of
 * 512 k into a stack buffer; decode (m = 1) splits x once and takes two groups at a time into two
 * sets of accumulators, so that vpdpbusd's latency is hidden. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs16_gemm_vnni.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 4, KC = NPU_QS16_GEMM_KC };

/* Row r of a tile, one 4-k group g: its two broadcast x groups against w0 (channels 0..7) and w1
 * (8..15). */
#define ROW_STEP(r)                                                                                \
  do {                                                                                             \
    if (mr > r) {                                                                                  \
      const __m256i l_ = _mm256_set1_epi32((int32_t)xl[r][g]);                                     \
      const __m256i h_ = _mm256_set1_epi32((int32_t)xh[r][g]);                                     \
      a##r##0 = npu_vnni_dpbusd(a##r##0, h_, w0);                                                  \
      a##r##1 = npu_vnni_dpbusd(a##r##1, h_, w1);                                                  \
      b##r##0 = npu_vnni_dpbusd(b##r##0, l_, w0);                                                  \
      b##r##1 = npu_vnni_dpbusd(b##r##1, l_, w1);                                                  \
    }                                                                                              \
  } while (0)

/* 'mr' (1..MR, a constant after inlining) rows x one block of 16 channels. Per span of KC k,
 * a<r><h>, b<r><h> are A and B (qs16_gemm_vnni.h) of row r, channels 8h .. 8h + 7, named and
 * started at 0 so that they stay in registers through the span (the split's calls between spans
 * would otherwise keep them in memory); the spans add up in tot[][] (A, B are exact int32 over
 * all of k, so the order changes nothing). */
NPU_INLINE_VNNI void gemm_tile(const int mr, size_t k, const int16_t *restrict x, size_t x_stride,
                               const uint8_t *block, size_t n0, size_t nc,
                               const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y,
                               size_t y_stride) {
  uint32_t xl[MR][KC / 4], xh[MR][KC / 4];
  __m256i tot[MR][4];
  const __m256i z = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++) tot[r][0] = tot[r][1] = tot[r][2] = tot[r][3] = z;
  const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
  for (size_t k0 = 0; k0 < k; k0 += KC) {
    const size_t kn = k - k0 < KC ? k - k0 : KC, groups = (kn + KR - 1) / KR;
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) npu_qs16_split(x + r * x_stride + k0, kn, xl[r], xh[r]);
    __m256i a00 = z, a01 = z, b00 = z, b01 = z, a10 = z, a11 = z, b10 = z, b11 = z;
    __m256i a20 = z, a21 = z, b20 = z, b21 = z, a30 = z, a31 = z, b30 = z, b31 = z;
    for (size_t g = 0; g < groups; g++, w += NR * KR) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
      const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
      ROW_STEP(0);
      ROW_STEP(1);
      ROW_STEP(2);
      ROW_STEP(3);
    }
#define ROW_ADD(r)                                                                                 \
  do {                                                                                             \
    if (mr > r) {                                                                                  \
      tot[r][0] = _mm256_add_epi32(tot[r][0], a##r##0);                                            \
      tot[r][1] = _mm256_add_epi32(tot[r][1], a##r##1);                                            \
      tot[r][2] = _mm256_add_epi32(tot[r][2], b##r##0);                                            \
      tot[r][3] = _mm256_add_epi32(tot[r][3], b##r##1);                                            \
    }                                                                                              \
  } while (0)
    ROW_ADD(0);
    ROW_ADD(1);
    ROW_ADD(2);
    ROW_ADD(3);
#undef ROW_ADD
  }
#pragma GCC unroll 4
  for (int r = 0; r < mr; r++)
    npu_qs16_vnni_store(block, tot[r][0], tot[r][1], tot[r][2], tot[r][3], n0, nc, p,
                        y + r * y_stride);
}

/* Decode (m = 1): x split once for all of k (at most 2 * 32 KiB of stack), then each block of 16
 * channels one pass over its weights, two groups at a time into two sets of accumulators so
 * that vpdpbusd's latency is hidden. */
NPU_INLINE_VNNI void gemv(size_t k, const int16_t *restrict x, const uint8_t *blocks,
                          size_t block_size, size_t n_begin, size_t n_end,
                          const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y) {
  uint32_t xl[NPU_QS8_GEMM_MAX_K / 4], xh[NPU_QS8_GEMM_MAX_K / 4];
  npu_qs16_split(x, k, xl, xh);
  const size_t groups = (k + KR - 1) / KR;
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = blocks + n0 / NR * block_size;
    const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
    const __m256i z = _mm256_setzero_si256();
    __m256i a0 = z, a1 = z, b0 = z, b1 = z, c0 = z, c1 = z, d0 = z, d1 = z;
    size_t g = 0;
    for (; g + 2 <= groups; g += 2, w += 2 * NR * KR) {
      const __m256i l0 = _mm256_set1_epi32((int32_t)xl[g]);
      const __m256i h0 = _mm256_set1_epi32((int32_t)xh[g]);
      const __m256i l1 = _mm256_set1_epi32((int32_t)xl[g + 1]);
      const __m256i h1 = _mm256_set1_epi32((int32_t)xh[g + 1]);
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
      const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
      const __m256i w2 = _mm256_loadu_si256((const __m256i *)(w + 64));
      const __m256i w3 = _mm256_loadu_si256((const __m256i *)(w + 96));
      a0 = npu_vnni_dpbusd(a0, h0, w0);
      a1 = npu_vnni_dpbusd(a1, h0, w1);
      b0 = npu_vnni_dpbusd(b0, l0, w0);
      b1 = npu_vnni_dpbusd(b1, l0, w1);
      c0 = npu_vnni_dpbusd(c0, h1, w2);
      c1 = npu_vnni_dpbusd(c1, h1, w3);
      d0 = npu_vnni_dpbusd(d0, l1, w2);
      d1 = npu_vnni_dpbusd(d1, l1, w3);
    }
    if (g < groups) {
      const __m256i l0 = _mm256_set1_epi32((int32_t)xl[g]);
      const __m256i h0 = _mm256_set1_epi32((int32_t)xh[g]);
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
      const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
      a0 = npu_vnni_dpbusd(a0, h0, w0);
      a1 = npu_vnni_dpbusd(a1, h0, w1);
      b0 = npu_vnni_dpbusd(b0, l0, w0);
      b1 = npu_vnni_dpbusd(b1, l0, w1);
    }
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    npu_qs16_vnni_store(block, _mm256_add_epi32(a0, c0), _mm256_add_epi32(a1, c1),
                        _mm256_add_epi32(b0, d0), _mm256_add_epi32(b1, d1), n0, nc, p, y + n0);
  }
}

NPU_TARGET_VNNI void npu_qs16_gemm_qs16__avx512vnni(size_t m, size_t n_begin, size_t n_end,
                                                    size_t k, const int16_t *restrict x,
                                                    size_t x_stride, const void *restrict w_packed,
                                                    int16_t *restrict y, size_t y_stride,
                                                    const struct npu_qs16_gemm_params *restrict p) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * ((k + KR - 1) / KR * KR);
  if (m == 1) {
    if (n_begin < n_end) gemv(k, x, w_packed, block_size, n_begin, n_end, p, y);
    return;
  }
  for (size_t n0 = n_begin; n0 < n_end; n0 += NR) {
    const uint8_t *block = (const uint8_t *)w_packed + n0 / NR * block_size;
    const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
    for (size_t i = 0; i < m; i += MR) {
      const int16_t *xi = x + i * x_stride;
      int16_t *yi = y + i * y_stride + n0;
      switch (m - i < MR ? m - i : MR) {
      case 4: gemm_tile(4, k, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      case 3: gemm_tile(3, k, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      case 2: gemm_tile(2, k, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      default: gemm_tile(1, k, xi, x_stride, block, n0, nc, p, yi, y_stride); break;
      }
    }
  }
}

#endif /* __x86_64__ */
