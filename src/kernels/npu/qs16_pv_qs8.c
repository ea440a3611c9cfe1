/* npu_qs16_pv_qs8__scalar: attention output P·V of Q15 probabilities and an int8 V cache,
 * requantized to int8 (npu_ukernels.h). */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs16_pv_qs8__scalar(const struct npu_attn_shape *restrict shape, const int16_t *restrict p,
                             const int8_t *restrict v, int8_t *restrict out,
                             const struct npu_qs16_pv_params *restrict params) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  for (int32_t t = 0; t < rows; t++) {
    const int32_t len = npu_attn_len_of(shape, t);
    for (int32_t h = 0; h < heads; h++) {
      const int16_t *pr = p + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int8_t *vh = v + (size_t)(h / group) * (size_t)hd;
      int8_t *o = out + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      for (int32_t i = 0; i < hd; i++) {
        int32_t acc = 0;
        for (int32_t j = 0; j < len; j++)
          acc += pr[j] * (vh[(size_t)j * kv_cols + (size_t)i] - params->v_zero_point);
        o[i] = npu_requantize_s8(acc, params->mult, params->shift, params->y_zero_point);
      }
    }
  }
}
