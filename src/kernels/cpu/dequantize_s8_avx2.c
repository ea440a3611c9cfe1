/* npu_dequantize_s8__avx2: eight codes at a time with the bits of the scalar variant, the tail
 * left to it (cpu_ukernels.h). */
#include "kernels/cpu/convert_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void npu_dequantize_s8__avx2(const int8_t *restrict q, size_t n,
                                                             float scale, int32_t zero_point,
                                                             float *restrict x_out) {
  const size_t i = npu_dequantize_avx2_blocks(q, false, n, scale, zero_point, x_out);
  npu_dequantize_s8__scalar(q + i, n - i, scale, zero_point, x_out + i);
}
#endif
