/* npu_f32_attention__avx2 and npu_f32_attention_tiles__avx2: the scalar variants with the AVX2
 * score helpers, the same bits (cpu_ukernels.h). */
#include "kernels/cpu/f32_attention_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void
npu_f32_attention__avx2(float *restrict out, const float *restrict q, const float *restrict k,
                        const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd,
                        int32_t rows, int32_t pos0, int32_t n_valid, float scale) {
  at_impl(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale, true);
}

__attribute__((target("avx2"))) void npu_f32_attention_tiles__avx2(
    float *restrict part, const float *restrict q, const float *restrict k, const float *restrict v,
    int32_t heads, int32_t kv_heads, int32_t hd, int32_t len, int32_t u0, int32_t u1, float scale) {
  at_tiles_impl(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale, true);
}
#endif
