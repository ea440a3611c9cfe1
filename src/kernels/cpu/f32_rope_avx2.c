/* npu_f32_rope__avx2: eight dimensions at a time, the bits of the scalar variant (cpu_ukernels.h).
 */
#include "kernels/cpu/f32_avx2_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* rope_pairs of a whole head, eight dimensions at a time, with the same bits: each output is the
 * reference's two products joined by its one subtraction or addition (an addition's operands
 * commute exactly). Adjacent pairs (norm): x = [a0 b0 a1 b1 ..], p = x * [c0 c0 c1 c1 ..],
 * q = [b0 a0 b1 a1 ..] * [s0 s0 s1 s1 ..]; addsub(p, q) = [a0 c0 - b0 s0, b0 c0 + a0 s0, ..]. */
__attribute__((target("avx2"))) static void rope_head(float *restrict o, const float *restrict v,
                                                      const float *restrict cs,
                                                      const float *restrict sn, int32_t half,
                                                      bool norm) {
  int32_t i = 0;
  if (norm) {
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (; i + 4 <= half; i += 4) {
      const __m256 x = _mm256_loadu_ps(v + 2 * i);
      const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
      const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup);
      const __m256 p = _mm256_mul_ps(x, c), q = _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), s);
      _mm256_storeu_ps(o + 2 * i, _mm256_addsub_ps(p, q));
    }
  } else {
    for (; i + 8 <= half; i += 8) {
      const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
      const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
      _mm256_storeu_ps(o + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(o + i + half, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
    }
  }
  rope_pairs(o, v, cs, sn, i, half, norm);
}

__attribute__((target("avx2"))) void
npu_f32_rope__avx2(float *restrict out, const float *restrict x, const float *restrict cos_tab,
                   const float *restrict sin_tab, const struct npu_config *c, int32_t rows,
                   int32_t heads, int32_t pos0) {
  rope_rows(out, x, cos_tab, sin_tab, c, rows, heads, pos0, rope_head);
}
#endif
