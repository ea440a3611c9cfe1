/* npu_f32_attention__scalar and npu_f32_attention_tiles__scalar, the fused attention (ukernels.h),
 * and npu_f32_attention_fold, which folds the tiles' results (kernels.h). */
#include "kernels/cpu/f32_attention_impl.h"

void npu_f32_attention__scalar(float *restrict out, const float *restrict q,
                               const float *restrict k, const float *restrict v, int32_t heads,
                               int32_t kv_heads, int32_t hd, int32_t rows, int32_t pos0,
                               int32_t n_valid, float scale) {
  at_impl(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale, false);
}

void npu_f32_attention_tiles__scalar(float *restrict part, const float *restrict q,
                                     const float *restrict k, const float *restrict v,
                                     int32_t heads, int32_t kv_heads, int32_t hd, int32_t len,
                                     int32_t u0, int32_t u1, float scale) {
  at_tiles_impl(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale, false);
}

void npu_f32_attention_fold(float *restrict out, const float *restrict part, int32_t heads,
                            int32_t hd, int32_t n_tiles) {
  const size_t stride = (size_t)hd + 2;
  for (int32_t h = 0; h < heads; h++) {
    float *o = out + (size_t)h * (size_t)hd, max = -INFINITY, sum = 0.0f;
    for (int32_t tile = 0; tile < n_tiles; tile++) {
      const float *r = part + ((size_t)tile * (size_t)heads + (size_t)h) * stride, *u = r + 2;
      const bool first = tile == 0;
      const struct at_fold f = at_fold_sum(r[0], r[1], &max, &sum, first);
      int32_t i0 = 0;
      for (; i0 + 8 <= hd; i0 += 8) {
        npu_v8f y;
        LOAD8(y, u + i0);
        AT_PV_FOLD(y, o, f, 0);
      }
      for (int32_t i = i0; i < hd; i++)
        o[i] = at_fold1(o[i], u[i], f, first);
    }
    at_normalize(o, hd, sum);
  }
}
