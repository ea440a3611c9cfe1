/* npu_f32_qk__scalar: attention scores (cpu_ukernels.h). */
#include "kernels/cpu/f32_attention_impl.h"

void npu_f32_qk__scalar(float *restrict s, const float *restrict q, const float *restrict k,
                        int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                        int32_t pos0, int32_t n_valid, float scale) {
  qk_impl(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale, false);
}
