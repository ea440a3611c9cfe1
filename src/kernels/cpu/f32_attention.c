/* npu_f32_attention__scalar and npu_f32_attention_tiles__scalar, the fused attention
 * (cpu_ukernels.h), npu_f32_attention_fold, which folds the tiles' results, and npu_f32_softmax,
 * attention's softmax when it runs as its own op (kernels.h): both with the helpers that define
 * attention's sums. */
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
      for (int32_t i = i0; i < hd; i++) o[i] = at_fold1(o[i], u[i], f, first);
    }
    at_normalize(o, hd, sum);
  }
}

void npu_f32_softmax(float *restrict p, const float *restrict s, int32_t heads, int32_t rows,
                     int32_t ctx, int32_t pos0, int32_t n_valid) {
  for (int32_t h = 0; h < heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      const size_t off = ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const float *x = s + off;
      float *o = p + off;
      const int32_t len = npu_attn_len(pos0, n_valid, t);
      const float max = max_of(x + 1, len - 1, x[0]);
      const float sum = exp_sum(o, x, len, max, 0.0f);
      int32_t j = 0;
      for (; j + 8 <= len; j += 8) {
        npu_v8f v;
        LOAD8(v, o + j);
        v /= sum;
        memcpy(o + j, &v, sizeof(v));
      }
      for (; j < len; j++) o[j] /= sum;
      for (j = len; j < ctx; j++) o[j] = 0.0f;
    }
  }
}
