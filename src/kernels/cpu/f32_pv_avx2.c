/* npu_f32_pv__avx2: the scalar variant compiled for AVX2 (cpu_ukernels.h). */
#include "kernels/cpu/f32_attention_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void npu_f32_pv__avx2(float *restrict out, const float *restrict p,
                                                      const float *restrict v, int32_t heads,
                                                      int32_t kv_heads, int32_t hd, int32_t rows,
                                                      int32_t ctx, int32_t pos0, int32_t n_valid) {
  pv_impl(out, p, v, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
}
#endif
