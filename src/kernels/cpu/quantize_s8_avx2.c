/* npu_quantize_s8__avx2: eight values at a time with the bits of the scalar variant, the tail
 * left to it (cpu_ukernels.h). */
#include "kernels/cpu/convert_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void npu_quantize_s8__avx2(const float *restrict x, size_t n,
                                                           float scale, int32_t zero_point,
                                                           int8_t *restrict q_out) {
  const struct npu_quantize_avx2 c = npu_quantize_avx2_make(scale, zero_point, INT8_MIN, INT8_MAX);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i r16 = npu_pack8_s16(npu_quantize8_avx2(x + i, &c));
    _mm_storel_epi64((__m128i *)(void *)(q_out + i), _mm_packs_epi16(r16, r16));
  }
  npu_quantize_s8__scalar(x + i, n - i, scale, zero_point, q_out + i);
}
#endif
