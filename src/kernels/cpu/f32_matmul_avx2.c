/* npu_f32_matmul__avx2: 2 weight rows x 4 tokens, the bits of the scalar variant (cpu_ukernels.h).
 */
#include "kernels/cpu/f32_avx2_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

/* AVX2 tiles: 2 weight rows x 4 tokens (prefill: each weight row is read once per four tokens);
 * for the remaining tokens (decode), one weight row after another: on the machines measured,
 * interleaving even two rows' streams cut the bandwidth from ~20 to ~7 GB/s. Products are rounded
 * before they are added (no FMA), as in the reference. */
__attribute__((target("avx2"))) void
npu_f32_matmul__avx2(float *restrict out, const float *restrict x, const float *restrict w,
                     const float *restrict bias, int32_t rows, int32_t k, int32_t n) {
  const int32_t k8 = k & ~7;
  const size_t ks = (size_t)k, ns = (size_t)n;
  int32_t tile = (int32_t)(MM_TILE_BYTES / (ks * sizeof(float)));
  if (tile < 8) tile = 8;
  float tv[8], r8[8];
  for (int32_t n0 = 0; n0 < n; n0 += tile) {
    const int32_t n1 = n - n0 < tile ? n : n0 + tile;
    int32_t t = 0;
    for (; t + 4 <= rows; t += 4) {
      const float *xs[4] = {x + (size_t)t * ks, x + (size_t)(t + 1) * ks, x + (size_t)(t + 2) * ks,
                            x + (size_t)(t + 3) * ks};
      float *o = out + (size_t)t * ns;
      int32_t j = n0;
      for (; j + 2 <= n1; j += 2) {
        const float *w0 = w + (size_t)j * ks, *w1 = w0 + ks;
        /* lanes: tokens 0..3 of weight row j, then of row j+1 */
        __m256 r = dot2x4(w0, w1, xs, k8, k);
        if (bias != NULL) {
          r = _mm256_add_ps(r, _mm256_set_m128(_mm_set1_ps(bias[j + 1]), _mm_set1_ps(bias[j])));
        }
        _mm256_storeu_ps(r8, r);
        for (int q = 0; q < 4; q++) {
          o[(size_t)q * ns + (size_t)j] = r8[q];
          o[(size_t)q * ns + (size_t)j + 1] = r8[4 + q];
        }
      }
      for (; j < n1; j++) {
        const float *w0 = w + (size_t)j * ks;
        for (int q = 0; q < 4; q++) {
          float s0 = dot1(w0, xs[q], k8, k);
          o[(size_t)q * ns + (size_t)j] = bias != NULL ? s0 + bias[j] : s0;
        }
      }
    }
    for (; t < rows; t++) {
      const float *x0 = x + (size_t)t * ks;
      float *o0 = out + (size_t)t * ns;
      int32_t j = n0;
      for (; j + 8 <= n1; j += 8) {
        const float *w0 = w + (size_t)j * ks;
        __m256 a0 = row_dot(w0, x0, k8), a1 = row_dot(w0 + ks, x0, k8);
        __m256 a2 = row_dot(w0 + 2 * ks, x0, k8), a3 = row_dot(w0 + 3 * ks, x0, k8);
        __m256 a4 = row_dot(w0 + 4 * ks, x0, k8), a5 = row_dot(w0 + 5 * ks, x0, k8);
        __m256 a6 = row_dot(w0 + 6 * ks, x0, k8), a7 = row_dot(w0 + 7 * ks, x0, k8);
        __m256 r = hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
        if (k8 < k) {
          for (int q = 0; q < 8; q++) tv[q] = tail_dot(w0 + (size_t)q * ks, x0, k8, k);
          r = _mm256_add_ps(_mm256_loadu_ps(tv), r);
        } else {
          r = _mm256_add_ps(_mm256_setzero_ps(), r);
        }
        if (bias != NULL) r = _mm256_add_ps(r, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(o0 + j, r);
      }
      for (; j < n1; j++) {
        float s0 = dot1(w + (size_t)j * ks, x0, k8, k);
        o0[j] = bias != NULL ? s0 + bias[j] : s0;
      }
    }
  }
}
#endif
