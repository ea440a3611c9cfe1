/* npu_qs16_gemm_qs16__avx512vnni: the w8a16 GEMM with vpdpbusd on the int8 layout as it lies in
 * memory, x split into bytes (qs16_gemm_vnni.h): per 4-k group and row, two broadcasts (low bytes,
 * high bytes + 128) and four vpdpbusd against the group's two 32-byte weight rows (channels
 * 0..7, 8..15). Tiles of up to MR = 4 rows x 16 channels (16 accumulators). */
#include "kernels/npu/ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs16_gemm_vnni.h"

enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR, MR = 4, KC = NPU_QS16_GEMM_KC };

/* 'mr' (1..MR, a constant after inlining) rows x one block of 16 channels. */
NPU_INLINE_VNNI void gemm_tile(const int mr, size_t k, const int16_t *restrict x, size_t x_stride,
                               const uint8_t *block, size_t n0, size_t nc,
                               const struct npu_qs16_gemm_params *restrict p, int16_t *restrict y,
                               size_t y_stride) {
  uint32_t xl[MR][KC / 4], xh[MR][KC / 4];
  __m256i a[MR][2], b[MR][2];
  #pragma GCC unroll 4
  for (int r = 0; r < mr; r++)
    a[r][0] = a[r][1] = b[r][0] = b[r][1] = _mm256_setzero_si256();
  const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
  for (size_t k0 = 0; k0 < k; k0 += KC) {
    const size_t kn = k - k0 < KC ? k - k0 : KC, groups = (kn + KR - 1) / KR;
    #pragma GCC unroll 4
    for (int r = 0; r < mr; r++) npu_qs16_split(x + r * x_stride + k0, kn, xl[r], xh[r]);
    for (size_t g = 0; g < groups; g++, w += NR * KR) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
      const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
      #pragma GCC unroll 4
      for (int r = 0; r < mr; r++) {
        const __m256i l = _mm256_set1_epi32((int32_t)xl[r][g]);
        const __m256i h = _mm256_set1_epi32((int32_t)xh[r][g]);
        a[r][0] = npu_vnni_dpbusd(a[r][0], h, w0);
        a[r][1] = npu_vnni_dpbusd(a[r][1], h, w1);
        b[r][0] = npu_vnni_dpbusd(b[r][0], l, w0);
        b[r][1] = npu_vnni_dpbusd(b[r][1], l, w1);
      }
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < mr; r++)
    npu_qs16_vnni_store(block, a[r][0], a[r][1], b[r][0], b[r][1], n0, nc, p, y + r * y_stride);
}

NPU_TARGET_VNNI void
npu_qs16_gemm_qs16__avx512vnni(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int16_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, int16_t *restrict y, size_t y_stride,
                               const struct npu_qs16_gemm_params *restrict p) {
  assert(k >= 1 && k <= NPU_QS8_GEMM_MAX_K);
  assert(n_begin % NR == 0);
  assert(p->acc_shift >= 0 && p->acc_shift <= 32);
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * ((k + KR - 1) / KR * KR);
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
