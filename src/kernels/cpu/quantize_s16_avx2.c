/* npu_quantize_s16__avx2: eight values at a time with the bits of the scalar variant, the tail
 * left to it (cpu_ukernels.h). */
#include "kernels/cpu/convert_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void npu_quantize_s16__avx2(const float *restrict x, size_t n,
                                                            float scale, int32_t zero_point,
                                                            int16_t *restrict q_out) {
  const struct npu_quantize_avx2 c =
      npu_quantize_avx2_make(scale, zero_point, INT16_MIN, INT16_MAX);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(void *)(q_out + i), npu_pack8_s16(npu_quantize8_avx2(x + i, &c)));
  npu_quantize_s16__scalar(x + i, n - i, scale, zero_point, q_out + i);
}
#endif
