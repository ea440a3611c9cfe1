/* npu_x8_lut__avx2: 256-entry byte lookup with 16 vpshufb (XNNPACK's x8-lut scheme). The index
 * u = x + 128 is stepped down by 16 per 16-entry slice: vpshufb yields slice j's entry while the
 * stepped index is in [0, 127] and zero once its top bit is set, so for u in slice b the slices
 * max(0, b - 7) .. b answer (steps 9..15 subtract with signed saturation so that a negative index
 * never wraps back). The tables are pre-XORed so that those answers XOR to table[u]. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/avx2_util.h"

NPU_TARGET_AVX2 void npu_x8_lut__avx2(size_t n, const int8_t *x, int8_t *y,
                                      const int8_t *restrict table) {
  __m256i v[16];
  for (int b = 0; b < 16; b++) {
    /* v[b] = T_b ^ v[max(0, b-7)] ^ ... ^ v[b-1], T_b = table[16b .. 16b + 15]. */
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(table + 16 * b)));
    for (int j = b - 7 > 0 ? b - 7 : 0; j < b; j++) t = _mm256_xor_si256(t, v[j]);
    v[b] = t;
  }
  const __m256i bias = _mm256_set1_epi8(INT8_MIN);
  const __m256i step = _mm256_set1_epi8(16);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i s = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + i)), bias);
    __m256i r = _mm256_shuffle_epi8(v[0], s);
    for (int j = 1; j <= 8; j++) {
      s = _mm256_sub_epi8(s, step);
      r = _mm256_xor_si256(r, _mm256_shuffle_epi8(v[j], s));
    }
    for (int j = 9; j < 16; j++) {
      s = _mm256_subs_epi8(s, step);
      r = _mm256_xor_si256(r, _mm256_shuffle_epi8(v[j], s));
    }
    _mm256_storeu_si256((__m256i *)(y + i), r);
  }
  for (; i < n; i++) y[i] = table[x[i] + 128];
}

#endif /* __x86_64__ */
